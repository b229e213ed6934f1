"""Cost of the sampling pipeline and the sampler per call, for R rows of a V-token vocabulary.

    .venv/bin/python scripts/measure_sampling.py [--vocab 4096] [--threads 1]

Prints milliseconds (median of 5 × 20 calls) for `logits_to_probs` with filters off, top-k only
and top-p (which sorts the vocabulary), and for `sample`, at R = 1, 8, 72 (72 = eight ddtree@8 verifies).
"""
import argparse
import statistics
import time

import torch

from flashtree.sampling import FilterPlan, Uniforms, logits_to_probs, sample

p = argparse.ArgumentParser()
p.add_argument("--vocab", type=int, default=4096)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()
torch.set_num_threads(a.threads)


def ms(fn, calls: int = 20, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1000)
    return statistics.median(times)


V = a.vocab
print(f"{'rows':>4}  {'off':>7}  {'top-k 50':>8}  {'top-p 0.9':>9}  {'sample':>7}   (ms per call, V={V})")
for R in (1, 8, 72):
    logits = torch.randn(R, V) * 3
    T, zeros_k, ones_p, zeros_m = torch.ones(R), torch.zeros(R, dtype=torch.long), torch.ones(R), torch.zeros(R)
    k50, p09 = torch.full((R,), 50), torch.full((R,), 0.9)
    plan = lambda k, p: FilterPlan.of(T.tolist(), k.tolist(), p.tolist(), zeros_m.tolist(), V)  # noqa: E731
    off = ms(lambda: logits_to_probs(logits, T, zeros_k, ones_p, zeros_m, plan(zeros_k, ones_p)))
    topk = ms(lambda: logits_to_probs(logits, T, k50, ones_p, zeros_m, plan(k50, ones_p)))
    topp = ms(lambda: logits_to_probs(logits, T, zeros_k, p09, zeros_m, plan(zeros_k, p09)))
    probs = logits_to_probs(logits, T, zeros_k, ones_p, zeros_m)
    us = Uniforms(0).at(torch.arange(R), R)
    draw = ms(lambda: sample(probs, [(0, R)], [us]))
    print(f"{R:>4}  {off:7.2f}  {topk:8.2f}  {topp:9.2f}  {draw:7.2f}")
