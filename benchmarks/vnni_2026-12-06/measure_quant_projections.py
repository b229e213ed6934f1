"""SmolLM2-135M's projections at T rows, op by op: the Q4_1 blocks' kernel, the bf16 kernel, torch's int4 packs.

    python benchmarks/vnni_2026-12-06/measure_quant_projections.py 1,8,16      # FLASHTREE_ISA=avx2 for the AVX2 path

Random weights of SmolLM2's shapes (30 layers of qkv 960x576, o 576x576, gate/up 3072x576, down
576x1536, and the 49152x576 head): `flashtree::qdense` on Q4_1 blocks by eights with a Q8_0 head;
the bf16 projection kernel (`cpu_dense`); torch's `_weight_int4pack_mm_for_cpu` (group 32, its
own packing; no Q8_0 form, so its head is the bf16 kernel's). Together they exceed the L3 of the
reference VM, so each set streams from memory. Median of 15 calls of the whole set, per T.
Quiet machine first (`../shared/tools/quiet`).
"""
import statistics
import sys
import time

import torch

import flashtree  # noqa: F401  (first: it settles the instruction path before torch loads)
from flashtree.models import cpu_dense, quant

assert cpu_dense.available()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
L = 30
def mk(kind):
    return [[quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, kind)) for (n, k) in shapes] for _ in range(L)]
qw = mk("q4_1")
head = quant.interleave(quant.quantize(torch.randn(49152, 576) * 0.05, "q8_0"))
bw = [[torch.randn(n, k).bfloat16() for (n, k) in shapes] for _ in range(L)]
bp = [[cpu_dense.pack(w) for w in ws] for ws in bw]
hb = torch.randn(49152, 576).bfloat16()
hbp = cpu_dense.pack(hb)
# torch int4 packed (group 32)
def t4(w):
    n, k = w.shape
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.randn(k // 32, n, 2).bfloat16()
    return packed, sz
tw = [[t4(w) for w in ws] for ws in bw]
def run_q(T):
    x = {k: torch.randn(T, k).bfloat16() for k in (576, 1536)}
    def f():
        for ws in qw:
            for w, (_n, k) in zip(ws, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)
        torch.ops.flashtree.qdense(x[576], head.qs, head.d, None, None)
    return f
def run_b(T):
    x = {k: torch.randn(T, k).bfloat16() for k in (576, 1536)}
    def f():
        for ws, ps in zip(bw, bp):
            for w, p, (_n, k) in zip(ws, ps, shapes):
                cpu_dense.dense(x[k], w, p, None)
        cpu_dense.dense(x[576], hb, hbp, None)
    return f
def run_t(T):
    x = {k: torch.randn(T, k).bfloat16() for k in (576, 1536)}
    def f():
        for ws in tw:
            for (p, sz), (_n, k) in zip(ws, shapes):
                torch.ops.aten._weight_int4pack_mm_for_cpu(x[k], p, 32, sz)
        cpu_dense.dense(x[576], hb, hbp, None)
    return f
def tm(f, n=15):
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
for T in [int(t) for t in sys.argv[1].split(",")]:
    r = {name: tm(fn(T)) for name, fn in (("qdense q4_1", run_q), ("bf16 dense", run_b), ("torch int4pack", run_t))}
    print(T, "  ".join(f"{k} {v:6.2f} ms" for k, v in r.items()), flush=True)
