"""Interleaved in one process: the 121-projection chain at given rows for prefetch settings FTA in argv[2]."""
import os, statistics, sys, time, torch
from flashtree import LLM
from flashtree.models import cpu_dense
from flashtree.models.layers import Linear
torch.set_num_threads(2)
target = LLM(model="smollm2-135m-instruct", method="ar", dtype="bfloat16", compile=False).target
lins = [m for m in target.modules() if isinstance(m, Linear)]
nbytes = sum(m.packed.numel() * 2 for m in lins)
big = torch.ones(128 * 2**20)
settings = sys.argv[2].split(",")
with torch.inference_mode():
    for rows in [int(r) for r in sys.argv[1].split(",")]:
        xs = [torch.randn(rows, m.in_features).bfloat16() for m in lins]
        ts = {s: [] for s in settings}; bw = []
        for rep in range(9):
            t = time.perf_counter(); big.sum(); bw.append(512 * 2**20 / (time.perf_counter() - t) / 1e9)
            for s in settings:
                if s == "dot": os.environ["FTX"] = "0"
                else: os.environ["FTX"] = "1"; os.environ["FTA"], os.environ["FTI"] = s.split(":")
                t0 = time.perf_counter()
                for _ in range(5):
                    for m, x in zip(lins, xs):
                        cpu_dense.dense(x, m.weight, m.packed, None)
                if rep: ts[s].append((time.perf_counter() - t0) / 5 * 1e3)
        b = statistics.median(bw)
        print(f"rows {rows} bw {b:.1f} bound {nbytes/b/1e6:.2f}ms | " + " ".join(f"FTA={s}:{statistics.median(v):.2f}" for s, v in ts.items()), flush=True)
