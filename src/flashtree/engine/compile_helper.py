"""A helper process that compiles some of a load's AOT graphs while the loading process compiles the others.

Compiling one AOTInductor package (aot_graphs.py) is mostly single-threaded work — export,
inductor's lowering, one C++ compile — so on a CPU with two or more cores a load hands about half
of the graphs it has to compile (`split`) to a helper: a fresh interpreter that calls `main` (`python
-c`: under `-m`, importing flashtree would import this module a second time and runpy warns; never
a fork, whose torch thread pools would not survive, nor a multiprocessing spawn, which re-runs the
user's `__main__` script when it has no main guard) that loads the same weights in the same dtype,
builds an engine with the same config and so the same graph keys, compiles its buckets into the
package cache and exits (`compile_worker.py`: that process's side). The loading process then loads them from the cache. A helper that fails
costs nothing but time: whatever it left uncompiled, the loading process compiles itself.

A load may also leave graphs to a helper outright (`LLM(precompile="background")`, a server's
default): it starts a helper at a lower priority for the batch graphs and returns; the model runner
runs those shapes eager until the helper has written their packages (`ModelRunner.defer`).

It does not choose buckets (Engine.warmup does) and holds no engine of the loading process.
"""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import switches
from .engine_config import EngineConfig

log = logging.getLogger("flashtree.engine")

Bucket = tuple[str, int, int]  # (model, batch, tokens per sequence), as ModelRunner.buckets

# What compiling one graph costs, in drafter graphs: a target graph (every target layer) takes about
# three times a drafter graph (two layers) — 33–40 s against 11–13 s for SmolLM2-135M on 2 cores.
COST = {"target": 3, "drafter": 1}


@dataclass(frozen=True)
class Rebuild:
    """What a helper needs to build the loading process's engine again: the model and drafter
    directories, the dtype the activations ran in (resolved, never "auto"), the config, and
    torch's thread count (inductor sizes a CPU kernel's parallel loops by it), the quant the
    target was loaded with (None: float weights) and its storage dtype (KV cache, drafter; None: dtype)."""
    model: str
    draft: str | None
    dtype: str
    config: EngineConfig
    threads: int
    quant: str | None = None
    cache_dtype: str | None = None


def cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def split(buckets: list[Bucket]) -> tuple[list[Bucket], list[Bucket]]:
    """(the loader's share, the helper's share) of the graphs to compile, so that both finish
    together. Rule: longest first (COST), each to whichever has less work so far; the loader takes
    the first graph and every tie, since the helper starts later (an interpreter and a weight load)."""
    mine: list[Bucket] = []
    theirs: list[Bucket] = []
    load = [0, 0]  # the loader's, the helper's
    for b in sorted(buckets, key=lambda b: -COST[b[0]]):  # stable: the caller's order among equals
        side = 0 if not mine or load[0] <= load[1] else 1
        (mine, theirs)[side].append(b)
        load[side] += COST[b[0]]
    return mine, theirs


BACKGROUND_NICE = 10  # a background helper's niceness: requests being served keep the cores first


class Helper:
    """One helper process compiling `buckets` (at niceness `nice`); `wait()` joins it."""

    def __init__(self, rebuild: Rebuild, buckets: list[Bucket], nice: int = 0):
        package_root = str(Path(__file__).resolve().parents[2])  # where `flashtree` imports from here
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        entry = "from flashtree.engine.compile_worker import main; main()"
        self.process = subprocess.Popen([sys.executable, "-c", entry], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, env=env)
        try:
            self.process.stdin.write(pickle.dumps((rebuild, buckets, nice)))
            self.process.stdin.close()
        except OSError:  # it died at once: wait() reports its exit status
            pass
        log.info("compiling %d graphs in a helper process (pid %d)", len(buckets), self.process.pid)

    def done(self) -> bool:
        """Whether the helper has exited (without waiting); a failure is logged once, here or in wait()."""
        if self.process.poll() is None:
            return False
        self.wait()
        return True

    def wait(self) -> None:
        """Join the helper (what it left uncompiled, the loader's warmup compiles)."""
        if self.process.returncode is not None:
            return
        code = self.process.wait()
        if code != 0:
            log.warning("the compile helper exited with %s; its graphs compile in this process", code)

    def stop(self) -> None:
        """End the helper now: the load it works for failed or was interrupted (Ctrl-C)."""
        self.process.kill()
        self.process.wait()


def start(rebuild: Rebuild, nice: int = 0):
    """A starter for Engine.warmup: hands buckets to a new helper at niceness `nice` (None if it
    cannot start); no starter on a single core (two compiles would share it) or with
    FLASHTREE_COMPILE_HELPER off."""
    if cores() < 2 or switches.is_off("FLASHTREE_COMPILE_HELPER"):
        return None

    def begin(buckets: list[Bucket]) -> Helper | None:
        try:
            return Helper(rebuild, buckets, nice)
        except Exception:
            log.warning("no compile helper could start; every graph compiles in this process", exc_info=True)
            return None
    return begin


def compile_buckets(runner, buckets: list[Bucket], progress: bool, helper) -> None:
    """Compile (or load) `buckets` on the model runner, about half in a helper process where
    `helper` (a `start` starter) starts one."""
    mine, theirs = buckets, []
    if helper is not None and runner.aot:  # only AOT packages are shared through the disk
        mine, theirs = split(runner.uncached(buckets))
    running = helper(theirs) if theirs else None
    try:
        secs = runner.warmup(mine if running is not None else mine + theirs, progress)
    except BaseException:  # a failed or interrupted load leaves no helper compiling behind it
        if running is not None:
            running.stop()
        raise
    if running is not None:
        if progress and not running.done():
            print(f"waiting for the compile helper's {len(theirs)} graph(s) ...", file=sys.stderr, flush=True)
        running.wait()
        secs += runner.warmup(theirs, progress)
    log.info("compiled %d graphs (%s) in %.1f s%s", len(buckets),
             ", ".join(f"{m} batch {'1' if b == 1 else '>1'} x {'1' if t == 1 else '>1'}" for m, b, t in buckets),
             secs, f" ({len(theirs)} in a helper process)" if running is not None else "")


def warm(runner, limits, config: EngineConfig, progress: bool, batched: bool, helper, background) -> bool:
    """`Engine.warmup`'s work: compile (or load) the runner's graphs for the engine's shapes. Returns
    whether the batch graphs are built (False: batches run eager until the helper wrote them)."""
    if not runner.compiled:
        return True
    lim = limits
    tokens = max([lim.default_block_size, lim.nodes_of(lim.default_budget) + 1, config.draft_len + 1])
    # torch.compile (CUDA) traces without dynamic marks once warm: there every graph compiles now
    built = batched or not runner.aot
    batch = config.max_batch_size if built else 1
    buckets = runner.buckets(batch, tokens, lim.default_block_size)
    compile_buckets(runner, buckets, progress, helper)
    if background is None or built or config.max_batch_size == 1:
        return built
    rest = [b for b in runner.buckets(config.max_batch_size, tokens, lim.default_block_size) if b not in buckets]
    missing = runner.uncached(rest)  # (the ones on disk load now)
    running = background(missing) if missing else None
    if running is not None:
        runner.defer(running)
        log.info("batches run eager until the helper has compiled their %d graphs", len(missing))
        return False
    compile_buckets(runner, missing, progress, None)
    return True
