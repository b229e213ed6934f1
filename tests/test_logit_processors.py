"""logit_bias, min_tokens and the repetition / presence / frequency penalties under speculation:
each tree node's row is processed along its own path, so greedy output equals plain decoding's
for every method (C=1 and C=8, drafts verified: tau > 1) and sampled output matches the exact
distribution of the processed target (with a negative control: an engine that ignored the
processors is caught). Plus the rule itself against a naive model of it, and bad values."""
from collections import Counter

import pytest
import torch

from flashtree import LLM, SamplingParams, logit_processors
from flashtree.engine.sampler import Sampler
from flashtree.errors import UserError
from flashtree.measure.exactness import (
    P_MIN,
    Cell,
    check_cell,
    chi_square_pooled,
    exact_distribution,
    sample_sequences,
    tiny_pair,
)

METHODS = ("ar", "ngram", "dflash", "ddtree", "hybrid")
PROMPTS = ["def main(", "import os\n", "class Tree:\n    def __init__(self", "for i in range(",
           "def fib(n):", "with open(path) as f:", "try:\n    import numpy", "x = [i * i for i in"]  # C=8
PROCESSED = dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3, logit_bias={5: 2.0, 17: -3.0})


def naive(logits: list[float], params: SamplingParams, prompt: list[int], generated: list[int],
          stop_ids: set[int]) -> list[float]:
    """The processors token by token, as their documentation states them."""
    out = list(logits)
    for t, b in (params.logit_bias or {}).items():
        out[t] += b
    for t in range(len(out)):
        if len(generated) < params.min_tokens and t in stop_ids:
            out[t] = float("-inf")
        if t in prompt or t in generated:
            out[t] = out[t] / params.repetition_penalty if out[t] > 0 else out[t] * params.repetition_penalty
        c = generated.count(t)
        if c:
            out[t] -= params.presence_penalty + params.frequency_penalty * c
    return out


def test_the_processors_follow_their_rule():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(40, generator=g) * 3
        params = SamplingParams(max_tokens=9, min_tokens=3, **PROCESSED)
        prompt = torch.randint(0, 40, (5,), generator=g).tolist()
        generated = torch.randint(0, 40, (int(torch.randint(0, 6, (1,), generator=g)),), generator=g).tolist()
        got = logits.clone()
        logit_processors.apply(got, params, prompt, generated, frozenset({3, 9}))
        want = naive(logits.tolist(), params, prompt, generated, {3, 9})
        assert torch.allclose(got, torch.tensor(want), atol=1e-5)
    assert not logit_processors.adjusts(SamplingParams())


def test_rows_at_once_equal_one_row_at_a_time():
    """apply_rows (every tree node's row in a few ops) against apply per row, on random paths that
    repeat tokens of the output and of themselves."""
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        params = SamplingParams(max_tokens=20, min_tokens=int(torch.randint(0, 8, (1,), generator=g)), **PROCESSED)
        prompt = torch.randint(0, 40, (5,), generator=g).tolist()
        generated = torch.randint(0, 40, (int(torch.randint(0, 5, (1,), generator=g)),), generator=g).tolist()
        paths = [torch.randint(0, 40, (int(torch.randint(0, 5, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(6)]
        logits = torch.randn(6, 40, generator=g) * 3
        want = logits.clone()
        for i, p in enumerate(paths):
            logit_processors.apply(want[i], params, prompt, generated + p, frozenset({3, 9}))
        logit_processors.apply_rows(logits, params, prompt, generated, paths, frozenset({3, 9}))
        assert torch.allclose(logits, want, atol=1e-5), (paths, generated)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-code", dtype="float32", compile=False, max_batch_size=8)


def reference_decode(llm, prompt: str, params: SamplingParams) -> list[int]:
    """Greedy decoding by uncached forwards with the processors applied by hand (no engine)."""
    prompt_ids = llm.tokenizer.encode(prompt)
    out: list[int] = []
    while len(out) < params.max_tokens:
        ids = torch.tensor([prompt_ids + out])
        with torch.inference_mode():
            hidden, _ = llm.target(ids, torch.arange(ids.shape[1])[None])
            logits = llm.target.logits(hidden[0, -1]).float()
            logit_processors.apply(logits, params, prompt_ids, out, frozenset(params.stop_token_ids or ()))
        out.append(int(logits.argmax()))
        if out[-1] in (params.stop_token_ids or ()):
            break
    return out


@pytest.mark.parametrize("method", METHODS)
def test_greedy_with_processors_equals_plain_decoding(llm, method):
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, **PROCESSED)
    plain = llm.generate(PROMPTS, params, use_tqdm=False, method="ar")
    outs = llm.generate(PROMPTS, params, use_tqdm=False, method=method)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    small = llm.generate(PROMPTS[:4], params, use_tqdm=False, method=method)   # C=4
    alone = llm.generate(PROMPTS[:1], params, use_tqdm=False, method=method)   # C=1
    assert [o.token_ids for o in small] == [o.token_ids for o in plain[:4]] and alone[0].token_ids == outs[0].token_ids
    if method == "ar":
        assert outs[0].token_ids == reference_decode(llm, PROMPTS[0], params)
        unprocessed = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
                                   use_tqdm=False, method="ar")
        assert [o.token_ids for o in outs] != [o.token_ids for o in unprocessed]  # they change the output
    else:
        # (ngram sizes its chains by measured costs: at C=8 it may decline to draft, so every
        # concurrency's rounds count)
        taus = [t for o in outs + small + alone for t in o.metrics.accept_lengths]
        assert sum(taus) / len(taus) > 1


@pytest.mark.parametrize("method", ["dflash", "ddtree"])
def test_min_tokens_holds_back_the_stop_ids(llm, method):
    free = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False,
                        method="ar")[0].token_ids
    stop = free[1]  # greedy decoding would stop at its second token
    base = dict(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop])
    assert len(llm.generate(PROMPTS[:1], SamplingParams(**base), use_tqdm=False, method=method)[0].token_ids) == 2
    params = SamplingParams(**base, min_tokens=6)
    out = llm.generate(PROMPTS[:1], params, use_tqdm=False, method=method)[0].token_ids
    assert stop not in out[:6] and out == reference_decode(llm, PROMPTS[0], params)
    assert out == llm.generate(PROMPTS[:1], params, use_tqdm=False, method="ar")[0].token_ids


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=3)


