"""summary.txt: per config the four processes' tok/s (old 1, new 1, old 2, new 2), the medians'
ratio new / old, and the forward costs."""
import json, statistics
from pathlib import Path
here = Path(__file__).parent
runs = ["old_1", "new_1", "old_2", "new_2"]
tok = {}
for r in runs:
    for row in json.loads((here / f"bench_{r}" / "bench.json").read_text())["cells"]:
        tok.setdefault(row["label"], {})[r] = row["tok_s"]
lines = ["config        old_1  new_1  old_2  new_2   new/old (medians)"]
for cfg, v in tok.items():
    old, new = statistics.median([v["old_1"], v["old_2"]]), statistics.median([v["new_1"], v["new_2"]])
    lines.append(f"{cfg:12s} " + " ".join(f"{v[r]:6.1f}" for r in runs) + f"   {new / old:.3f}")
lines.append("")
lines.append("forward ms     " + "  ".join(f"{r:>6s}" for r in runs))
fw = {r: {row["forward"]: row["ms"] for row in json.loads((here / f"forwards_{r}.json").read_text())["rows"]} for r in runs}
for f in fw["old_1"]:
    lines.append(f"{f:22s} " + "  ".join(f"{fw[r][f]:6.2f}" for r in runs))
(here / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
