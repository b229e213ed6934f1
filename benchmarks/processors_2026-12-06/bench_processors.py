"""What the logit processors (penalties, logit_bias) cost a tree node: the bundled pair, ddtree at a
fixed budget, greedy, the same chats with and without processors, interleaved; the verify walk's
time (where the sampler processes each node's row along its path) per verified node.

    python benchmarks/processors_2026-12-06/bench_processors.py
"""
from __future__ import annotations

import argparse
import statistics

from flashtree import LLM, SamplingParams

CHATS = ["Write a Python function that merges two sorted lists.", "Explain how a hash map works.",
         "Give three tips for writing clear emails.", "What is the capital of Australia and why?"]
PROCESSED = dict(repetition_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.2, logit_bias={29: -1.0})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    llm = LLM("smollm2-135m-instruct", compile=False, max_batch_size=1)
    eng, res = llm.engine, {"plain": [], "processed": []}
    for chat in CHATS:
        for arm, extra in (("plain", {}), ("processed", PROCESSED)):
            eng.timings.clear()
            o = llm.chat([{"role": "user", "content": chat}], SamplingParams(temperature=0, max_tokens=a.max_tokens,
                                                                              **extra), method="ddtree", budget=a.budget)[0]
            nodes = o.metrics.rounds * (a.budget + 1)  # (a fixed budget verifies its full tree each round)
            res[arm].append(eng.timings.verify_walk / nodes * 1e6)
    for arm, v in res.items():
        print(f"{arm:10s} verify walk µs a node: median {statistics.median(v):.1f} ({', '.join(f'{x:.1f}' for x in v)})")
    print(f"processors: {statistics.median(res['processed']) - statistics.median(res['plain']):.1f} µs a node")


if __name__ == "__main__":
    main()
