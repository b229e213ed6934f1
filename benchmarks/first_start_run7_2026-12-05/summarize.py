"""summary.txt from the four interleaved bench passes: each config's speedup over ar in each pass,
the median tok/s ratio run 7 / run 5 over the two pairs, and tau."""
import json
import statistics
from pathlib import Path

here = Path(__file__).parent
cells = {name: {c["label"]: c for c in json.loads((here / name / "bench.json").read_text())["cells"]}
         for name in ("run7_1", "run7_2", "run5_1", "run5_2")}
lines = [f"{'config':<12} {'run7 x ar (pass 1, 2)':<24} {'run5 x ar (pass 1, 2)':<24} {'run7/run5 tok/s':<16} tau run7 / run5"]
for label in cells["run7_1"]:
    x = {r: [cells[f"{r}_{i}"][label]["tok_s"] / cells[f"{r}_{i}"]["ar"]["tok_s"] for i in (1, 2)] for r in ("run7", "run5")}
    ratio = statistics.median(cells[f"run7_{i}"][label]["tok_s"] / cells[f"run5_{i}"][label]["tok_s"] for i in (1, 2))
    tau = {r: statistics.mean(cells[f"{r}_{i}"][label]["mean_accept_length"] for i in (1, 2)) for r in ("run7", "run5")}
    lines.append(f"{label:<12} {', '.join(f'{v:.2f}' for v in x['run7']):<24} {', '.join(f'{v:.2f}' for v in x['run5']):<24} "
                 f"{ratio:<16.3f} {tau['run7']:.2f} / {tau['run5']:.2f}")
lines.append("ar tok/s run7 procs: " + str([round(cells[f"run7_{i}"]["ar"]["tok_s"], 1) for i in (1, 2)])
             + " run5 procs: " + str([round(cells[f"run5_{i}"]["ar"]["tok_s"], 1) for i in (1, 2)]))
(here / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
