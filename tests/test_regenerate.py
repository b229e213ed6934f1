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


def test_more_chat_requests_than_the_stdlib_gives_come_from_installed_packages(tmp_path):
    """Asked for more training requests than the stdlib gives, `chat_prompts` keeps the stdlib ones
    as its prefix, in the same order, and appends requests about the packages' documented code —
    never their tests or vendored copies, never a held-out text."""
    from flashtree.train.chats import chat_prompts
    root = tmp_path / "site-packages"
    (root / "pkg" / "tests").mkdir(parents=True)
    (root / "pkg" / "_vendor").mkdir()
    (root / "pkg-1.0.dist-info").mkdir()
    code = 'def {name}(x):\n    """Return the square of a number given as x."""\n    return x * x\n'
    (root / "pkg" / "__init__.py").write_text('"""A package that squares numbers, in many ways."""\n'
                                              + code.format(name="square"))
    (root / "pkg" / "tests" / "test_pkg.py").write_text(code.format(name="tested_square"))
    (root / "pkg" / "_vendor" / "copied.py").write_text(code.format(name="vendored_square"))
    (root / "pkg-1.0.dist-info" / "hook.py").write_text(code.format(name="meta_square"))
    # a package that copies a held-out stdlib module: its code requests would repeat held-out ones
    from flashtree.train.corpus import stdlib_root
    (root / "leak").mkdir()
    (root / "leak" / "decoder.py").write_text((stdlib_root() / "json" / "decoder.py").read_text())
    held = {r["messages"][0]["content"] for r in chat_prompts("heldout")}
    stdlib = chat_prompts("train")
    grown = chat_prompts("train", at_least=len(stdlib) + 1, packages=root)
    assert grown[:len(stdlib)] == stdlib
    extra = grown[len(stdlib):]
    texts = " ".join(r["messages"][0]["content"] for r in extra)
    assert "def square" in texts and {r["kind"] for r in extra} >= {"explain", "test", "edit", "write", "general"}
    assert not any(n in texts for n in ("tested_square", "vendored_square", "meta_square"))
    assert "What is the Python module `leak.decoder` used for?" in texts        # the copy was read,
    assert any("class JSONDecodeError" in t for t in held)                     # it holds held-out requests,
    assert not held & {r["messages"][0]["content"] for r in extra}             # and none of them came in
    assert all(r["id"].startswith("packages/") for r in extra) and len({r["id"] for r in grown}) == len(grown)
    assert chat_prompts("train", at_least=len(stdlib), packages=root) == stdlib  # enough: nothing added
