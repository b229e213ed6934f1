"""A drafter's reduced draft vocabulary (`draft_vocab.json`): its LM head reads only those rows and
its drafts map back to target ids. The target verifies every draft, so outputs are unchanged
whatever the vocabulary; only acceptance moves. Checked on the bundled tiny-code pair."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from flashtree import LLM, SamplingParams
from flashtree.config import DRAFT_VOCAB_FILE, ConfigError, DrafterConfig
from flashtree.models.registry import resolve

PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n", "class Stack:\n    def __init__(self):\n",
           "def read_lines(path):\n"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def drafter_with(tmp_path: Path, ids) -> Path:
    """A copy of tiny-code's drafter whose draft vocabulary is `ids` (None: none)."""
    out = tmp_path / f"drafter-{len(ids) if ids is not None else 'all'}"
    shutil.copytree(resolve("tiny-code").drafter, out)
    if ids is not None:
        (out / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": [int(i) for i in ids]}))
    return out


def run(draft: Path, method: str = "dflash"):
    # a fixed tree budget: "auto" sizes trees from timings, which vary with the machine's load
    budget = 8 if method == "ddtree" else None
    with LLM("tiny-code", draft, method=method, budget=budget, compile=False) as llm:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        vocab = llm.engine.runner.draft_ids
    return [o.token_ids for o in outs], [o.metrics.accept_lengths for o in outs], vocab


def test_a_permuted_whole_vocabulary_drafts_exactly_what_the_full_head_does(tmp_path):
    V = DrafterConfig.from_dir(resolve("tiny-code").drafter).layers.vocab_size
    perm = np.random.default_rng(0).permutation(V)
    full, full_taus, none = run(drafter_with(tmp_path, None))
    mapped, mapped_taus, vocab = run(drafter_with(tmp_path, perm))
    assert none is None and vocab is not None and vocab.tolist() == perm.tolist()
    assert mapped == full
    assert mapped_taus == full_taus                    # the same drafts, round by round
    assert max(t for ts in full_taus for t in ts) > 1  # drafts were accepted: the mapping was exercised


@pytest.mark.parametrize("method", ["dflash", "ddtree"])
def test_a_small_vocabulary_changes_acceptance_never_the_output(tmp_path, method):
    full_drafter = drafter_with(tmp_path, None)
    full, full_taus, _ = run(full_drafter, method)
    plain, _, _ = run(full_drafter, "ar")
    # the half of the vocabulary the full run's outputs use least: most drafts cannot be proposed
    used = np.bincount(np.concatenate([np.asarray(o) for o in full]),
                       minlength=DrafterConfig.from_dir(resolve("tiny-code").drafter).layers.vocab_size)
    rare = np.argsort(used, kind="stable")[: len(used) // 2]
    small, small_taus, vocab = run(drafter_with(tmp_path, rare), method)
    assert len(vocab) == len(used) // 2
    assert small == full == plain                      # the target decides every token
    mean = lambda taus: np.mean([t for ts in taus for t in ts])
    assert mean(small_taus) < mean(full_taus) - 0.5    # and the vocabulary is what the drafter drafts from


def test_bad_draft_vocabularies_are_refused_with_the_file_named(tmp_path):
    for bad in ([], [1, 1], ["a"]):
        d = drafter_with(tmp_path / str(len(list(tmp_path.iterdir()))), [0])
        (d / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": bad}))
        with pytest.raises(ConfigError, match="draft_vocab.json.*distinct token ids"):
            DrafterConfig.from_dir(d)
    d = drafter_with(tmp_path / "far", [0, 10**6])
    with pytest.raises(ConfigError, match="draft_vocab.json token_ids"):
        LLM("tiny-code", d, compile=False)
