"""SmolLM2's projection set (30 layers of Q4_1: fused qkv, o, fused gate/up, down; the Q8_0 head),
from memory: the vector kernel (qdense) against AMX-INT8 tiles (qdense_panels) at T rows,
interleaved arm by arm, median of 15 each; the head alone beside.

    PYTHONPATH=src python benchmarks/amx_int8_2026-12-07/projections_smollm2.py 1,2,4,8,16
"""
import json
import statistics
import sys
import time

import flashtree  # noqa: F401  (first: it settles the instruction path before torch loads)

# isort: split
import torch

from flashtree.models import cpu_dense, quant

assert cpu_dense.available()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
blocks = [[quant.quantize(torch.randn(n, k) * 0.05, "q4_1") for (n, k) in shapes] for _ in range(30)]
eights = [[quant.interleave(w) for w in layer] for layer in blocks]
panels = [[quant.to_panels(w) for w in layer] for layer in blocks]
head_b = quant.quantize(torch.randn(49152, 576) * 0.05, "q8_0")
head_e, head_p = quant.interleave(head_b), quant.to_panels(head_b)
res = {}
for T in [int(t) for t in sys.argv[1].split(",")]:
    x = {k: torch.randn(T, k).bfloat16() for k in (576, 1536)}

    def vec(x=x):
        for layer in eights:
            for w, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)

    def tiles(x=x):
        for layer in panels:
            for p, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense_panels(x[k], p.qs, p.d, p.m, None, p.n)

    def vec_head(x=x):
        torch.ops.flashtree.qdense(x[576], head_e.qs, head_e.d, None, None)

    def tiles_head(x=x):
        torch.ops.flashtree.qdense_panels(x[576], head_p.qs, head_p.d, None, None, head_p.n)
    arms = {"vector": vec, "tiles": tiles, "vector head": vec_head, "tiles head": tiles_head}
    ts = {a: [] for a in arms}
    for f in arms.values():
        f()
    for _ in range(15):
        for a, f in arms.items():
            t = time.perf_counter()
            f()
            ts[a].append(time.perf_counter() - t)
    res[T] = {a: round(statistics.median(v) * 1e3, 3) for a, v in ts.items()}
    print(T, res[T], flush=True)
print(json.dumps({"vector": torch.ops.flashtree.qdense_dot(), "ms": res}))
