"""Ahead-of-time compiled forwards on the CPU: one AOTInductor package per shape bucket, cached on disk.

The model runner's forwards are pure functions of tensors. `AOTGraphs` wraps one of them: the first
call of a bucket exports the function (`torch.export`, non-strict) with every named size that is 1 in
that call kept static and every other one a `Dim` (>= 2) — the same buckets dynamo's 0/1
specialisation gives `torch.compile` — compiles it with AOTInductor into a package whose weights
are *not* in the shared object, loads it and hands it the model's own parameters
(`load_constants(user_managed=True)`: no second copy). Later calls go straight to the package's C++
runner: no dynamo frame, no guard evaluation. On this repository's 2-core CPU that was 0.4 ms less
per one-token target step than `torch.compile` (1.06 -> 0.67-0.69 ms, bit-identical outputs,
interleaved in one process).

Packages are cached under $FLASHTREE_CACHE_DIR (default ~/.cache/flashtree)/aoti, one file per
(graph, bucket) keyed by everything the traced graph depends on: torch's version, the source of the
modules it traces (`models/`, `model_runner.py`; this module's FORMAT), the weights' names, shapes and dtypes,
the runner's static settings (page size, feature layers, CPU kernel on/off) and inductor's CPU vector
ISA. A cached package loads in well under a second; compiling one costs ~15-25 s here. Deleting the
directory is always safe.

It does not decide buckets (the runner pads sizes that must not be 1) or run eager forwards. A graph
writes its new K/V (and features) into the cache tensors it is handed as inputs, in place, and
nothing else of the cache: which rows, the runner decides.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from ..switches import cache_root

log = logging.getLogger("flashtree.engine")

_SOURCES = ("models", "engine/model_runner.py")  # what a traced graph is made of
FORMAT = 2  # bump when how this module exports or compiles changes (it is not in _SOURCES)
# Every weight stays the model's own tensor, read at run time: none in the shared object, and none
# inlined into the generated code (inductor inlines 1-D tensors of <= 8 values, e.g. a small bias,
# which would tie a cached package to the weights it was exported with). Pass a copy: inductor
# adds its own keys to the dict.
# bf16/fp16: every op rounds as eager's does (emulate_precision_casts). Fused without it, a graph
# keeps float32 between ops, and graphs of other shapes fuse differently: a bf16 prompt prefilled
# by one graph and continued by another decoded other tokens than the same prompt from a prefix-
# cache hit (1 of 6 greedy SmolLM2 chats equal), so plain decoding was not reproducible.
_INDUCTOR = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True,
             "emulate_precision_casts": True}
# Compiled with torch's threads at the machine's CPU count, inductor's parallel loops ask OpenMP
# for the threads torch has when they run (`#pragma omp parallel`, no fixed num_threads), so the
# engine's thread count (cpu.ThreadGovernor) reaches them, and which loops run in parallel is
# decided the same way on every compile. (cpp.dynamic_threads does more: it parallelises even a
# small reduction, whose sums then depend on the thread count and on a call's row count, and
# speculative greedy decoding stopped matching plain decoding's.)
_COMPILE_THREADS = os.cpu_count() or 1
# torch 2.13's export deep-copies treespecs, which constructs its own deprecated LeafSpec: a
# FutureWarning per graph that no caller can act on, so compiling filters it out
_LEAF_SPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def why_unavailable() -> str | None:
    """Why packages cannot be built here (None: they can). AOTInductor compiles C++."""
    cxx = os.environ.get("CXX", "c++")
    return None if shutil.which(cxx) else f"no C++ compiler ({cxx}) on PATH"


def available() -> bool:
    return why_unavailable() is None


def cache_dir() -> Path:
    """Where packages live: $FLASHTREE_CACHE_DIR/aoti, else $XDG_CACHE_HOME (or ~/.cache)/flashtree/aoti."""
    return cache_root() / "aoti"


@functools.cache
def _source_digest() -> str:
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for rel in _SOURCES:
        p = pkg / rel
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.suffix in (".py", ".cpp"):
                h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@functools.cache
def _vec_isa() -> str:
    """The CPU's vector ISA, for the cache key: torch's dispatch capability and the CPU's flags.
    (Inductor's own `pick_vec_isa` compiles test programs: ~0.6 s of every load.)"""
    from .. import cpu
    flags = ",".join(sorted(cpu.cpu_flags() or ()))
    return f"{platform.machine()}-{cpu.isa()}-{torch.backends.cpu.get_cpu_capability()}-" \
           f"{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


class _Exported(torch.nn.Module):
    """What torch.export sees: fn over positional tensors, with the weights of `parts` as its state."""

    def __init__(self, fn: Callable, parts: dict[str, torch.nn.Module]):
        super().__init__()
        self.parts = torch.nn.ModuleDict(parts)
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class _Runner:
    """A loaded package called with positional tensors. (The package's own __call__ parses its
    input and output tree specs from JSON on every call: ~0.1 ms a call under cProfile here, where
    the package's own run took ~0.6 ms.) A flat tuple of outputs is returned as one, without
    unflattening a spec."""
    __slots__ = ("loader", "out_spec")

    def __init__(self, loader):
        self.loader = loader
        spec = pytree.treespec_loads(self.loader.get_call_spec()[1])
        flat = spec.type is tuple and all(c.is_leaf() for c in spec.children())
        self.out_spec = None if flat else spec

    def __call__(self, *args):
        out = self.loader.boxed_run(list(args))
        return tuple(out) if self.out_spec is None else pytree.tree_unflatten(out, self.out_spec)


class NotCached(LookupError):
    """A bucket's package is not on disk, and the graphs were told not to compile (`compile_missing`)."""


class AOTGraphs:
    """fn(*args) through an AOTInductor package per bucket. dims: per positional argument, a name per
    axis (None: that axis's size is part of the graph, e.g. a head count) — axes with equal names have
    equal sizes; a named axis smaller than its minimum (`mins`, default 2) is static in its bucket,
    any other size a Dim >= the minimum. (A size the traced code slices to 1 needs a minimum of 3:
    export says so when it does.)"""

    def __init__(self, name: str, fn: Callable, parts: dict[str, torch.nn.Module],
                 dims: tuple[tuple[str | None, ...] | None, ...], settings: dict, mins: dict[str, int] | None = None):
        self.name, self.dims = name, dims
        self.mins = {n: (mins or {}).get(n, 2) for axes in dims if axes for n in axes if n}
        self.module = _Exported(fn, parts)
        self.weights = dict(self.module.named_parameters(remove_duplicate=False))
        self.weights.update(self.module.named_buffers(remove_duplicate=False))
        self._named = [(i, a, n) for i, axes in enumerate(dims) if axes for a, n in enumerate(axes) if n]
        first = {}
        for i, a, n in self._named:  # equal names are equal sizes: one axis per name tells its bucket
            first.setdefault(n, (i, a, n, self.mins[n]))
        self._probe = tuple(first.values())
        self._key = json.dumps(  # fixed now: a later change to anything it names cannot move a package
            {"graph": name, "format": FORMAT, "torch": torch.__version__, "source": _source_digest(), "isa": _vec_isa(),
             "settings": settings, "inductor": _INDUCTOR, "compile_threads": _COMPILE_THREADS, "dims": dims,
             "mins": self.mins,
             "weights": sorted((k, list(t.shape), str(t.dtype)) for k, t in self.weights.items())},
            sort_keys=True, default=str)
        self.packages: dict[frozenset, Callable] = {}
        self.compiled_now = 0  # packages compiled (not loaded from the cache) by this object
        self.compile_missing = True  # False: a bucket not on disk raises NotCached instead of compiling

    def bucket(self, args) -> frozenset:
        """The named sizes that are static (below their minimum) in this call, with their values."""
        return frozenset((n, args[i].shape[a]) for i, a, n, least in self._probe if args[i].shape[a] < least)

    def __call__(self, *args):
        args = tuple(a.contiguous() for a in args)
        b = self.bucket(args)
        run = self.packages.get(b)
        if run is None:
            run = self.packages[b] = self._load(b, args)
        return run(*args)

    def path(self, bucket: frozenset) -> Path:
        key = self._key + json.dumps(sorted(bucket))
        return cache_dir() / f"{self.name}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pt2"

    def _load(self, bucket: frozenset, args) -> Callable:
        path = self.path(bucket)
        if not path.exists():
            if not self.compile_missing:
                raise NotCached(str(path))
            self._compile(bucket, args, path)
            self.compiled_now += 1
        # the package's C++ loader itself: `torch._inductor.aoti_load_package` would import inductor,
        # dynamo and triton for nothing here (1 s at start and ~65 MB resident, on a CPU)
        run = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        wanted = run.get_constant_fqns()
        missing = [f for f in wanted if f not in self.weights]
        if missing:
            raise RuntimeError(f"{path} wants constants the model does not have ({', '.join(missing[:3])}); "
                               f"delete {cache_dir()} and load again")
        # the binding's arguments are positional: use_inactive=False, check_full_update=True, user_managed=True
        run.load_constants({f: self.weights[f] for f in wanted}, False, True, True)
        return _Runner(run)

    def _compile(self, bucket: frozenset, args, path: Path) -> None:
        from torch.export import Dim
        static = dict(bucket)
        named = {n: Dim(n, min=self.mins[n]) for _, _, n in self._named if n not in static}
        spec = tuple({a: named[n] for a, n in enumerate(axes) if n in named} or None if axes else None
                     for axes in self.dims)
        log.info("compiling the %s graph for %s with AOTInductor", self.name,
                 ", ".join(f"{n}={v}" for n, v in sorted(static.items())) or "every size dynamic")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=path.parent)  # written whole, then renamed:
        os.close(fd)                                                 # a reader never sees half a file
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", _LEAF_SPEC_WARNING, FutureWarning)
                ep = torch.export.export(self.module, args, dynamic_shapes=(spec,), strict=False)
                running = torch.get_num_threads()
                torch.set_num_threads(_COMPILE_THREADS)
                try:
                    torch._inductor.aoti_compile_and_package(ep, package_path=tmp,
                                                             inductor_configs=dict(_INDUCTOR))  # (it adds keys)
                finally:
                    torch.set_num_threads(running)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
