"""Kernel-only chain of the target's 121 bf16 projections at a few row counts (median ms), and the read bound."""
import statistics, sys, time, torch
from flashtree import LLM
from flashtree.models import cpu_dense
from flashtree.models.layers import Linear
torch.set_num_threads(2)
target = LLM(model="smollm2-135m-instruct", method="ar", dtype="bfloat16", compile=False).target
lins = [m for m in target.modules() if isinstance(m, Linear)]
lins.sort(key=lambda m: m is target.lm_head)
nbytes = sum(m.packed.numel() * 2 for m in lins)
big = torch.ones(128 * 2**20)  # 512 MB
bw = []
for _ in range(5):
    t = time.perf_counter(); big.sum(); bw.append(512 * 2**20 / (time.perf_counter() - t) / 1e9)
bwm = statistics.median(bw)
out = []
with torch.inference_mode():
    for rows in [int(r) for r in sys.argv[1].split(",")]:
        xs = [torch.randn(rows, m.in_features).bfloat16() for m in lins]
        ts = []
        for _ in range(8):
            t0 = time.perf_counter()
            for _ in range(10):
                for m, x in zip(lins, xs):
                    cpu_dense.dense(x, m.weight, m.packed, None)
            ts.append((time.perf_counter() - t0) / 10 * 1e3)
        out.append(f"{rows}:{statistics.median(ts[1:]):.2f}ms")
print(f"{sys.argv[2:]} bytes {nbytes/1e6:.0f}MB bw {bwm:.1f}GB/s bound {nbytes/bwm/1e6:.2f}ms | " + " ".join(out), flush=True)
