import json, statistics, sys, time
import flashtree  # noqa
import torch
from flashtree.models import cpu_dense, quant
assert cpu_dense.available()
print("dot", torch.ops.flashtree.qdense_dot(), "threads", torch.get_num_threads())
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
eights = [[quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, "q4_1")) for (n, k) in shapes] for _ in range(30)]
for T in (1, 2, 4, 8, 16):
    x = {k: torch.randn(T, k).bfloat16() for k in (576, 1536)}
    def vec():
        for layer in eights:
            for w, (_n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense(x[k], w.qs, w.d, w.m, None)
    vec(); ts = []
    for _ in range(15):
        t = time.perf_counter(); vec(); ts.append(time.perf_counter() - t)
    print(T, round(statistics.median(ts) * 1e3, 3), "ms", flush=True)
