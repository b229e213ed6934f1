"""Qwen3-1.7B-shaped Q4_0 projections, 28 layers (793 MB, from memory): qdense at T rows, median of 7.

    [FLASHTREE_ISA=avx2] PYTHONPATH=<a tree's src> python qwen3_1p7b_from_memory.py 1,8
"""
import dataclasses
import statistics
import sys
import time

import flashtree  # noqa: F401, I001  (first: it settles the instruction path before torch loads)

# isort: split
import torch
from flashtree.models import cpu_dense, quant
assert cpu_dense.available()
torch.manual_seed(0)
shapes = [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)]
base = [quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, "q4_0")) for n, k in shapes]
# 28 layers: copies of the same blocks (separate memory, same values)
ws = [[dataclasses.replace(w, qs=w.qs.clone(), d=w.d.clone()) for w in base] for _ in range(28)]
nbytes = sum(t.numel() * t.element_size() for layer in ws for w in layer for t in (w.qs, w.d) )
out = []
for T in [int(t) for t in sys.argv[1].split(",")]:
    x = {k: torch.randn(T, k) for k in (2048, 6144)}
    def f():
        for layer in ws:
            for w, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)
    f()
    ts = []
    for _ in range(7):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    dt = statistics.median(ts)
    out.append(f"T={T} {dt*1e3:.1f}ms {nbytes/dt/1e9:.1f}GB/s")
print(f"{nbytes/1e6:.0f}MB", " ".join(out))
