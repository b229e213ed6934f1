"""Acceptance of the bundled pair on held-out prompts (issue 4): mean tau and its histogram at
T=0 and T=1 for dflash and ddtree budgets 8/16/32/64, plus greedy samples; writes JSON.

Usage: python scripts/measure_bundled.py [--prompts 32] [--max-tokens 128] [--drafter DIR]
                                         [--out benchmarks/bundled_pair.json]
Speed (tok/s ratios) comes from `flashtree bench`, which times the methods side by side.
"""
import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from flashtree import LLM, SamplingParams
from flashtree.llm import BUNDLED_DRAFTER, BUNDLED_TARGET
from flashtree.train.corpus import load_prompts

p = argparse.ArgumentParser()
p.add_argument("--prompts", type=int, default=32)
p.add_argument("--max-tokens", type=int, default=128)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--drafter", default=str(BUNDLED_DRAFTER), help="drafter to measure with the bundled target")
p.add_argument("--out", default="benchmarks/bundled_pair.json")
a = p.parse_args()
torch.set_num_threads(a.threads)

llm = LLM(BUNDLED_TARGET, a.drafter, max_batch_size=8)
prompts = load_prompts()[: a.prompts]
report = {"prompts": len(prompts), "max_tokens": a.max_tokens,
          "target": json.loads((BUNDLED_TARGET / "training_report.json").read_text()),
          "drafter": json.loads((Path(a.drafter) / "training_report.json").read_text()),
          "acceptance": []}
for T in (0.0, 1.0):
    for method, budget in (("dflash", None), ("ddtree", 8), ("ddtree", 16), ("ddtree", 32), ("ddtree", 64)):
        params = [SamplingParams(temperature=T, max_tokens=a.max_tokens, seed=i) for i in range(len(prompts))]
        outs = llm.generate(prompts, params, method=method, budget=budget)
        taus = [t for o in outs for t in o.metrics.accept_lengths]
        hist = Counter(taus)
        row = {"temperature": T, "method": method, "budget": budget, "rounds": len(taus),
               "mean_accept_length": sum(taus) / len(taus),
               "histogram": [hist.get(t, 0) for t in range(1, max(taus) + 1)]}
        report["acceptance"].append(row)
        print(f"T={T} {method}{'/' + str(budget) if budget else ''}: tau={row['mean_accept_length']:.2f} hist={row['histogram']}")
samples = llm.generate(prompts[:3], SamplingParams(temperature=0, max_tokens=80), method="ddtree")
report["greedy_samples"] = [{"prompt": s.prompt, "completion": s.text} for s in samples]
Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
print("wrote", a.out)
