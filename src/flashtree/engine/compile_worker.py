"""The compile helper's process: it reads a pickled (Rebuild, buckets, niceness) from stdin,
builds the loading process's engine again and compiles those buckets into the package cache.

`compile_helper.py` starts it and decides what it compiles; this module is what runs there (it
imports the engine, which the starter side cannot without a cycle).
"""
from __future__ import annotations

import os
import pickle
import sys

import torch

from ..models.loader import load_drafter, load_target
from .compile_helper import Bucket, Rebuild
from .engine import Engine


def _compile(rebuild: Rebuild, buckets: list[Bucket]) -> None:
    """The helper's whole life: the same weights, the same engine, these buckets compiled."""
    torch.set_num_threads(rebuild.threads)
    target = load_target(rebuild.model, dtype=rebuild.dtype, device="cpu", quant=rebuild.quant,
                         cache_dtype=rebuild.cache_dtype).fuse()
    drafter = load_drafter(rebuild.draft, target).fuse() if rebuild.draft else None
    Engine(target, drafter, rebuild.config).runner.warmup(buckets)


def main() -> None:
    """The helper process's entry point: a pickled (Rebuild, buckets, niceness) on stdin."""
    rebuild, buckets, nice = pickle.loads(sys.stdin.buffer.read())
    if nice:
        os.nice(nice)
    _compile(rebuild, buckets)
