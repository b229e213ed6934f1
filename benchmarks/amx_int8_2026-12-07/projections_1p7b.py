"""Qwen3-1.7B-shaped projections, 28 layers from memory (fused qkv, o, fused gate/up, down):
the vector kernel (qdense: vpdpbusd, or maddubs under FLASHTREE_ISA=avx2) against AMX-INT8
tiles (qdense_panels) at T rows, interleaved arm by arm, median of 7 each.

    PYTHONPATH=src python benchmarks/amx_int8_2026-12-07/projections_1p7b.py q4_0 1,2,4,8,16
"""
import dataclasses
import json
import statistics
import sys
import time

import flashtree  # noqa: F401, I001  (first: it settles the instruction path before torch loads)

# isort: split
import torch
from flashtree.models import cpu_dense, quant
assert cpu_dense.available()
kind = sys.argv[1]
torch.manual_seed(0)
shapes = [(4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144)]
base = [quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, kind)) for n, k in shapes]
layers = 28
eights = [[dataclasses.replace(w, qs=w.qs.clone(), d=w.d.clone()) for w in base] for _ in range(layers)]
panels = [[quant.to_panels(w) for w in base] for _ in range(layers)]
nbytes = sum(t.numel() * t.element_size() for layer in eights for w in layer for t in (w.qs, w.d) if t is not None)
amx = torch.ops.flashtree.qdense_panels_ready()
res = {"kind": kind, "bytes": nbytes, "vector": torch.ops.flashtree.qdense_dot(), "amx_int8": amx, "ms": {}}
for T in [int(t) for t in sys.argv[2].split(",")]:
    x = {k: torch.randn(T, k) for k in (2048, 6144)}

    def vec():
        for layer in eights:
            for w, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)

    def tiles():
        for layer in panels:
            for p, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense_panels(x[k], p.qs, p.d, p.m, None, p.n)
    arms = {"vector": vec, **({"amx": tiles} if amx else {})}
    ts = {a: [] for a in arms}
    for f in arms.values():
        f()
    for _ in range(7):
        for a, f in arms.items():
            t = time.perf_counter(); f(); ts[a].append(time.perf_counter() - t)
    res["ms"][T] = {a: round(statistics.median(v) * 1e3, 2) for a, v in ts.items()}
    print(T, res["ms"][T], flush=True)
print(json.dumps(res))
