"""The bundled tiny-code pair loads by name and its greedy dflash / ddtree output equals ar."""
import json

import pytest

from flashtree import LLM, SamplingParams
from flashtree.llm import BUNDLED_DRAFTER, BUNDLED_TARGET
from flashtree.train.corpus import load_prompts


def test_bundled_files_are_present_and_small():
    for d in (BUNDLED_TARGET, BUNDLED_DRAFTER):
        assert (d / "config.json").is_file() and (d / "model.safetensors").is_file(), d
    size = sum(f.stat().st_size for d in (BUNDLED_TARGET, BUNDLED_DRAFTER) for f in d.iterdir())
    assert size <= 40 * 2 ** 20
    assert json.loads((BUNDLED_TARGET / "config.json").read_text())["model_type"] == "qwen3"


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-code", max_batch_size=4)


def test_greedy_dflash_and_ddtree_equal_ar_on_heldout_prompts(llm):
    prompts = load_prompts()[:4]
    params = SamplingParams(temperature=0, max_tokens=48)
    ref = llm.generate(prompts, params, method="ar")
    for method, budget in (("dflash", None), ("ddtree", 8), ("ddtree", 32)):
        outs = llm.generate(prompts, params, method=method, budget=budget)
        assert [o.token_ids for o in outs] == [r.token_ids for r in ref], (method, budget)
        assert sum(o.metrics.mean_accept_length for o in outs) / len(outs) > 1.5  # the drafter is trained


def test_bundled_target_writes_python(llm):
    out = llm.generate(["import os\n\n\ndef "], SamplingParams(temperature=0, max_tokens=40))[0]
    assert "(" in out.text and ":" in out.text
