import os, sys, time, statistics, torch
from flashtree.models import cpu_dense as cd
assert cd.available()
torch.manual_seed(0)
H, Hkv, D, P = 9, 3, 64, 16
rows = 4096
kc = torch.randn(rows, Hkv, D).bfloat16(); vc = torch.randn(rows, Hkv, D).bfloat16()
out = {}
for th in (2, 1):
  torch.set_num_threads(th)
  for L in (250, 1000):
    for T in (1, 8, 16):
        q = torch.randn(1, T, H, D); kn = torch.randn(1, T, Hkv, D).bfloat16(); vn = torch.randn(1, T, Hkv, D).bfloat16()
        table = torch.randperm(rows // P)[None, : (L + T) // P + 1].contiguous()
        vis = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
        args = (q, kn, vn, kc, vc, table, torch.tensor([L]), vis, P)
        f = lambda: cd.paged_attention(*args)
        for _ in range(50): f()
        meds = []
        for r in range(5):
            ts = []
            for _ in range(300):
                t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
            meds.append(statistics.median(ts) * 1e6)
        out[(th, L, T)] = f()
        print(f"threads={th} L={L} T={T}: {statistics.median(meds):.1f} us", flush=True)
torch.save(out, sys.argv[1] if len(sys.argv) > 1 else "/tmp/att/out.pt")
