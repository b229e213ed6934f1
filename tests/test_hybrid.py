"""Hybrid trees: the DDTree of the drafter's marginals with the n-gram continuation merged in as a
branch — the builder, greedy identity with plain decoding, exactness of sampled output."""
import math

import numpy as np
import pytest

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig
from flashtree.measure.exactness import NEGATIVE_CONTROLS, Cell, check_cell, tiny_pair
from flashtree.speculative.hybrid import build_hybrid
from flashtree.speculative.tree import build_ddtree
from helpers import repetitive_prompts


def drafts(L=4, K=3, seed=0, V=50):
    rng = np.random.default_rng(seed)
    lp = np.sort(np.log(rng.dirichlet(np.ones(V), size=L)), axis=1)[:, ::-1][:, :K].copy()
    ids = np.stack([rng.permutation(V)[:K] for _ in range(L)])
    return lp, ids


def check_shape(t, budget):
    assert t.size - 1 <= budget
    for i in range(1, t.size):
        assert t.parents[i] < i and t.depths[i] == t.depths[t.parents[i]] + 1  # parents precede children
    kids = {}
    for i in range(1, t.size):
        kids.setdefault(t.parents[i], []).append(t.tokens[i])
    assert all(len(v) == len(set(v)) for v in kids.values())  # siblings distinct


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 4, 9])
def test_without_a_copy_it_is_the_ddtree(seed, budget):
    lp, ids = drafts(seed=seed)
    a, b = build_hybrid(7, lp, ids, [], budget, math.log(0.5)), build_ddtree(7, lp, ids, budget)
    assert (a.tokens, a.parents, a.depths, a.logprobs) == (b.tokens, b.parents, b.depths, b.logprobs)


def test_a_copy_equal_to_the_argmax_chain_is_merged():
    lp, ids = drafts()
    chain = ids[:, 0].tolist()
    t = build_hybrid(7, lp, ids, chain, 9, math.log(0.5))
    check_shape(t, 9)
    ref = build_ddtree(7, lp, ids, 9)
    assert t.size == ref.size  # the copy added no node: every one of its prefixes was a drafter node
    assert set(zip(t.parents, t.tokens)) >= {(0, chain[0])}


@pytest.mark.parametrize("seed", range(5))
def test_a_copy_is_a_branch_within_the_budget(seed):
    lp, ids = drafts(seed=seed)
    copy = [49 - d for d in range(4)]  # tokens the drafter's top-3 mostly does not hold
    copy = [c for c in copy]
    t = build_hybrid(7, lp, ids, copy, 6, math.log(0.9))  # a confident copy: its whole branch fits
    check_shape(t, 6)
    node, depth = 0, 0
    for tok in copy:
        node = next(i for i in range(1, t.size) if t.parents[i] == node and t.tokens[i] == tok)
        depth += 1
        assert t.depths[node] == depth
    unsure = build_hybrid(7, lp, ids, copy, 6, math.log(1e-9))  # a hopeless copy takes no budget
    ref = build_ddtree(7, lp, ids, 6)
    assert (unsure.tokens, unsure.parents) == (ref.tokens, ref.parents)


def test_drafter_agreement_keeps_the_higher_score():
    lp, ids = drafts()
    copy = [int(ids[0, 1])]  # the drafter's second guess at depth 1
    t = build_hybrid(7, lp, ids, copy, 3, math.log(1e-9))
    i = t.tokens.index(copy[0])
    assert t.logprobs[i] == pytest.approx(lp[0, 1])  # scored by the drafter, not the tiny rate


# ---------------------------------------------------------------- greedy == ar
def prompts(n=16, seed=0):
    """Half random, half repetitive (so n-gram drafts are proposed and accepted)."""
    return repetitive_prompts(n, seed)


