"""Prefix-cache hits for every method, whatever the earlier request decoded (issue 41.2).

For each (earlier, later) method pair: a later-method request on a fresh 1,500-token prefix
(cold), an earlier-method request on another fresh prefix (it fills the pages, max_tokens=1:
it never drafts), then a later-method request sharing that prefix with a different suffix
(warm). Each request generates `--max-tokens` tokens; times are whole requests, medians over
`--pairs` interleaved repeats, one process (compiled runner as loaded by default). Run on a
quiet machine (`../shared/tools/quiet`).

Usage: python benchmarks/real_pair_2026-12-04/measure_prefix_methods.py [--model tiny-code] [--out benchmarks/prefix_methods.json]
"""
import argparse
import json
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path

from flashtree import LLM, SamplingParams

p = argparse.ArgumentParser()
p.add_argument("--model", default="tiny-code")
p.add_argument("--pairs", type=int, default=5)
p.add_argument("--max-tokens", type=int, default=1)
p.add_argument("--out", default=None)
a = p.parse_args()
root = Path(__file__).resolve().parents[2]
texts = [json.loads(line)["prompt"] for line in open(root / "src/flashtree/data/heldout_prompts.jsonl")]
llm = LLM(a.model, max_batch_size=4)
tok = llm.tokenizer
corpus = tok.encode("\n".join(texts * 20))
LATER = [("ar", None), ("ngram", None), ("dflash", None), ("ddtree", 16), ("hybrid", 16), ("ddtree", "auto")]
EARLIER = [("ar", None), ("ddtree", "auto")]
rng = random.Random(0)


def timed(ids, method, budget, max_tokens):
    t0 = time.perf_counter()
    llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False,
                 method=method, budget=budget)
    return time.perf_counter() - t0


def fresh_prefix():
    start = rng.randrange(len(corpus) - 1600)
    return corpus[start:start + 1500]


cells = {(e, later): ([], []) for e in EARLIER for later in LATER}
for i in range(a.pairs + 1):  # pass 0 warms up
    for (earlier, later), (cold, warm) in cells.items():
        tc = timed(fresh_prefix() + tok.encode(f" q{i}a"), *later, a.max_tokens)
        shared = fresh_prefix()
        timed(shared + tok.encode(f" q{i}b"), *earlier, 1)
        tw = timed(shared + tok.encode(f" q{i}c?"), *later, a.max_tokens)
        if i:
            cold.append(tc), warm.append(tw)
rows = []
for (earlier, later), (cold, warm) in cells.items():
    row = {"earlier": f"{earlier[0]}/{earlier[1]}" if earlier[1] else earlier[0],
           "later": f"{later[0]}/{later[1]}" if later[1] else later[0],
           "median_cold_ms": 1e3 * statistics.median(cold), "median_warm_ms": 1e3 * statistics.median(warm),
           "warm_over_cold": statistics.median(warm) / statistics.median(cold)}
    rows.append(row)
    print(f"{row['earlier']:>12} -> {row['later']:12} cold {row['median_cold_ms']:7.1f} ms  warm "
          f"{row['median_warm_ms']:7.1f} ms  warm/cold {row['warm_over_cold']:.2f}", flush=True)
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
report = {"model": a.model, "prefix_tokens": 1500, "pairs": a.pairs, "max_tokens": a.max_tokens,
          "machine": platform.machine(), "cpu": next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines()
                                                      if ln.startswith("Model name")), "?"), "rows": rows}
if a.out:
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
