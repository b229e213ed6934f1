"""This CPU's instruction path and flashtree's compute threads, settled before torch starts.

- **The path** (`isa()`): the highest of avx2 < avx512 < avx512_bf16 < amx that the CPU has, or a
  lower one forced with FLASHTREE_ISA on any machine (so every path is tested and measured on
  whatever machine a session has). It decides flashtree's kernels (`models/cpu_dense.py` and the
  C++, which reads the same variable), dtype auto (`models/loader.py`) and torch's own kernels: `prepare()` sets ATEN_CPU_CAPABILITY to match before torch loads (inductor's
  generated code follows it too). A path above the CPU's is refused: it would crash.
- **The threads** (`threads()`): FLASHTREE_THREADS, else one per core; the engine's
  `ThreadGovernor` runs as many of them as the cores other processes leave free. OpenMP's idle
  threads sleep after a short spin (`WAIT_ENV`, set before torch loads its OpenMP runtime). With
  both threads fixed and libgomp's long spin, decoding beside one busy process fell to 0.04x of
  its quiet speed; following the free cores it keeps what one thread decodes (docs/cpu-paths.md).
- **The last-level cache's size** (`last_level_cache_bytes()`, from sysfs), which quant auto
  weighs a model's bf16 weights against on the amx path (`models/loader.py`).

This module imports no torch (it runs before torch loads) and decides nothing about dtypes or
kernels beyond naming the path; those are the loaders' and the kernels' business.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import sys
import time
from pathlib import Path

from . import switches
from .errors import UserError

log = logging.getLogger("flashtree.cpu")

# the x86 instruction paths, lowest first, and the CPU flags each needs (on top of the lower ones')
PATHS = ("avx2", "avx512", "avx512_bf16", "amx")
NEEDS = {"avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
         "avx512_bf16": {"avx512_bf16"}, "amx": {"amx_tile", "amx_bf16"}}
NONE = "none"  # not x86-64 with AVX2 + FMA: torch's own kernels only
ATEN = {"avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512", "amx": "avx512"}

# libgomp (torch's CPU wheel) and Intel's runtime: idle threads sleep after a short spin (~20 us)
# instead of libgomp's 300,000 iterations. Quiet decoding kept its speed with it, and a thread
# left spinning beside a busy neighbour no longer burns its partner's time slices
# (benchmarks/threads_2026-12-06/measure_threads.py, docs/cpu-paths.md); the user's own values win.
WAIT_ENV = {"GOMP_SPINCOUNT": "20000", "KMP_BLOCKTIME": "0"}


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (None where they cannot be read)."""
    try:
        line = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), None)
    except OSError:
        return None
    return frozenset(line.split(":", 1)[1].split()) if line else None


def native_isa(flags: frozenset[str] | None = None) -> str:
    """The highest path whose flags (and all lower paths' flags) the CPU has; NONE below AVX2."""
    flags = cpu_flags() if flags is None else flags
    if flags is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return NONE
    best, need = NONE, set()
    for path in PATHS:
        need |= NEEDS[path]
        if not need <= flags:
            break
        best = path
    return best


def resolve_isa(forced: str, native: str) -> str:
    """FLASHTREE_ISA's value against the CPU's path: the forced path, or an error saying what is
    allowed (a path the CPU lacks cannot run)."""
    if not forced or forced == "auto":
        return native
    if forced not in PATHS:
        raise UserError(f"FLASHTREE_ISA='{forced}' is not a path; use one of auto, {', '.join(PATHS)}")
    if native == NONE or PATHS.index(forced) > PATHS.index(native):
        have = "none of them" if native == NONE else f"up to {native}"
        raise UserError(f"FLASHTREE_ISA='{forced}' is above this CPU's instructions ({have}); "
                         f"a lower path can be forced, a higher one cannot run")
    return forced


@functools.cache
def isa() -> str:
    """The instruction path flashtree runs: the CPU's highest, or FLASHTREE_ISA's — settled once a
    process, as the kernels settle it (they read the variable once)."""
    return resolve_isa(switches.value("FLASHTREE_ISA").lower(), native_isa())


def at_least(path: str) -> bool:
    """Whether the path in use includes `path`'s instructions."""
    current = isa()
    return current != NONE and PATHS.index(current) >= PATHS.index(path)


def bf16_native() -> str | None:
    """The instructions that multiply bf16 on the path in use ('amx_bf16', 'avx512_bf16'), or None."""
    return "amx_bf16" if at_least("amx") else "avx512_bf16" if at_least("avx512_bf16") else None