def run(models, cfgs, ps, batch, max_tokens=24):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ar", max_batch_size=batch, max_model_len=160))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [eng.add_request(p, params, **cfgs[i % len(cfgs)]) for i, p in enumerate(ps)]
    while eng.has_work():
        eng.step()
    assert eng.blocks.free_slots == batch and not eng.proposers["hybrid"].rate  # state released
    return [s.output_ids for s in seqs], [t for s in seqs for t in s.metrics.accept_lengths], eng


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_hybrid_equals_ar(models, batch):
    ps = prompts()
    ref, _, _ = run(models, [dict(method="ar")], ps, batch=1)
    for opts in (dict(budget=1), dict(budget=8), dict(budget=32, max_ngram=2, min_ngram=2, block_size=5)):
        out, taus, _ = run(models, [dict(method="hybrid", **opts)], ps, batch=batch)
        assert out == ref, opts
        assert sum(taus) == sum(len(o) for o in out) - len(out)
    assert max(taus) > 1


def test_mixed_methods_in_one_batch_equal_ar(models):
    ps = prompts(20, seed=3)
    ref, _, _ = run(models, [dict(method="ar")], ps, batch=1)
    cfgs = [dict(method="ar"), dict(method="ngram"), dict(method="dflash", block_size=5),
            dict(method="ddtree", budget=8), dict(method="hybrid", budget=8)]
    out, _, eng = run(models, cfgs, ps, batch=8)
    assert out == ref
    assert eng.stats.seqs_in_forwards > eng.stats.forwards


def test_the_copy_rate_is_calibrated_from_committed_rounds(models):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="hybrid", budget=8, max_model_len=160))
    s = eng.add_request([5, 6, 7, 8] * 6, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    seen = []
    while eng.has_work():
        eng.step()
        seen.append(eng.proposers["hybrid"].rate.get(s))
    hits, trials = seen[-2]  # the last round before the sequence left
    assert trials >= 3 and 1 <= hits <= trials  # its output repeats itself: copies were tried and accepted
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(seen, seen[1:-1]))  # counts only grow
    assert seen[-1] is None  # released with the sequence


# ---------------------------------------------------------------- sampled output is exact
@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=3)


PROMPT = [1, 2, 3, 3, 1, 7, 6, 1, 2, 3]  # as test_ngram: the copied chain is often accepted


def test_hybrid_samples_match_exact_distribution(pair):
    cell = check_cell(*pair, PROMPT, Cell("hybrid", 4, SamplingParams(temperature=1.0, top_k=5), 20000))
    assert cell.passed, (cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)
    assert cell.mean_accept_length > 1.2


def test_a_wrong_verifier_is_caught_on_hybrid_trees(pair):
    cell = check_cell(*pair, PROMPT, Cell("hybrid", 4, SamplingParams(temperature=1.0, top_k=5), 20000),
                      patch=NEGATIVE_CONTROLS["temperature_x1.1"])
    assert cell.drafts_verified and cell.rejected() and not cell.passed
    assert cell.p_value < 1e-6, (cell.p_value, cell.tv, cell.tv_limit)


def test_flashtree_verify_covers_the_copying_methods(capsys, tmp_path):
    import json

    from flashtree.cli import main
    out = tmp_path / "verify.json"
    rc = main(["verify", "--methods", "ngram,hybrid", "--samples", "5000", "--temperatures", "1.0",
               "--filters", "top_k", "--drafts", "model", "--json", str(out)])
    rep = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert [r["cell"].split(" ")[0] for r in rep["tiny_pair"]] == ["ngram", "hybrid/6"]
    assert all(r["passed"] and r["mean_accept_length"] > 1 for r in rep["tiny_pair"])
    assert {(r["control"], r["cell"].split(" ")[0]) for r in rep["negative_controls"] if r["caught"]} == \
        {(c, m) for c in ("temperature_x1.1", "greedy_walk_sampled_bonus") for m in ("ngram", "hybrid/6")}


def test_one_drafter_pass_per_round_for_all_drafter_methods(models):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ar", max_batch_size=4, max_model_len=160))
    calls, real = [], eng.drafts.source
    eng.drafts.source = lambda seqs: calls.append(sorted(s.method for s in seqs)) or real(seqs)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for m in ("dflash", "ddtree", "hybrid", "ngram"):
        eng.add_request([3, 4, 5, 3, 4], params, method=m)
    eng.step()
    assert calls == [["ddtree", "dflash", "hybrid"]]  # one pass for the three; ngram needs none
