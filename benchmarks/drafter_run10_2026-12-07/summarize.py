"""Per path and arm: ar and default tok/s, default x ar (pooled), τ, nodes, the drafter's and the
verify's ms a step, from ab/*/bench.json (one line per process, then medians per arm)."""
import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/drafter_run10_2026-12-07/ab")
rows: dict[tuple[str, str], list[dict]] = {}
for f in sorted(root.glob("*/bench.json")):
    isa, arm, rep = f.parent.name.split("_")
    d = json.load(open(f))
    cell = {c["label"]: c for c in d["cells"] if c["concurrency"] == 1 and c["temperature"] == 0}
    ar, hy = cell["ar"], next(c for k, c in cell.items() if k != "ar")
    r = {"ar": ar["tok_s"], "default": hy["tok_s"], "x": hy["tok_s"] / ar["tok_s"], "tau": hy["mean_accept_length"],
         "draft_ms": hy["phase_ms_per_step"]["draft"], "verify_ms": hy["phase_ms_per_step"]["verify_forward"],
         "nodes": hy["costs_ms"].get("tree_size"), "dq": d["meta"].get("drafter_quant")}
    rows.setdefault((isa, arm), []).append(r)
    print(f"{isa:5s} {arm:8s} {rep}  ar {r['ar']:6.1f}  default {r['default']:6.1f}  x{r['x']:.3f}  tau {r['tau']:.2f}  "
          f"draft {r['draft_ms']:.2f} ms  verify {r['verify_ms']:.2f} ms  drafter {r['dq']}")
print()
for (isa, arm), rs in rows.items():
    med = {k: statistics.median(r[k] for r in rs) for k in ("ar", "default", "x", "tau", "draft_ms", "verify_ms")}
    print(f"{isa:5s} {arm:8s} n={len(rs)}  ar {med['ar']:6.1f}  default {med['default']:6.1f}  x{med['x']:.3f}  "
          f"tau {med['tau']:.2f}  draft {med['draft_ms']:.2f} ms  verify {med['verify_ms']:.2f} ms")
