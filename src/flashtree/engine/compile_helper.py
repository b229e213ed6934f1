"""A helper process that compiles some of a load's AOT graphs while the loading process compiles the others.

Compiling one AOTInductor package (aot_graphs.py) is mostly single-threaded work — export,
inductor's lowering, one C++ compile — so on a CPU with two or more cores a load that builds
every graph (`precompile="all"`: serve, bench) hands the graphs it does not need for one
sequence to a helper: a fresh process (spawned, not forked: torch's thread pools do not survive a
fork) that loads the same weights in the same dtype, builds an engine with the same config and so
the same graph keys, compiles its buckets into the package cache and exits. The loading process
then loads them from the cache. A helper that fails costs nothing but time: whatever it left
uncompiled, the loading process compiles itself.

It does not choose buckets (Engine.warmup does) and holds no engine of the loading process.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from dataclasses import dataclass

from .. import switches
from .engine_config import EngineConfig

log = logging.getLogger("flashtree.engine")

Bucket = tuple[str, int, int]  # (model, batch, tokens per sequence), as ModelRunner.buckets


@dataclass(frozen=True)
class Rebuild:
    """What a helper needs to build the loading process's engine again: the model and drafter
    directories, the dtype the weights were loaded in (resolved, never "auto"), the config, and
    torch's thread count (inductor sizes a CPU kernel's parallel loops by it)."""
    model: str
    draft: str | None
    dtype: str
    config: EngineConfig
    threads: int


def cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Helper:
    """One helper process compiling `buckets`; `wait()` joins it."""

    def __init__(self, rebuild: Rebuild, buckets: list[Bucket]):
        self.process = multiprocessing.get_context("spawn").Process(
            target=_compile, args=(rebuild, buckets), name="flashtree-compile-helper", daemon=True)
        self.process.start()
        log.info("compiling %d graphs in a helper process (pid %d)", len(buckets), self.process.pid)

    def wait(self) -> None:
        """Join the helper (what it left uncompiled, the loader's warmup compiles)."""
        self.process.join()
        if self.process.exitcode != 0:
            log.warning("the compile helper exited with %s; its graphs compile in this process",
                        self.process.exitcode)


def start(rebuild: Rebuild):
    """A starter for Engine.warmup: hands buckets to a new helper (None if it cannot start); no
    starter on a single core (two compiles would share it) or with FLASHTREE_COMPILE_HELPER off."""
    if cores() < 2 or switches.is_off("FLASHTREE_COMPILE_HELPER"):
        return None

    def begin(buckets: list[Bucket]) -> Helper | None:
        try:
            return Helper(rebuild, buckets)
        except Exception:  # noqa: BLE001 -- no helper (a __main__ spawn cannot import, say): compile here
            log.warning("no compile helper could start; every graph compiles in this process", exc_info=True)
            return None
    return begin


def _compile(rebuild: Rebuild, buckets: list[Bucket]) -> None:
    """The helper's whole life: the same weights, the same engine, these buckets compiled."""
    import torch

    from ..models.loader import load_drafter, load_target
    from .engine import Engine
    torch.set_num_threads(rebuild.threads)
    target = load_target(rebuild.model, dtype=rebuild.dtype, device="cpu").fuse()
    drafter = load_drafter(rebuild.draft, target).fuse() if rebuild.draft else None
    Engine(target, drafter, rebuild.config).runner.warmup(buckets)
