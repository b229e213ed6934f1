"""qdense on SmolLM2's projection set (30 layers of Q4_1 + the Q8_0 head), median of 15 per T.

    [FLASHTREE_ISA=avx2] PYTHONPATH=<a tree's src> python smollm2_projections.py 1,8 [nohead] [t1]
"""
import statistics
import sys
import time

import flashtree  # noqa: F401, I001  (first: it settles the instruction path before torch loads)

# isort: split
import torch
from flashtree.models import cpu_dense, quant
assert cpu_dense.available()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
qw = [[quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, "q4_1")) for (n, k) in shapes] for _ in range(30)]
head = quant.interleave(quant.quantize(torch.randn(49152, 576) * 0.05, "q8_0"))
nohead = "nohead" in sys.argv
if "t1" in sys.argv: torch.set_num_threads(1)
out = []
for T in [int(t) for t in sys.argv[1].split(",")]:
    x = {k: torch.randn(T, k).bfloat16() for k in (576, 1536)}
    def f():
        for ws in qw:
            for w, (_n, k) in zip(ws, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)
        if not nohead:
            torch.ops.flashtree.qdense(x[576], head.qs, head.d, None, None)
    f(); f()
    ts = []
    for _ in range(15):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    out.append(f"T={T} {statistics.median(ts)*1e3:.2f}")
print(torch.ops.flashtree.qdense_dot(), " ".join(out))
