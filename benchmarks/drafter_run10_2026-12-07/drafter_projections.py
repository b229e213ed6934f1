"""The drafter's projections at M rows: bf16 (packed, as the engine runs them), q8_0 blocks
(float32 rows, as `loader.drafter_quant` runs them) and float32, interleaved, median ms of the
set. Run from the repository root, with FLASHTREE_ISA set for a lower path:
    python benchmarks/drafter_run10_2026-12-07/drafter_projections.py"""
import statistics
import time

import torch

from flashtree import cpu
from flashtree.models import quant
from flashtree.models.layers import Linear
from flashtree.models.quant import QuantLinear

torch.manual_seed(0)
# SmolLM2's drafter: fc (5 x 576 -> 576), then per layer fused qkv, o, fused gate_up, down
SHAPES = [(2880, 576)] + [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 2


def linears(dtype: torch.dtype) -> list[Linear]:
    out = []
    for k, n in SHAPES:
        lin = Linear(k, n, bias=False).to(dtype).requires_grad_(False)
        lin.pack()
        out.append(lin)
    return out


def run(mods, xs, dtype) -> None:
    for (k, _), m in zip(SHAPES, mods):
        m(xs[k].to(dtype))


bf16 = linears(torch.bfloat16)
q8 = [QuantLinear(quant.quantize(lin.weight.float(), "q8_0")) for lin in bf16]
f32 = linears(torch.float32)
print(cpu.isa(), torch.get_num_threads())
for M in (1, 8, 16):
    xs = {k: torch.randn(M, k) for k, _ in SHAPES}
    arms = {"bf16": (bf16, torch.bfloat16), "q8_0 (f32 x)": (q8, torch.float32), "f32": (f32, torch.float32)}
    res = {a: [] for a in arms}
    with torch.inference_mode():
        for mods, dt in arms.values():
            for _ in range(20):
                run(mods, xs, dt)
        for _ in range(9):
            for a, (mods, dt) in arms.items():
                t0 = time.perf_counter()
                for _ in range(20):
                    run(mods, xs, dt)
                res[a].append((time.perf_counter() - t0) / 20 * 1e3)
    print(M, {a: round(statistics.median(v), 3) for a, v in res.items()})
