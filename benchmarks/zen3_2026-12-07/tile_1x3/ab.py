"""The quantized kernel of this tree against an older one, in one process, alternating.

SmolLM2's projection set (30 layers of Q4_1 [960|576|3072 x 576, 576 x 1536] + the Q8_0 head,
100 MB, random weights) at T rows through flashtree::qdense (this tree) and through the older
kernel built under the op namespace `ftx`; the outputs are asserted equal first. 12 rounds of 5
timed passes, medians. From the repository root:

    git show 7c8c173:src/flashtree/models/cpu_quant.cpp | sed 's/(flashtree, /(ftx, /' > /tmp/old_quant.cpp
    python benchmarks/zen3_2026-12-07/tile_1x3/ab.py /tmp/old_quant.cpp 1
"""
import statistics
import sys
import time
from pathlib import Path

import flashtree  # noqa: F401  (first: it settles the instruction path before torch loads)

# isort: split
import torch
from torch.utils.cpp_extension import load

from flashtree.models import cpu_dense, quant

assert cpu_dense.available()
src, T = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
build = Path("/tmp/ftx_old_build")
build.mkdir(exist_ok=True)
load(name="ftx_old", sources=[src], is_python_module=False, build_directory=str(build),
     extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-std=c++20"],
     extra_include_paths=[str(Path(cpu_dense.__file__).parent)])
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
qw = [[quant.interleave(quant.quantize(torch.randn(n, k) * 0.05, "q4_1")) for (n, k) in shapes] for _ in range(30)]
head = quant.interleave(quant.quantize(torch.randn(49152, 576) * 0.05, "q8_0"))
x = {k: torch.randn(T, k) for k in (576, 1536)}
arms = {"this tree": torch.ops.flashtree.qdense, "old": torch.ops.ftx.qdense}
for w, (_n, k) in zip(qw[0], shapes):
    assert torch.equal(arms["this tree"](x[k], w.qs, w.d, w.m, None), arms["old"](x[k], w.qs, w.d, w.m, None))
assert torch.equal(arms["this tree"](x[576], head.qs, head.d, None, None), arms["old"](x[576], head.qs, head.d, None, None))


def run(op):
    for ws in qw:
        for w, (_n, k) in zip(ws, shapes):
            op(x[k], w.qs, w.d, w.m, None)
    op(x[576], head.qs, head.d, None, None)


res = {a: [] for a in arms}
for r in range(12):
    for a in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
        run(arms[a])
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            run(arms[a])
            ts.append(time.perf_counter() - t)
        res[a].append(statistics.median(ts))
base = statistics.median(res["old"])
for a, v in res.items():
    m = statistics.median(v)
    print(f"T={T} {a:10s} {m * 1e3:7.2f} ms  x old {m / base:.3f}  [{min(v) * 1e3:.2f}, {max(v) * 1e3:.2f}]")
