import os
import sys
from pathlib import Path

import pytest
import torch

# Tiny models run as fast on one thread, and a shared 2-core machine stays responsive (an engine
# sets its threads from FLASHTREE_THREADS; a test that needs more threads sets them itself).
os.environ.setdefault("FLASHTREE_THREADS", "1")
torch.set_num_threads(1)
# LLM(compile="auto") would compile every graph of every model a test loads; the compiled path is
# tested on purpose (compile=True) where it matters, so "auto" means eager here.
os.environ.setdefault("FLASHTREE_COMPILE", "0")
# dtype="auto" picks bf16 on CPUs with native bf16 products; the suite's comparisons are written
# for float32 whatever the machine, so "auto" means float32 here (bf16 is tested on purpose).
os.environ.setdefault("FLASHTREE_DTYPE", "float32")

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_drafter, make_hf_target, write_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A random qwen3 target (V=96) with a tokenizer and a random DFlash drafter (block 8)."""
    root = tmp_path_factory.mktemp("tiny_pair")
    target = make_hf_target(root / "target", "qwen3")
    write_tokenizer(target, 96)
    drafter = make_drafter(root / "drafter", target, block_size=8)
    return target, drafter


@pytest.fixture(scope="session")
def models(tiny_pair):
    """The tiny pair loaded in float64 (greedy comparisons without near-ties): (target, drafter)."""
    from flashtree.models.loader import load_drafter, load_target
    target = load_target(tiny_pair[0], dtype="float64", device="cpu")
    return target, load_drafter(tiny_pair[1], target)
