"""bf16 blocks widened once per block (the new rule) against widened per query (FT_NO_WIDEN=1, the
old rule), alternating in one process, on an experimental build that reads FT_NO_WIDEN at each
block; outputs compared bitwise."""
import os, time, statistics, torch
from flashtree.models import cpu_dense as cd
assert cd.available()
torch.manual_seed(0)
H, Hkv, D, P = 9, 3, 64, 16
rows = 4096
kc = torch.randn(rows, Hkv, D).bfloat16(); vc = torch.randn(rows, Hkv, D).bfloat16()
res = {}
cases = []
for th in (1, 2):
  for L in (250, 1000):
    for T in (1, 9, 17):
        q = torch.randn(1, T, H, D); kn = torch.randn(1, T, Hkv, D).bfloat16(); vn = torch.randn(1, T, Hkv, D).bfloat16()
        table = torch.randperm(rows // P)[None, : (L + T) // P + 1].contiguous()
        vis = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
        cases.append(((th, L, T), (q, kn, vn, kc, vc, table, torch.tensor([L]), vis, P)))
for rep in range(9):
    for mode in ("1", "0"):
        if mode == "1": os.environ["FT_NO_WIDEN"] = "1"
        else: os.environ.pop("FT_NO_WIDEN", None)
        for key, args in cases:
            torch.set_num_threads(key[0])
            f = lambda: cd.paged_attention(*args)
            outs = f()
            for _ in range(50): f()
            ts = []
            for _ in range(500):
                t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
            res.setdefault((key, mode), []).append(statistics.median(ts) * 1e6)
            res.setdefault((key, "out" + mode), outs)
for key, _ in cases:
    o, n = statistics.median(res[(key, "1")]), statistics.median(res[(key, "0")])
    same = torch.equal(res[(key, "out1")], res[(key, "out0")])
    print(f"threads={key[0]} L={key[1]} T={key[2]}: per query {o:.1f} us, per block {n:.1f} us, new/old {n/o:.2f}, outputs equal {same}")
