"""Paged attention's two work-split rules alternating in one process (attention_split_ab.txt). Needs
the experimental build described there (cpu_attention.cpp reading FT_OLD_SPLIT at each call); on
the kept build both arms run the same rule."""
import os, time, statistics, torch
from flashtree.models import cpu_dense as cd
assert cd.available()
torch.manual_seed(0)
H, Hkv, D, P = 9, 3, 64, 16
rows = 4096
kc = torch.randn(rows, Hkv, D).bfloat16(); vc = torch.randn(rows, Hkv, D).bfloat16()
res = {}
cases = []
for L in (250, 1000):
    for T in (1, 9, 17):
        q = torch.randn(1, T, H, D); kn = torch.randn(1, T, Hkv, D).bfloat16(); vn = torch.randn(1, T, Hkv, D).bfloat16()
        table = torch.randperm(rows // P)[None, : (L + T) // P + 1].contiguous()
        vis = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
        cases.append(((L, T), (q, kn, vn, kc, vc, table, torch.tensor([L]), vis, P)))
for rep in range(5):
    for mode in ("1", "0"):
        os.environ["FT_OLD_SPLIT"] = mode
        for key, args in cases:
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
    print(f"L={key[0]} T={key[1]}: old split {o:.1f} us, new {n:.1f} us, new/old {n/o:.2f}, outputs equal {same}")
