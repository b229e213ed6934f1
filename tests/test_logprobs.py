"""logprobs under speculation: each output token's log-probability under the target's own
distribution (log-softmax of its logits, before temperature and filters) and its top-k, for every
method — equal to a full uncached forward over prompt + output, whichever tree node the token was
verified at. Tokens never change when logprobs are asked."""
import pytest
import torch

from flashtree import LLM, SamplingParams
from flashtree.errors import UserError

METHODS = ("ar", "ngram", "dflash", "ddtree", "hybrid")
PROMPTS = ["def main(", "import os\n", "class Tree:\n    def __init__(self", "for i in range(",
           "def fib(n):", "with open(path) as f:", "try:\n    import numpy", "x = [i * i for i in"]  # C=8


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-code", dtype="float32", compile=False, max_batch_size=8)


def reference(llm, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """[len(output), V] the target's log-softmax before each output token, from one uncached forward."""
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.inference_mode():
        hidden, _ = llm.target(ids, torch.arange(ids.shape[1])[None])
        lp = torch.log_softmax(llm.target.logits(hidden)[0].float(), -1)
    n = len(prompt_ids)
    return lp[n - 1:n - 1 + len(output_ids)]


def worst_gap(llm, prompt: str, out, shift: int = 0) -> float:
    """Largest |logprob - reference| over the output's tokens and their top lists (`shift` reads the
    reference one position off: the negative control)."""
    ref = reference(llm, llm.tokenizer.encode(prompt), out.token_ids)
    ref = torch.roll(ref, shift, 0) if shift else ref
    gap = 0.0
    for i, (tok, e) in enumerate(zip(out.token_ids, out.logprobs)):
        assert e.token == tok
        gap = max(gap, abs(e.logprob - ref[i, tok].item()))
        values, ids = ref[i].topk(len(e.top))
        assert [t for t, _ in e.top] == ids.tolist() or shift  # (ties aside: none in float32 here)
        gap = max(gap, max((abs(v - w) for (_, v), w in zip(e.top, values.tolist())), default=0.0))
    return gap


@pytest.mark.parametrize("method", METHODS)
def test_greedy_logprobs_equal_a_full_forward_and_tokens_equal_plain(llm, method):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=5)
    plain = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False,
                         method="ar")
    outs = llm.generate(PROMPTS, params, use_tqdm=False, method=method)   # C=8: one batch
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for prompt, o in zip(PROMPTS, outs):
        assert len(o.logprobs) == len(o.token_ids) == 40
        assert worst_gap(llm, prompt, o) < 1e-4
        assert all(e.top[0][0] == e.token for e in o.logprobs)  # greedy: the token is the likeliest
    alone = llm.generate(PROMPTS[:1], params, use_tqdm=False, method=method)[0]   # C=1
    assert alone.token_ids == outs[0].token_ids
    assert max(abs(a.logprob - b.logprob) for a, b in zip(alone.logprobs, outs[0].logprobs)) < 1e-5
    if method != "ar":  # drafts were verified, so logprobs came from tree nodes past the root
        taus = [t for o in outs for t in o.metrics.accept_lengths]
        assert sum(taus) / len(taus) > 1


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_sampled_logprobs_are_the_raw_distribution_and_leave_draws_unchanged(llm, method):
    base = dict(temperature=0.7, top_k=20, max_tokens=32, ignore_eos=True, seed=11)
    without = llm.generate(PROMPTS[:2], SamplingParams(**base), use_tqdm=False, method=method)
    outs = llm.generate(PROMPTS[:2], SamplingParams(**base, logprobs=2), use_tqdm=False, method=method)
    assert [o.token_ids for o in outs] == [o.token_ids for o in without]
    for prompt, o in zip(PROMPTS, outs):
        assert worst_gap(llm, prompt, o) < 1e-4  # not scaled by 1/T, not renormalised over the top-k


def test_the_check_catches_logprobs_one_position_off(llm):
    """Negative control: the same comparison against the reference shifted by one token fails."""
    o = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3),
                     use_tqdm=False, method="ddtree")[0]
    assert worst_gap(llm, PROMPTS[0], o, shift=1) > 0.1


def test_logprobs_follow_the_stops_and_are_absent_unless_asked(llm):
    o = llm.generate(["def main("], SamplingParams(temperature=0, max_tokens=7, logprobs=0), use_tqdm=False,
                     method="dflash")[0]
    assert len(o.logprobs) == len(o.token_ids) <= 7 and all(e.top == () for e in o.logprobs)
    stop = o.token_ids[3]
    cut = llm.generate(["def main("], SamplingParams(temperature=0, max_tokens=7, logprobs=1, stop_token_ids=[stop]),
                       use_tqdm=False, method="dflash")[0]
    assert cut.token_ids[-1] == stop and len(cut.logprobs) == len(cut.token_ids) <= 4
    assert llm.generate(["def main("], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0].logprobs is None


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5, "3"])
def test_logprobs_out_of_range_is_refused(bad):
    with pytest.raises(UserError, match=r"logprobs must be None \(off\) or an integer in \[0, 20\]"):
        SamplingParams(logprobs=bad)
