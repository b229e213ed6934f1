"""Per-slice ar / default time ratios of ab.sh's runs (> 1: the default faster), per arm, with
each slice's drafted sequence-rounds. Usage: python summarize.py DIR"""
import glob
import json
import statistics as st
import sys

for arm in ("new", "base"):
    ratios, drafted = [], []
    for f in sorted(glob.glob(sys.argv[1] + f"/ab_{arm}_*.jsonl")):
        by = {}
        for line in open(f):
            if line.startswith('{"'):
                d = json.loads(line)
                if d["r"] > 0:  # repeat 0 is the warm-up
                    by.setdefault((d["r"], d["s"]), {})[d["cfg"]] = d
        for pair in by.values():
            if len(pair) == 2:
                ratios.append(pair["ar"]["sec"] / pair["hybrid"]["sec"])
                drafted.append(sum(len(w) for w in pair["hybrid"]["drafted_at"]))
    if ratios:
        print(arm, len(ratios), "median", round(st.median(ratios), 3), "mean", round(st.mean(ratios), 3))
        print("   ", sorted(zip(drafted, [round(r, 2) for r in ratios])))
