"""The summary of benchmarks/run8_2026-12-05/compare_drafters.sh's four interleaved bench passes (OUT/A_1, B_1, A_2,
B_2): each config's speedup over ar in each pass, the median tok/s ratio A / B over the two pairs,
and tau; printed and written to OUT/summary.txt.
Usage: python benchmarks/run8_2026-12-05/summarize_drafter_compare.py OUT NAME_A NAME_B"""
import json
import statistics
import sys
from pathlib import Path

out, a, b = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
cells = {f"{r}_{i}": {c["label"]: c for c in json.loads((out / f"{r}_{i}" / "bench.json").read_text())["cells"]}
         for r in (a, b) for i in (1, 2)}


def speedups(run: str, label: str) -> list[float]:
    return [cells[f"{run}_{i}"][label]["tok_s"] / cells[f"{run}_{i}"]["ar"]["tok_s"] for i in (1, 2)]


lines = [f"{'config':<12} {a + ' x ar (pass 1, 2)':<24} {b + ' x ar (pass 1, 2)':<24} {a + '/' + b + ' tok/s':<16} "
         f"tau {a} / {b}"]
for label in cells[f"{a}_1"]:
    ratio = statistics.median(cells[f"{a}_{i}"][label]["tok_s"] / cells[f"{b}_{i}"][label]["tok_s"] for i in (1, 2))
    tau = [statistics.mean(cells[f"{r}_{i}"][label]["mean_accept_length"] for i in (1, 2)) for r in (a, b)]
    lines.append(f"{label:<12} {', '.join(f'{v:.2f}' for v in speedups(a, label)):<24} "
                 f"{', '.join(f'{v:.2f}' for v in speedups(b, label)):<24} {ratio:<16.3f} {tau[0]:.2f} / {tau[1]:.2f}")
lines.append("ar tok/s " + " ".join(f"{r} procs: {[round(cells[f'{r}_{i}']['ar']['tok_s'], 1) for i in (1, 2)]}"
                                 for r in (a, b)))
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
