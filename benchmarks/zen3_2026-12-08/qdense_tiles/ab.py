"""This tree's quantized kernel against an earlier one, in one process, pass by pass.

SmolLM2's projection set (30 layers of Q4_1 [960|576|3072 x 576, 576 x 1536] + the Q8_0 head,
100 MB, random weights) at T rows through flashtree::qdense (this tree) and through BASE's kernel
built under the op namespace `ftbase`, each on its own layout of the same blocks:
- 01f6bde: q4 groups one by one, 4 x 1 tiles, tails added block by block;
- 648cc17: q4 groups in pairs, 4 x 2 tiles, tails added block by block (this tree sums a tail of
  1, 2 or 4 blocks in lanes and loads an x group once for the tile's weight rows);
- any later commit: this tree's layout.
The outputs are compared first (within 1e-4: the tail's float order differs). PAIRS pairs of
passes, one of each kernel, alternating which goes first; the median of the pairs' ratios (the
VM drifts within a second). From the repository root:

    git show 01f6bde:src/flashtree/models/cpu_quant.cpp | sed 's/(flashtree, /(ftbase_01f6bde, /' > /tmp/base_01f.cpp
    python benchmarks/zen3_2026-12-08/qdense_tiles/ab.py 01f6bde /tmp/base_01f.cpp 1 8 16
"""
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import flashtree  # noqa: F401  (first: it settles the instruction path before torch loads)

# isort: split
import torch
from torch.utils.cpp_extension import load

from flashtree.models import cpu_dense, quant

assert cpu_dense.available()
base, src, Ts = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3:]] or [1, 8]
# BASE's layout: 01f6bde's and 648cc17's as below; a later commit's is this tree's
print(f"base {base}: {'its own layout' if base in ('01f6bde', '648cc17') else 'the layout of this tree'}")
build = Path(f"/tmp/ftbase_build_{base}")
build.mkdir(exist_ok=True)
load(name=f"ftbase_{base}", sources=[src], is_python_module=False, build_directory=str(build),
     extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-std=c++20"],
     extra_include_paths=[str(Path(cpu_dense.__file__).parent)])


def base_order(k: int, q4: bool) -> np.ndarray:
    """BASE's layout: 01f6bde's groups by eights one by one (q4 and q8 alike); 648cc17's as this
    tree's runs, the tail in place."""
    runs, p = k // 256, np.arange(k)
    if base not in ("01f6bde", "648cc17"):
        return quant.order_by_eights(k, q4)
    if base == "648cc17":
        p[:256 * runs] = quant.order_by_eights(k, q4)[:256 * runs]
        return p
    s, rem = np.divmod(p[:256 * runs], 256)
    g, rem = np.divmod(rem, 32)
    lane, t = np.divmod(rem, 4)
    p[:256 * runs] = (8 * s + lane) * 32 + 4 * g + t
    return p


def base_layout(w: quant.Blocks) -> quant.Blocks:
    k, q4 = w.shape[1], w.qs.dtype == torch.uint8
    qs = quant._pack(quant._unpack(w.qs, k)[:, torch.from_numpy(base_order(k, q4))], q4)
    return quant.Blocks(w.kind, qs, w.d, w.m, True)


torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
plain = [[quant.quantize(torch.randn(n, k) * 0.05, "q4_1") for (n, k) in shapes] for _ in range(30)]
plain_head = quant.quantize(torch.randn(49152, 576) * 0.05, "q8_0")
arms = {
    "this tree": ([[quant.interleave(w) for w in ws] for ws in plain], quant.interleave(plain_head), torch.ops.flashtree.qdense),
    base: ([[base_layout(w) for w in ws] for ws in plain], base_layout(plain_head), getattr(torch.ops, f"ftbase_{base}").qdense),
}


def run(qw, head, op, x):
    for ws in qw:
        for w, (_n, k) in zip(ws, shapes, strict=True):
            op(x[k], w.qs, w.d, w.m, None)
    op(x[576], head.qs, head.d, None, None)


for T in Ts:
    x = {k: torch.randn(T, k) for k in (576, 1536)}
    outs = {a: [op(x[k], w.qs, w.d, w.m, None) for w, (_n, k) in zip(qw[0], shapes, strict=True)]
            + [op(x[576], head.qs, head.d, None, None)] for a, (qw, head, op) in arms.items()}
    pairs = list(zip(*outs.values(), strict=True))
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in pairs), "the kernels' outputs differ"
    print(f"T={T:2d} outputs bitwise equal: {all(torch.equal(a, b) for a, b in pairs)}; largest difference "
          f"{max((a - b).abs().max().item() for a, b in pairs):.2e}")
    res = {a: [] for a in arms}
    names = list(arms)
    for a in names:
        run(*arms[a], x)
    for r in range(int(os.environ.get("PAIRS", 100))):  # pass by pass, alternating which goes first
        for a in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            run(*arms[a], x)
            res[a].append(time.perf_counter() - t)
    ratios = sorted(p / q for p, q in zip(res["this tree"], res[base], strict=True))
    lo, hi = ratios[len(ratios) // 4], ratios[3 * (len(ratios) - 1) // 4]
    for a, v in res.items():
        print(f"T={T:2d} {a:10s} median {statistics.median(v) * 1e3:7.2f} ms  [{min(v) * 1e3:.2f}, {max(v) * 1e3:.2f}]", flush=True)
    print(f"T={T:2d} this tree / {base}, pass by pass: median {statistics.median(ratios):.3f} "
          f"(quartiles {lo:.3f}-{hi:.3f}, {len(ratios)} pairs)", flush=True)
