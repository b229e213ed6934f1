"""Exactness on the real pair: SmolLM2-135M-Instruct with the drafter trained for it.

Greedy output of every method equals plain greedy decoding (method "ar") token for token, at
C=1 and C=8, within a dtype; sampled output at T=0.6 and 1.0 (top-p 0.95) follows the target's
exact next-token distribution at positions drafted and verified in trees (`position_check`),
with drafts verified (tau > 1), and a verifier 10 % off in temperature is caught (these against
the exact distribution in float32: see `pair`). In bfloat16 the sampled check is two-sample:
speculative against plain sampling of the same engine (`compare_with_plain`), with its own
negative control. The default suite runs the C=8 float32 greedy check; the rest is marked slow
(`make test-slow`)."""
from __future__ import annotations

import pytest

from flashtree import LLM, SamplingParams
from flashtree.measure.exactness import (
    compare_with_plain,
    position_check,
    wrong_temperature,
)
from flashtree.models.registry import MODELS

REAL = MODELS["smollm2-135m-instruct"]
pytestmark = pytest.mark.skipif(not REAL.has_drafter(), reason="the real pair's drafter is not bundled")

CHATS = ["Write a Python function that checks whether a number is prime.",
         "Explain what a Python list comprehension is, with an example.",
         "What is the capital of Japan? Answer in one sentence.",
         "Give me three tips for writing clear code.",
         "How do I read a JSON file in Python?",
         "Summarise what a hash table is.",
         "Write a haiku about autumn.",
         "What does the `with` statement do in Python?"]
N_BF16 = 1500   # runs per arm of the bf16 two-sample check
METHODS = [("ngram", {}), ("dflash", {}), ("ddtree", {}), ("ddtree", {"budget": 8}), ("hybrid", {}), ("hybrid", {"budget": 8})]


def greedy_outputs(llm: LLM, chats: list[str], max_tokens: int, batch: int, **kw) -> tuple[list, list]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    convs = [[{"role": "user", "content": c}] for c in chats]
    outs = []
    for i in range(0, len(convs), batch):
        outs += llm.chat(convs[i:i + batch], params, use_tqdm=False, **kw)
    return [o.token_ids for o in outs], [t for o in outs for t in o.metrics.accept_lengths]


def check_methods(dtype: str, batch: int, chats: list[str], max_tokens: int) -> None:
    llm = LLM("smollm2-135m-instruct", dtype=dtype, compile=False, max_batch_size=8, max_model_len=1024)
    want, _ = greedy_outputs(llm, chats, max_tokens, batch, method="ar")
    for method, kw in METHODS:
        got, taus = greedy_outputs(llm, chats, max_tokens, batch, method=method, **kw)
        assert got == want, (method, kw, dtype, batch)
        if method == "dflash" or kw:  # fixed shapes: drafts were accepted, the check compared something
            assert sum(taus) / len(taus) > 1.2, (method, kw)  # (auto may decode plainly; ngram finds few n-grams)


def test_greedy_equals_ar_for_every_method_at_c8_fp32():
    check_methods("float32", 8, CHATS[:4], 40)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_equals_ar_for_every_method(dtype, batch):
    check_methods(dtype, batch, CHATS, 96)


@pytest.fixture(scope="module")
def pair():
    # float32: the reference distribution (`exact_distribution`, one uncached forward) then agrees
    # with the engine's paged forward to ~1e-6. In bfloat16 the two forwards round differently, and
    # a logit near 20 moves in steps of 0.125 (x1.23 in probability at T=0.6): the reference was
    # not the distribution the engine samples from (dflash, T=0.6: 1 and 2 samples outside its
    # top-p support, p = 0), while the same check in float32 passes (min p 0.016).
    llm = LLM("smollm2-135m-instruct", dtype="float32", compile=False, method="ar", max_model_len=1024)
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "Write a short poem about the sea."}])
    return llm.engine.target, llm.engine.drafter, prompt


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.6, 1.0])
@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 8)])
def test_sampled_positions_follow_the_exact_distribution(pair, temperature, method, budget):
    target, drafter, prompt = pair
    check = position_check(target, drafter, prompt, SamplingParams(temperature=temperature, top_p=0.95), method,
                           budget, n=1500, min_count=250)
    assert check.mean_accept_length > 1 and len(check.tests) >= 2, check
    assert check.passed, check


@pytest.mark.slow
def test_a_verifier_ten_percent_off_in_temperature_is_caught(pair):
    target, drafter, prompt = pair
    check = position_check(target, drafter, prompt, SamplingParams(temperature=1.0, top_p=0.95), "ddtree", 8,
                           n=1500, min_count=250, patch=wrong_temperature)
    assert check.rejected(), check


def bf16_llm() -> tuple[LLM, list[int]]:
    llm = LLM("smollm2-135m-instruct", dtype="bfloat16", compile=False, method="ar", max_model_len=1024,
              max_batch_size=64)
    return llm, llm.tokenizer.encode_chat([{"role": "user", "content": "Write a short poem about the sea."}])


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_bf16_sampled_output_is_distributed_as_plain_sampling(temperature):
    """bfloat16, top-p 0.95: the first 3 answer tokens of dflash and ddtree@8 (runs generate 11, so
    the counted tokens come out of verified drafts) against plain sampling, 1,500 runs each."""
    llm, prompt = bf16_llm()
    rows = compare_with_plain(llm, n=N_BF16, prompts=[prompt], n_tokens=3, temperatures=(temperature,), budget=8,
                              top_p=0.95, methods=("dflash", "ddtree"))
    assert [r["method"] for r in rows] == ["dflash", "ddtree"]
    for r in rows:
        assert r["mean_accept_length"] > 1 and r["categories"] >= 10, r
        assert r["passed"], r


@pytest.mark.slow
def test_the_bf16_check_catches_a_verifier_off_in_temperature():
    """The same two-sample check with ddtree's verify drawing at T x 1.1 fails it (measured p 3.9e-5
    against the 1e-3 threshold, x1.2 1e-14: near the check's power limit,
    benchmarks/bf16_exactness_2026-12-05)."""
    llm, prompt = bf16_llm()
    rows = compare_with_plain(llm, n=N_BF16, prompts=[prompt], n_tokens=3, temperatures=(1.0,), budget=8,
                              top_p=0.95, methods=("ddtree",), patch=wrong_temperature)
    assert rows[0]["mean_accept_length"] > 1, rows
    assert not rows[0]["passed"], rows