def cache_size(text: str) -> int | None:
    """Bytes of a sysfs cache size ("491520K", "32M", "512"), or None where it is not one."""
    text = text.strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    return int(digits) * scale if digits.isdigit() else None


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The size of the highest-level cache the first CPU sees (Linux sysfs), or None where the
    system does not say."""
    best = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if size is not None and (best is None or level > best[0]):
            best = (level, size)
    return best[1] if best else None


def cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads() -> int:
    """The most compute threads flashtree uses: FLASHTREE_THREADS, else one per core."""
    raw = switches.value("FLASHTREE_THREADS")
    if not raw:
        return cores()
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"FLASHTREE_THREADS='{raw}' is not a thread count; use an integer >= 1 (or unset: "
                         f"one per core, {cores()} here)")
    return n


def prepare() -> None:
    """Before torch loads: OpenMP's wait policy and torch's dispatch path for the path in use.
    A variable the user set is left as it is. Where torch is already loaded, its runtime has read
    them, and a forced path is reported as not applying to torch's kernels."""
    for name, val in WAIT_ENV.items():
        os.environ.setdefault(name, val)
    try:
        path = isa()
    except UserError:  # a wrong FLASHTREE_ISA: said where a load asks for the path
        return
    if path != NONE and path != native_isa() and "ATEN_CPU_CAPABILITY" not in os.environ:
        os.environ["ATEN_CPU_CAPABILITY"] = ATEN[path]
        if "torch" in sys.modules:
            log.warning("FLASHTREE_ISA=%s was set after torch loaded: torch's own kernels keep the CPU's path "
                        "(set it before importing torch)", path)


def free_cores(total: int, others_cpu_s: float, wall_s: float) -> int:
    """The cores left free when other processes used `others_cpu_s` of CPU time in `wall_s`:
    the rest rounded to the nearest core, at least 1 and at most `total`."""
    if wall_s <= 0:
        return total
    return max(1, min(total, round(total - max(0.0, others_cpu_s) / wall_s)))


class FreeCores:
    """`free_cores` between calls, read from /proc/stat (the machine's busy time) less
    /proc/self/stat (this process's own time, which does not count against it)."""

    def __init__(self, total: int):
        self.total = total
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        """(wall s, busy CPU s of the machine, CPU s of this process), or None where /proc is not."""
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
            mine = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        vals = [int(v) for v in fields]
        busy = (sum(vals[:8]) - vals[3] - vals[4]) / tick  # all but idle and iowait (guests are in user)
        return time.monotonic(), busy, (int(mine[11]) + int(mine[12])) / tick

    def __call__(self) -> int:
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return self.total
        return free_cores(self.total, (now[1] - last[1]) - (now[2] - last[2]), now[0] - last[0])


POLICIES = ("follow", "fixed")


def thread_policy() -> str:
    """FLASHTREE_THREAD_POLICY: 'follow' (the default) or 'fixed'."""
    raw = switches.value("FLASHTREE_THREAD_POLICY").lower() or "follow"
    if raw not in POLICIES:
        raise UserError(f"FLASHTREE_THREAD_POLICY='{raw}' is not a policy; use one of {', '.join(POLICIES)}")
    return raw


class ThreadGovernor:
    """The compute threads of a decoding loop: `most` of them, or as many as `free()` says are
    free (`FreeCores`, the 'follow' policy), asked at most every `period` seconds between steps.
    A parallel region waits for its slowest thread: a thread sharing its core with a busy
    neighbour gets half the core's time slices, and every region of a step waits on it, so fewer
    threads on the free cores decode faster than more threads on busy ones. `apply(n)` sets the
    count (torch.set_num_threads)."""

    def __init__(self, most: int, apply, free=None, period: float = 0.5):
        self.most, self.apply, self.free, self.period = most, apply, free, period
        self.now = most
        self._next = time.monotonic() + period
        apply(most)

    @classmethod
    def for_this_machine(cls, most: int, apply, follow: bool) -> ThreadGovernor:
        """`most` threads, following the free cores when `follow` (and there is more than one)."""
        return cls(most, apply, FreeCores(most) if follow and most > 1 else None)

    def __call__(self) -> int:
        """Between steps: the thread count for the next one (changed only when the cores free changed)."""
        if self.free is None or time.monotonic() < self._next:
            return self.now
        self._next = time.monotonic() + self.period
        n = max(1, min(self.most, self.free()))
        if n != self.now:
            self.now = n
            self.apply(n)
        return self.now


def return_free_heap() -> None:
    """Hand the heap's free memory back to the OS (glibc's malloc_trim): a load's temporaries
    (float32 tensors converted to the model's dtype, packing copies, blocks re-laid) leave freed
    blocks that the allocator otherwise keeps resident, and the next, larger allocation takes new
    pages beside them. Nothing where the C library has no malloc_trim."""
    import ctypes
    try:
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: glibc's where it is the C library
    except (OSError, AttributeError):
        pass
