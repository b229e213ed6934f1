"""The CPU kernels: the projection kernels (`cpu_dense.cpp`; bf16 dot products in
`cpu_dense_bf16.cpp`), paged attention (`cpu_attention.cpp`),
a small top-k (`cpu_topk.cpp`) and the sampler's filters and draw (`cpu_sample.cpp`) — built
together once, then packing weights for the first and calling them.

`torch.ops.flashtree.dense(x, weight, packed, bias)` computes `F.linear(x, weight, bias)` for up
to MAX_ROWS rows with an AVX2/FMA kernel that reads each packed weight once per six rows (MKL's
sgemm is slow for few rows on the CPUs measured; see the .cpp), and hands more rows to
`at::linear`. Every output row is the same sequential sum whatever else is in the batch.

It is built with torch's C++-extension loader the first time a process asks for it on a
machine (~10 s; later processes load the cached library) — only on x86-64 CPUs with AVX2 and FMA
and a C++ compiler, and not when `FLASHTREE_CPU_KERNEL=0`. Processes load it one at a time under
an OS file lock (`flock`, dropped when its holder dies): torch's own lock is a plain file, which a
process killed while loading leaves behind, and every later load would wait on it for ever — so a
torch lock found while holding ours is stale and is removed (with a warning). Anything else, or a failed build
(logged once, with the reason), leaves `available()` False, projections on `F.linear` and
attention on SDPA over gathered rows.

`torch.ops.flashtree.paged_attention` (`paged_attention` here) attends new tokens to a
sequence's cached K/V read in place through its page table (see the .cpp for the rule).
`topk` here takes the k largest of each row (the drafter's top-k per depth) in one pass;
`sample_rows` cuts and draws sampled rows (`sampling.sample_host` calls it).

This module does not decide which layers use the kernels (`layers.Linear.pack` and
`layers.paged_applies` do) and holds no weights.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .. import cpu, switches

log = logging.getLogger("flashtree.models")

MAX_ROWS = 256  # above this many rows the op calls at::linear (kMaxRows in the .cpp)
PANEL = 16      # output columns per packed panel (kW in the .cpp)
TOPK_MAX = 64   # above this k, `topk` is torch's (the kernel's insertion buffer is made for a few)
_SOURCES = [str(Path(__file__).with_name(f))
            for f in ("cpu_dense.cpp", "cpu_dense_bf16.cpp", "cpu_quant.cpp", "cpu_quant_amx.cpp",
                      "cpu_attention.cpp", "cpu_topk.cpp",
                      "cpu_sample.cpp")]
_HEADER = Path(__file__).with_name("cpu_kernels.h")  # what the sources share (in the build's key, below)


def bf16_dot() -> bool:
    """bf16 projections use the AVX512-BF16 kernel (`cpu_dense_bf16.cpp`): the avx512_bf16 and amx paths."""
    return cpu.at_least("avx512_bf16")


def bf16_path() -> str | None:
    """How bf16 projections multiply here, by `cpu_dense_bf16.cpp`'s rule (it reads FLASHTREE_ISA
    too): AMX tiles on the amx path, vdpbf16ps dot products on avx512_bf16; None below. (The
    kernel also needs the OS to grant the tile state, which this does not ask: where Linux refuses
    it, the kernel takes the dot products although this says tiles.)"""
    if cpu.at_least("amx"):
        return "AMX tiles (FLASHTREE_ISA=avx512_bf16: vdpbf16ps dot products)"
    return "vdpbf16ps dot products" if bf16_dot() else None


def _why_not() -> str | None:
    """Why the kernel cannot be used here, or None when it can be built."""
    if switches.is_off("FLASHTREE_CPU_KERNEL"):
        return "FLASHTREE_CPU_KERNEL=0"
    if not cpu.at_least("avx2"):
        return f"needs an x86-64 CPU with AVX2 and FMA (this is {platform.machine()}, path {cpu.isa()})"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler (set CXX or install g++)"
    return None


def _ninja_on_path() -> None:
    """torch's loader runs `ninja`; the `ninja` wheel (a dependency) installs it beside this Python."""
    if shutil.which("ninja") is None:
        import ninja
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


_NAME = "flashtree_cpu_kernels"


def _sources_digest() -> str:
    """The kernel's sources and shared header, hashed: the build directory's name carries it."""
    h = hashlib.sha256()
    for f in [*_SOURCES, str(_HEADER)]:
        h.update(Path(f).name.encode() + b"\0" + Path(f).read_bytes())
    return h.hexdigest()[:12]


def build_directory() -> Path:
    """Where the kernel is built and cached: $TORCH_EXTENSIONS_DIR, else torch's default root and
    folder for this Python and build of torch, then the library's name and its sources' hash, so
    checkouts of other sources on one machine each keep their own build instead of rebuilding
    each other's."""
    from torch.utils.cpp_extension import get_default_build_root
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        accel = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        root = os.path.join(get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}"
                                                      f"{getattr(sys, 'abiflags', '')}_{accel}")
    return Path(root) / f"{_NAME}_{_sources_digest()}"


