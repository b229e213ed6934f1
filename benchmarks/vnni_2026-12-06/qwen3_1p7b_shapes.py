"""Qwen3-1.7B-shaped Q4_0 projections (3 layers: qkv 4096x2048, o 2048x2048, gate/up 12288x2048,
down 2048x6144), flashtree::qdense at T = 1, 8, 16 rows: median of 9 calls of the set.

    FLASHTREE_ISA=avx2 python benchmarks/vnni_2026-12-06/qwen3_1p7b_shapes.py   # maddubs
    python benchmarks/vnni_2026-12-06/qwen3_1p7b_shapes.py                      # vpdpbusd (avx512 and up)
"""
import statistics
import time

import torch

import flashtree  # noqa: F401  (first: it settles the instruction path before torch loads)
from flashtree.models import cpu_dense, quant

assert cpu_dense.available()
torch.manual_seed(0)
shapes = [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)]
L = 3
ws = [[quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, "q4_0")) for n, k in shapes] for _ in range(L)]
def tm(T, n=9):
    x = {k: torch.randn(T, k) for k in (2048, 6144)}
    def f():
        for layer in ws:
            for w, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)
    for _ in range(2):
        f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
print(torch.ops.flashtree.qdense_dot(), "  ".join(f"T={T} {tm(T):7.2f} ms" for T in (1, 8, 16)), flush=True)
