"""Cost of one sampled draw per call, for R rows of a V-token vocabulary: the tensor pipeline
(`logits_to_probs` + `sample`, what CUDA and a CPU without the kernels run) and the CPU kernel
(`sample_host`, what the CPU engine runs).

    .venv/bin/python benchmarks/sampling_2026-11-30/measure_sampling.py [--vocab 4096] [--threads 1]
    .venv/bin/python benchmarks/sampling_2026-11-30/measure_sampling.py --argmax --vocab 49152   # greedy draws of bf16 logits

Prints microseconds (median of 5 × 20 calls, the forms alternating) with the filters off,
top-k 50, and top-p 0.95 at T=0.7, at R = 1, 9, 72 (9: a ddtree@8 verify; 72: eight of them).
Random logits (randn × 3) have far flatter nuclei than a trained model's, so top-p costs more here
than on the bundled target's own logits.
"""
import argparse
import statistics
import time

import torch

from flashtree.models import cpu_dense
from flashtree.sampling import (
    FilterPlan,
    argmax_rows,
    logits_to_probs,
    sample,
    sample_host,
)

p = argparse.ArgumentParser()
p.add_argument("--vocab", type=int, default=4096)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--argmax", action="store_true", help="greedy draws instead: torch's argmax of bf16 logits "
               "against argmax_rows (widened to float32, numpy)")
a = p.parse_args()
torch.set_num_threads(a.threads)
kernel = cpu_dense.available()


def us(fns, calls: int = 20, repeats: int = 5) -> list[float]:
    """Median µs per call of each of fns, alternating them."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[i].append((time.perf_counter() - t0) / calls * 1e6)
    return [statistics.median(t) for t in times]


V = a.vocab
if a.argmax:
    print(f"V={V}, {torch.get_num_threads()} thread(s); µs per greedy draw of bf16 logits")
    print(f"{'rows':>4}  {'torch':>8}  {'argmax_rows':>11}")
    for R in (1, 9, 17, 33, 72):
        x = (torch.randn(R, V) * 3).to(torch.bfloat16)
        assert torch.equal(x.argmax(-1), argmax_rows(x))
        got = us([lambda x=x: x.argmax(-1), lambda x=x: argmax_rows(x)])
        print(f"{R:>4}  {got[0]:8.0f}  {got[1]:11.0f}")
    raise SystemExit
print(f"V={V}, {torch.get_num_threads()} thread(s); µs per call; kernel {'built' if kernel else 'not built'}")
print(f"{'rows':>4}  {'filters':>10}  {'torch':>8}  {'kernel':>8}")
torch.manual_seed(0)
for R in (1, 9, 72):
    logits = torch.randn(R, V) * 3
    u = torch.rand(R, dtype=torch.float64)
    for name, (t, k, pp) in {"off": (1.0, 0, 1.0), "top-k 50": (1.0, 50, 1.0), "top-p 0.95": (0.7, 0, 0.95)}.items():
        T, K, P, M = torch.full((R,), t), torch.full((R,), k), torch.full((R,), pp), torch.zeros(R)
        plan = FilterPlan.of(T.tolist(), K.tolist(), P.tolist(), M.tolist(), V)
        host = (logits.numpy(), T.numpy(), K.numpy(), P.numpy(), M.numpy(), u.numpy())
        fns = [lambda a=(logits, T, K, P, M, plan), R=R, u=u: sample(logits_to_probs(*a), [(0, R)], [u])] + \
              ([lambda host=host: sample_host(*host)] if kernel else [])
        got = us(fns)
        print(f"{R:>4}  {name:>10}  " + "  ".join(f"{x:8.0f}" for x in got))
