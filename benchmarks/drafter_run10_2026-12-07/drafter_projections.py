"""Drafter projections at M rows: bf16 (packed, the engine's) against q8_0 blocks, this process's path."""
import time, torch, sys
from flashtree import cpu
from flashtree.models import cpu_dense, quant
from flashtree.models.layers import Linear
from flashtree.models.quant import QuantLinear
torch.manual_seed(0)
shapes = [(2880, 576)] + [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 2
def mk(dt):
    mods = []
    for k, n in shapes:
        l = Linear(k, n, bias=False).to(dt).requires_grad_(False); l.pack(); mods.append(l)
    return mods
bf = mk(torch.bfloat16)
q8 = [QuantLinear(quant.quantize(l.weight.float(), "q8_0")) for l in bf]
f32 = mk(torch.float32)
print(cpu.isa(), torch.get_num_threads())
for M in (1, 8, 16):
    xs = {k: torch.randn(M, k) for k, _ in shapes}
    def run(mods, dt):
        for (k, _), m in zip(shapes, mods): m(xs[k].to(dt))
    arms = {"bf16": lambda: run(bf, torch.bfloat16), "q8_0 (f32 x)": lambda: run(q8, torch.float32), "f32": lambda: run(f32, torch.float32)}
    res = {a: [] for a in arms}
    with torch.inference_mode():
        for f in arms.values():
            for _ in range(20): f()
        for _ in range(9):
            for a, f in arms.items():
                t0 = time.perf_counter()
                for _ in range(20): f()
                res[a].append((time.perf_counter() - t0) / 20 * 1e3)
    print(M, {a: round(sorted(v)[4], 3) for a, v in res.items()})
