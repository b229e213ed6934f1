"""budget="auto" against plain decoding and fixed budgets on the bundled pair (issue 10).

Interleaved repeats in one process (compiled runner as loaded by default), held-out prompts, 96
tokens: C=1 runs one prompt at a time, C=8 runs all prompts as one batch. Reports median tok/s,
the ratios to plain decoding, mean tau and, for auto, the mean chosen budget and mean predicted vs
realised tau. Run on a quiet machine (`../shared/tools/quiet`).

Usage: python benchmarks/auto_2026-11-30/measure_auto.py [--repeats 3] [--out benchmarks/auto_2026-11-30/auto.json]
"""
import argparse
import json
import statistics
import time
from pathlib import Path

from flashtree import LLM, SamplingParams

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--num-prompts", type=int, default=8)
p.add_argument("--max-tokens", type=int, default=96)
p.add_argument("--out", default=None)
p.add_argument("--model", default="tiny-code")
a = p.parse_args()
root = Path(__file__).resolve().parents[2]
prompts = [json.loads(line)["prompt"] for line in open(root / "src/flashtree/data/heldout_prompts.jsonl")][:a.num_prompts]
llm = LLM(a.model, method="ddtree")
configs = [("ar", None), ("ddtree", 8), ("ddtree", 16), ("ddtree", "auto"), ("hybrid", "auto")]
cells = [(0.0, 1), (1.0, 1), (0.0, 8), (1.0, 8)]
runs: dict = {}
for r in range(a.repeats + 1):  # repeat 0 warms up
    for temp, conc in cells:
        for method, budget in configs:
            params = [SamplingParams(max_tokens=a.max_tokens, temperature=temp, seed=i, ignore_eos=True)
                      for i in range(len(prompts))]
            t0, outs = time.perf_counter(), []
            batches = [[i] for i in range(len(prompts))] if conc == 1 else [list(range(len(prompts)))]
            for idx in batches:
                outs += llm.generate([prompts[i] for i in idx], [params[i] for i in idx], use_tqdm=False,
                                     method=method, budget=budget)
            dt = time.perf_counter() - t0
            if r:
                m = [o.metrics for o in outs]
                taus = [t for x in m for t in x.accept_lengths]
                budgets = [b for x in m for b in getattr(x, "budgets", [])]
                pred = [t for x in m for t in getattr(x, "predicted_taus", [])]
                runs.setdefault((temp, conc, method, budget), []).append({
                    "tok_s": sum(len(o.token_ids) for o in outs) / dt, "tau": sum(taus) / len(taus),
                    "budget": sum(budgets) / len(budgets) if budgets else None,
                    "predicted_tau": sum(pred) / len(pred) if pred else None})
rows = []
for (temp, conc, method, budget), rs in runs.items():
    tok_s = statistics.median(x["tok_s"] for x in rs)
    ar = statistics.median(x["tok_s"] for x in runs[(temp, conc, "ar", None)])
    row = {"temperature": temp, "concurrency": conc, "method": method, "budget": budget, "tok_s": tok_s,
           "x_ar": tok_s / ar, "tau": statistics.mean(x["tau"] for x in rs),
           "mean_budget": rs[0]["budget"] and statistics.mean(x["budget"] for x in rs),
           "predicted_tau": rs[0]["predicted_tau"] and statistics.mean(x["predicted_tau"] for x in rs)}
    rows.append(row)
    extra = f"  budget {row['mean_budget']:.1f}  predicted tau {row['predicted_tau']:.2f}" if row["mean_budget"] else ""
    print(f"T={temp:g} C={conc}  {method}@{budget}  {tok_s:7.0f} tok/s  x{row['x_ar']:.2f}  tau {row['tau']:.2f}{extra}")
if a.out:
    Path(a.out).write_text(json.dumps({"settings": vars(a), "compiled": llm.engine.runner.compiled, "rows": rows},
                                      indent=2) + "\n")
