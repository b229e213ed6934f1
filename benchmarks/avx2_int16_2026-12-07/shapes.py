import statistics, time, flashtree, torch
from flashtree.models import cpu_dense, quant
assert cpu_dense.available()
torch.manual_seed(0)
for (n, k) in [(960, 576), (576, 576), (3072, 576), (576, 1536), (3072, 1536), (3072, 512)]:
    ws = [quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, "q4_1")) for _ in range(30)]
    for T in (1, 8):
        x = torch.randn(T, k).bfloat16()
        def f():
            for w in ws: torch.ops.flashtree.qdense(x, w.qs, w.d, w.m, None)
        f(); ts = []
        for _ in range(21):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        print(f"{n}x{k} T={T}: {med*1e3/30*1e3:.1f} us/matrix, {30*n*k*T/med/1e9:.1f} GMAC/s", flush=True)
