"""The FLASHTREE_* environment switches: each named once, with what it does.

A switch is read when it is asked for, never at import, so a script or a test that sets one before
the first load is obeyed. `flashtree env` lists every switch with its value. This module does not
hold command-line options, or other programs' variables (CXX, TORCH_EXTENSIONS_DIR and
XDG_CACHE_HOME are read where they are used, as their owners define them).
"""
from __future__ import annotations

import os
from pathlib import Path

# what each switch does; a value among OFF turns an "off" switch off ("0", "false", "no", "off")
SWITCHES = {
    "FLASHTREE_CACHE_DIR": "where converted GGUFs and compiled graphs are kept "
                           "(default $XDG_CACHE_HOME/flashtree, else ~/.cache/flashtree)",
    "FLASHTREE_COMPILE": "off: compile='auto' runs eager PyTorch",
    "FLASHTREE_COMPILE_HELPER": "off: a load compiles all of its graphs in its own process, without a "
                                "helper process compiling about half of them beside it",
    "FLASHTREE_DTYPE": "a dtype name: what dtype='auto' means",
    "FLASHTREE_QUANT": "blocks | none | q8_0 | q4_0: what quant='auto' means",
    "FLASHTREE_CPU_KERNEL": "off: projections through torch instead of flashtree's CPU kernel",
    "FLASHTREE_ISA": "an instruction path at or below this CPU's (avx2 | avx512 | avx512_bf16 | amx): "
                     "flashtree's kernels, dtype auto and torch's dispatch run that path",
    "FLASHTREE_THREADS": "the most compute threads (default: one per core)",
    "FLASHTREE_THREAD_POLICY": "'fixed': always that many threads; default 'follow': as many as the cores "
                               "other processes leave free, re-read twice a second",
    "FLASHTREE_DRAFTER_QUANT": "q8_0 | none: the drafter's projections beside a target in blocks "
                               "(default: q8_0 there, else the drafter's stored dtype)",
    "FLASHTREE_DRAFT_VOCAB": "off: the drafter drafts over the whole vocabulary, not its draft vocabulary",
    "FLASHTREE_API_KEY": "the API key `flashtree serve` requires (unlike --api-key, not visible in ps)",
}
OFF = ("0", "false", "no", "off")
SECRET = ("FLASHTREE_API_KEY",)  # reported as set or not, never shown


def value(name: str) -> str:
    """The switch's value, stripped ("" when unset)."""
    if name not in SWITCHES:
        raise KeyError(f"{name} is not a flashtree switch; they are {', '.join(SWITCHES)}")
    return os.environ.get(name, "").strip()


def is_off(name: str) -> bool:
    """Whether an on-by-default switch is turned off."""
    return value(name).lower() in OFF


def cache_root() -> Path:
    """$FLASHTREE_CACHE_DIR, else $XDG_CACHE_HOME/flashtree, else ~/.cache/flashtree."""
    if value("FLASHTREE_CACHE_DIR"):
        return Path(value("FLASHTREE_CACHE_DIR"))
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashtree"


def current() -> dict[str, str | None]:
    """Every switch and its value (None when unset; a secret's as "(set)"), for `flashtree env`."""
    return {name: ("(set)" if name in SECRET and os.environ.get(name) is not None else os.environ.get(name))
            for name in SWITCHES}
