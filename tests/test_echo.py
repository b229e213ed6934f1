"""Completions' echo: the prompt before the completion, and with logprobs its tokens' log-probabilities
(the first's null) from the prefill's rows — equal to one uncached forward's log-softmax, whatever
the chunking, the prefix cache and the method — as lm-eval-harness asks for them (echo, logprobs,
max_tokens=1) through the `openai` client."""
from __future__ import annotations

import pytest
import torch

from flashtree import LLM, SamplingParams
from flashtree.errors import UserError
from serving import openai_client, served

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"


def reference(llm, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from one uncached forward."""
    with torch.inference_mode():
        hidden, _ = llm.target(torch.tensor([ids]), torch.arange(len(ids))[None])
        lp = torch.log_softmax(llm.target.logits(hidden[0]).float(), -1)
    return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_prompt_logprobs_equal_an_uncached_forward_across_chunks_and_the_prefix_cache(method):
    llm = LLM("tiny-code", dtype="float32", compile=False, max_batch_size=4, max_num_batched_tokens=16,
              page_size=4)
    ids = llm.tokenizer.encode(PROMPT)
    want = reference(llm, ids)
    assert len(ids) > 16  # the prompt is prefilled in chunks
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # its pages are cached
    outs = llm.generate([PROMPT, PROMPT], [SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2),
                                           SamplingParams(temperature=0, max_tokens=3)], use_tqdm=False, method=method)
    got = outs[0].prompt_logprobs
    assert got[0] is None and [e.token for e in got[1:]] == ids[1:] and outs[1].prompt_logprobs is None
    assert max(abs(e.logprob - w) for e, w in zip(got[1:], want)) < 1e-4
    assert all(len(e.top) == 2 and e.top[0][1] >= e.logprob - 1e-6 for e in got[1:])
    assert outs[0].token_ids == outs[1].token_ids
    with pytest.raises(UserError, match="prompt_logprobs must be"):
        SamplingParams(prompt_logprobs=21)


@pytest.fixture(scope="module")
def server():
    r = served(LLM("tiny-code", dtype="float32", compile=False, max_batch_size=2))
    yield r
    r.stop()


def test_echo_with_logprobs_as_lm_eval_asks(server):
    client, served = openai_client(server), server
    ids = served.llm.tokenizer.encode(PROMPT)
    r = client.completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = reference(served.llm, ids)
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:len(ids)], want)) < 1e-4
    assert r.choices[0].text.startswith(PROMPT) and len(r.choices[0].text) > len(PROMPT)
    assert lp.text_offset[0] == 0 and lp.text_offset[-1] == len("".join(lp.tokens[:-1]))
    plain = client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=4, temperature=0)
    alone = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0)
    assert plain.choices[0].text == PROMPT + alone.choices[0].text and plain.choices[0].logprobs is None
    parts = client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=4, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts if p.choices) == plain.choices[0].text
    for max_tokens in (1, 6):  # (with 1 the prompt's logprobs come with the final update)
        kw = dict(model="tiny", prompt=PROMPT, echo=True, logprobs=2, max_tokens=max_tokens, temperature=0)
        whole = client.completions.create(**kw).choices[0]
        parts = [p.choices[0] for p in client.completions.create(**kw, stream=True) if p.choices]
        assert "".join(p.text for p in parts) == whole.text
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [x for p in parts if p.logprobs for x in getattr(p.logprobs, name)] == \
                getattr(whole.logprobs, name), name
