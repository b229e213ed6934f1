"""Speculative requests that end mid-round: on EOS (finish_reason "stop", the EOS not in the text)
and at the context limit (finish_reason "length", output equal to plain greedy, no error).

Drafts come from the pair's random drafter, and from the target's own greedy continuation
(`target_drafts`: at T=0 every draft is accepted), so the stop lands inside an accepted block and
the trees run deep right up to the limit."""
import json
import shutil

import numpy as np
import pytest

from flashtree import LLM, SamplingParams
from flashtree.measure.exactness import target_drafts

GREEDY = dict(temperature=0, ignore_eos=True)


def llm_for(target, drafter, method, oracle=False, **kw):
    llm = LLM(model=target, draft=drafter, method=method, device="cpu", dtype="float32", **kw)
    if oracle:  # the target's greedy chain, ranked first with certainty, so trees follow it to full depth
        target_drafts(llm.target)(llm.engine)
        ranked = llm.engine.drafts.source

        def confident(batch):
            out = ranked(batch)
            for d in out.values():
                d.logprobs[:] = -5.0 * np.arange(d.logprobs.shape[1])
            return out
        llm.engine.drafts.source = confident
    return llm


@pytest.fixture(scope="module")
def reference(tiny_pair):
    ar = llm_for(*tiny_pair, "ar")
    prompt = [7, 3, 11, 5, 2]
    return prompt, ar.generate([prompt], SamplingParams(max_tokens=40, **GREEDY))[0].token_ids


@pytest.fixture(scope="module")
def eos_target(tmp_path_factory, tiny_pair, reference):
    """The tiny target with an EOS id (generation_config.json) that greedy decoding emits at index k,
    in the middle of the second 8-token round, and nowhere before."""
    _, ref = reference
    k = next(i for i in range(12, 40) if ref[i] not in ref[:i])
    d = tmp_path_factory.mktemp("eos") / "target"
    shutil.copytree(tiny_pair[0], d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": ref[k]}))
    return d, k


@pytest.mark.parametrize("method, oracle", [("dflash", True), ("ddtree", True), ("dflash", False), ("ddtree", False)])
def test_speculation_stops_on_eos_inside_a_round(tiny_pair, reference, eos_target, method, oracle):
    (prompt, ref), (target, k) = reference, eos_target
    llm = llm_for(target, tiny_pair[1], method, oracle, budget=16 if method == "ddtree" else None)
    eos = ref[k]
    assert llm.tokenizer.eos_token_ids == [eos]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == ref[:k + 1]  # up to and including the EOS, nothing after it
    assert out.text == llm.tokenizer.decode(ref[:k]) and f"t{eos}" not in out.text.split()
    if oracle:  # the EOS was committed inside an accepted path that went on past it
        assert 1 + sum(out.metrics.accept_lengths) > len(out.token_ids)
        assert max(out.metrics.accept_lengths) == 8


@pytest.mark.parametrize("max_model_len", [24, 29])
@pytest.mark.parametrize("oracle", [True, False])
def test_ddtree_runs_to_the_context_limit(tiny_pair, max_model_len, oracle):
    prompts = [[5, 9, 2, 44, 8], [17, 3, 44, 8, 1, 90, 12, 60, 61, 62, 70, 71, 72], [60]]
    params = SamplingParams(max_tokens=100, **GREEDY)  # more than the context leaves room for
    ar = llm_for(*tiny_pair, "ar", max_model_len=max_model_len)
    tree = llm_for(*tiny_pair, "ddtree", oracle, budget=32, max_model_len=max_model_len, max_batch_size=3)
    refs = ar.generate(prompts, params)
    outs = tree.generate(prompts, params)
    for p, r, o in zip(prompts, refs, outs):
        assert len(r.token_ids) == max_model_len - len(p) and r.finish_reason == "length"
        assert o.token_ids == r.token_ids and o.finish_reason == "length"
        assert o.metrics.completion_tokens == max_model_len - len(p)
        if oracle:  # full blocks right up to the limit, then one round as deep as the room left
            taus = o.metrics.accept_lengths
            last = len(o.token_ids) - 1 - sum(taus[:-1])  # tokens the final round emitted
            # the final tree is clamped to the room left; it may hold one node more, whose bonus
            # would sit past the limit and is dropped (the context clamp counts the bonus as room)
            assert taus[:-1] == [8] * (len(taus) - 1) and last <= taus[-1] <= last + 1, taus
            assert last == ((len(o.token_ids) - 1) % 8 or 8)
    assert not tree.engine.running and not tree.engine.waiting
    assert tree.engine.blocks.free_slots == 3  # every slot returned
