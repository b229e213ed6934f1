"""Regenerated drafter data does not depend on where a run was stopped and resumed."""
import json

import numpy as np

from flashtree.models.loader import load_target
from flashtree.tokenizer import Tokenizer
from flashtree.train.drafter import DrafterRecipe, regenerate


def test_resumed_regeneration_equals_one_run(tiny_pair, tmp_path):
    target_dir, _ = tiny_pair
    target, tok = load_target(target_dir, dtype="float32", device="cpu"), Tokenizer(target_dir)
    corpus = np.random.default_rng(0).integers(1, 95, 2000).astype(np.int32)
    recipe = DrafterRecipe(num_sequences=6, prompt_tokens=(4, 12), response_tokens=8, sampled_fraction=0.5)
    regenerate(target, tok, corpus, recipe, tmp_path / "once.jsonl")
    recipe.num_sequences = 3
    regenerate(target, tok, corpus, recipe, tmp_path / "resumed.jsonl")
    recipe.num_sequences = 6
    regenerate(target, tok, corpus, recipe, tmp_path / "resumed.jsonl")
    once, resumed = ((tmp_path / f"{n}.jsonl").read_text().splitlines() for n in ("once", "resumed"))
    assert len(once) == 6 and resumed == once
    assert len({json.dumps(json.loads(line)["ids"][:4]) for line in once}) > 1  # not one repeated row
