"""The bf16 projection kernel's outputs on 140 cases (7 weight shapes, bias or not, 10 row counts,
one scale near the denormals), saved for a bitwise comparison of two builds: run it under each
(FLASHTREE_AMX=0 for the vdpbf16ps path) and torch.equal the saved lists.
Usage: python dump_bf16_outputs.py OUT.pt"""
import sys, torch
from flashtree.models import cpu_dense as cd
assert cd.available(), cd.why_unavailable()
g = torch.Generator().manual_seed(0)
ys = []
for N, K in [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (100, 7), (17, 33)]:
    w = (torch.randn(N, K, generator=g) * 0.05).bfloat16()
    for bias in (None, torch.randn(N, generator=g).bfloat16()):
        p = cd.pack(w)
        for M in (1, 2, 3, 4, 9, 16, 17, 33, 40, 300):
            x = (torch.randn(M, K, generator=g) * (1e-36 if M == 3 else 1e-38 if M == 2 else 3.0)).bfloat16()
            ys.append(cd.dense(x, w, p, bias))
torch.save(ys, sys.argv[1])
print(len(ys))
