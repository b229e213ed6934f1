"""Whether the bf16 projection kernel's two paths round alike: AMX tiles and vdpbf16ps dot products.

`cpu_dense_bf16.cpp` takes one path per process (AMX on the amx path, vdpbf16ps with FLASHTREE_ISA=avx512_bf16).
Choosing per call by row count would be safe only if both gave the same bf16 outputs. This runs
the same random projections (SmolLM2's shapes, x at scale 1 and 30) in two processes, one per
path, and prints how many outputs differ. Needs a CPU with amx_bf16.

    .venv/bin/python benchmarks/bf16_store_2026-12-05/compare_bf16_paths.py
"""
import os
import subprocess
import sys
import tempfile

SHAPES = [(1, 576, 576), (1, 576, 1536), (1, 1536, 576), (3, 576, 192), (17, 576, 1536), (1, 576, 49152)]
CASES = [(M, K, N, scale) for M, K, N in SHAPES for scale in (1.0, 30.0)]


def run(out: str) -> None:
    import torch

    from flashtree.models import cpu_dense as cd
    assert cd.available(), cd.why_unavailable()
    g = torch.Generator().manual_seed(0)
    ys = []
    for M, K, N, scale in CASES:
        w = (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
        x = (torch.randn(M, K, generator=g) * scale).to(torch.bfloat16)
        b = torch.randn(N, generator=g).to(torch.bfloat16)
        ys.append(cd.dense(x, w, cd.pack(w), b).float())
    torch.save(ys, out)


def main() -> None:
    import torch
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for amx, isa in (("1", "amx"), ("0", "avx512_bf16")):
            paths[amx] = os.path.join(d, f"amx{amx}.pt")
            subprocess.run([sys.executable, __file__, "--run", paths[amx]], check=True,
                           env={**os.environ, "FLASHTREE_ISA": isa})
        a, b = torch.load(paths["1"]), torch.load(paths["0"])
    for (M, K, N, scale), x, y in zip(CASES, a, b):
        print(f"[{M}, {K}] x [{N}, {K}]^T, x scale {scale:g}: {int((x != y).sum())} of {x.numel()} outputs "
              f"differ (max {float((x - y).abs().max()):.3g})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--run":
        run(sys.argv[2])
    else:
        main()
