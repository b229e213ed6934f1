"""SmolLM2-shaped Q4_1 projections (30 layers: qkv 960x576, o 576x576, gate_up 3072x576, down
576x1536) on AMX-INT8 panels from memory, M rows of float32 x, 2 threads: the cost by rows.
Usage: python projections_amx.py [rows ...]"""
import statistics
import sys
import time

import flashtree  # noqa: F401  (settles the instruction path)
import torch

from flashtree.models import cpu_dense, quant

assert cpu_dense.available() and quant.panels_ready()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = [[quant.to_panels(quant.quantize(torch.randn(n, k) * 0.05, "q4_1")) for (n, k) in shapes] for _ in range(30)]
for T in [int(a) for a in sys.argv[1:]] or [1, 2, 3, 4, 8]:
    x = {k: torch.randn(T, k) for k in (576, 1536)}

    def run():
        for layer in layers:
            for w, (n, k) in zip(layer, shapes):
                torch.ops.flashtree.qdense_panels(x[k], w.qs, w.d, w.m, None, n)
    run()
    ts = []
    for _ in range(30):
        t = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t)
    print(T, round(statistics.median(ts) * 1e3, 3), "ms", flush=True)