SAMPLED = dict(repetition_penalty=1.5, presence_penalty=0.8, frequency_penalty=0.5, logit_bias={2: 1.5})


@pytest.mark.parametrize("method, budget", [("ddtree", 6), ("dflash", None)])
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_sampled_output_has_the_processed_targets_distribution(pair, method, budget, temperature):
    cell = Cell(method, budget, SamplingParams(temperature=temperature, **SAMPLED), n=20_000)
    check_cell(*pair, [1, 2, 3], cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit)
    assert cell.mean_accept_length > 1.0


class CommittedOnly(Sampler):
    """A wrong sampler: each row processed with the committed tokens only, not its node's ancestors."""

    def adjusted(self, seqs, logits, spans, vin=None):
        return super().adjusted(seqs, logits, spans, None)


def committed_only(engine) -> None:
    engine.sampler = CommittedOnly(engine.device)  # the engine's sampler seam


def test_processors_that_ignore_the_nodes_ancestors_are_caught(pair):
    """Negative control: the penalties applied from the committed tokens only (each drafted node
    processed as if it were the root) shift the draws below the root, and the same test rejects it."""
    cell = Cell("ddtree", 6, SamplingParams(temperature=1.0, **SAMPLED), n=20_000)
    check_cell(*pair, [1, 2, 3], cell, patch=committed_only)
    assert cell.rejected(), (cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)


def test_an_engine_ignoring_the_processors_is_caught(pair):
    """Negative control: samples of the unprocessed target against the processed target's exact
    distribution fail the same test (the processors here move the distribution by a TV the test
    resolves at this sample size)."""
    target, drafter = pair
    processed = SamplingParams(temperature=1.0, **SAMPLED)
    exact = exact_distribution(target, [1, 2, 3], processed, 4)
    counts = sample_sequences(target, drafter, [1, 2, 3], SamplingParams(temperature=1.0), "ddtree", 6,
                              20_000, 4).counts
    assert chi_square_pooled(counts, exact, 20_000) < P_MIN
    assert sum(counts.values()) == 20_000 and isinstance(counts, Counter)


@pytest.mark.parametrize("bad, match", [
    (dict(presence_penalty=2.5), "presence_penalty must be in"),
    (dict(frequency_penalty=-3), "frequency_penalty must be in"),
    (dict(repetition_penalty=0), "repetition_penalty must be in"),
    (dict(min_tokens=200), "min_tokens must be an integer in"),
    (dict(logit_bias={"5": 1.0}), "logit_bias must map token ids"),
    (dict(logit_bias={5: 101}), "logit_bias must map token ids"),
])
def test_bad_processor_values_are_refused(bad, match):
    with pytest.raises(UserError, match=match):
        SamplingParams(max_tokens=128, **bad)