@contextlib.contextmanager
def _one_loader(build: Path):
    """Hold the build directory's flock (the OS drops it if this process dies); inside it a
    torch `lock` file can only be one a killed process left, and is removed."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock alone
        yield
        return
    build.mkdir(parents=True, exist_ok=True)
    with open(build / "flashtree.flock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        stale = build / "lock"
        if stale.exists():
            log.warning("removing %s: a process killed while loading the CPU kernel left it, and every later "
                        "load would wait on it", stale)
            stale.unlink(missing_ok=True)
        yield  # (closing the file releases the flock)


@functools.cache
def _load() -> str | None:
    """Build (once per machine) and load the kernel: None when it is ready, else why not."""
    why = _why_not()
    if why is None:
        try:
            from torch.utils.cpp_extension import load
            _ninja_on_path()
            t0 = time.perf_counter()
            # torch rebuilds when the sources or the flags change; the header's hash in the
            # flags makes an edit of the header alone rebuild too
            header = hashlib.sha1(_HEADER.read_bytes()).hexdigest()[:12]
            build = build_directory()
            with _one_loader(build):
                load(name=_NAME, sources=_SOURCES, is_python_module=False, build_directory=str(build),
                     extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", f"-DFLASHTREE_KERNELS_H={header}"],
                     verbose=False)
            torch.library.register_fake("flashtree::dense")(_dense_shape)
            torch.library.register_fake("flashtree::dense_bf16")(_dense_shape)
            torch.library.register_fake("flashtree::paged_attention")(_attention_shape)
            torch.library.register_fake("flashtree::qdense")(_qdense_shape)
            torch.library.register_fake("flashtree::qdense_panels")(_qdense_panels_shape)
            log.debug("CPU projection kernel ready in %.1f s", time.perf_counter() - t0)
        except Exception as e:  # a build or load failure: keep serving on F.linear
            why = f"build failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    if why is not None and why != "FLASHTREE_CPU_KERNEL=0":
        log.warning("CPU projection kernel not used (%s): projections run on torch's GEMM", why)
    return why


def available() -> bool:
    """Whether the kernel is ready (building it the first time a process asks)."""
    return _load() is None


def why_unavailable() -> str | None:
    """Why the kernel is not used here (None when it is)."""
    return _load()


def _dense_shape(x, weight, packed, bias):
    """Shape of the op's output for torch.compile's tracing: [..., N]."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _qdense_shape(x, qs, d, m, bias):
    """Shape of qdense's output: [..., N] (qs [N, K] or [N, K/2])."""
    return x.new_empty((*x.shape[:-1], qs.shape[0]))


def _qdense_panels_shape(x, qs, d, m, bias, n):
    """Shape of qdense_panels' output: [..., n]."""
    return x.new_empty((*x.shape[:-1], n))


def _attention_shape(q, k_new, v_new, k_cache, v_cache, table, lengths, vis, page_size, scale):
    """Shape of paged_attention's output: q's [B, T, H, D]."""
    return torch.empty_like(q)


def paged_attention(q, k_new, v_new, k_cache, v_cache, table, lengths, vis, page_size: int) -> torch.Tensor:
    """Attention of queries q [B, T, H, D] over each sequence's cached rows < lengths[b], read in
    place from one layer's cache [rows, Hkv, D] through the page table [B, pages], then over the
    new rows k_new, v_new [B, N, Hkv, D] that vis [B, T, N] lets them see (`cpu_attention.cpp`;
    q float32, K/V float32 or bfloat16; call only when `available()`) -> [B, T, H, D] float32."""
    return torch.ops.flashtree.paged_attention(q, k_new, v_new, k_cache, v_cache, table, lengths, vis, page_size,
                                               q.shape[-1] ** -0.5)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k, dim=-1) — values descending, equal values by lower index: through the kernel for
    a float32 CPU tensor and k <= TOPK_MAX when it is built, else torch.topk."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and k <= TOPK_MAX and available():
        return torch.ops.flashtree.topk(x, k)
    return x.topk(k, dim=-1)


def sample_rows(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                min_p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One token per row of logits [S, V] float32 with per-row temperature, top_p, min_p [S]
    float32, top_k [S] int64 and u [S] float64 -> [S] int64 (V: no valid mass), by
    `cpu_sample.cpp` (call only when `available()`): the tensor pipeline's rule (`sampling.logits_to_probs`
    + `sampling.sample`)."""
    t = torch.from_numpy
    return torch.ops.flashtree.sample_rows(t(logits), t(temperature), t(top_k), t(top_p), t(min_p), t(u)).numpy()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> packed [ceil(N/16), K, 16]: packed[p, k, c] = weight[16p + c, k], zeros past N;
    bf16 on a CPU with AVX512-BF16, the dot-product kernel's layout with k in pairs:
    [ceil(N/16), 16 ceil(K/32), 16, 2], packed[p, j, c, e] = weight[16p + c, 2j + e] (zeros past N
    and K: K is padded to whole AMX tiles of 16 pairs)."""
    n, k = weight.shape
    p = -(-n // PANEL)
    if weight.dtype == torch.bfloat16 and bf16_dot():
        kk = -(-k // 32) * 32
        padded = torch.zeros(p * PANEL, kk, dtype=weight.dtype, device=weight.device)
        padded[:n, :k] = weight.detach()
        return padded.view(p, PANEL, kk // 2, 2).transpose(1, 2).contiguous()
    padded = torch.zeros(p * PANEL, k, dtype=weight.dtype, device=weight.device)
    padded[:n] = weight.detach()
    return padded.view(p, PANEL, k).transpose(1, 2).contiguous()


def dense(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ weight.T + bias through the kernel (call only when `available()`); the packed
    layout (`pack`) says which: k pairs for the bf16 dot-product kernel, else `cpu_dense.cpp`."""
    if packed.dim() == 4:
        return torch.ops.flashtree.dense_bf16(x, weight, packed, bias)
    return torch.ops.flashtree.dense(x, weight, packed, bias)
