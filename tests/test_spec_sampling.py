"""Sampled speculative decoding has exactly the target's distribution (and the check can fail).

A V=8 target's distribution over its first 4 generated tokens — the prefill token and every draw
of the first round of a block-3 drafter: root, depth 1, and the bonus after a full accept — is
enumerated exactly; 20,000 seeded dflash / ddtree runs (each generating past the counted tokens)
must match it
(chi-square p > 0.001 with small cells pooled, a total-variation distance within that of an
equally sized direct sample plus a small margin, and mean accept length > 1). Drafts come from
the pair's random drafter ("model") or, where that drafter's argmax chain is almost never
accepted (dflash), from the target's own greedy continuation ("target": lossless, accepted
often). The default run covers ddtree at T in {0.7, 1.0, 1.5} with all filters off and all on,
dflash with all filters on, and top-p alone and min-p alone for both methods; `-m slow` adds the
rest of the grid. Negative controls: verify draws 10 % off in temperature and a greedy walk with
a sampled bonus, each for ddtree and dflash, and a run in which no draft is ever verified (the
mean-tau guard).
"""
from dataclasses import replace

import pytest

from flashtree import SamplingParams
from flashtree.measure.exactness import (
    NEGATIVE_CONTROLS,
    P_MIN,
    Cell,
    check_cell,
    compare_with_plain,
    exact_distribution,
    grid,
    tiny_pair,
    total_variation,
)
from helpers import pin

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=3)


def run(pair, cell, patch=None):
    return check_cell(*pair, PROMPT, cell, patch=patch)  # counts block_size + 1 = 4 tokens


DDTREE, DFLASH = (("ddtree", 6),), (("dflash", None),)
DEFAULT = (grid(filters=("none", "all"), methods=DDTREE)
           + grid(temperatures=(0.7, 1.0), filters=("all",), methods=DFLASH, drafts=("target",))
           + grid(temperatures=(1.5,), filters=("all",), methods=DFLASH)
           + [c for t, f in ((1.5, "min_p"), (1.0, "top_p"))
              for c in grid((t,), (f,), DDTREE) + grid((t,), (f,), DFLASH, drafts=("target",))])
SLOW = [c for c in grid(methods=DDTREE, drafts=("model", "target")) + grid(methods=DFLASH, drafts=("target",))
        if c.label() not in {d.label() for d in DEFAULT}]


@pytest.mark.parametrize("cell", DEFAULT, ids=Cell.label)
def test_speculative_samples_match_exact_distribution(pair, cell):
    run(pair, cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)
    weak = cell.method == "dflash" and cell.drafts == "model"  # its argmax chain is rarely accepted
    assert cell.mean_accept_length > (1.0 if weak else 1.2)  # drafts were verified and accepted


@pytest.mark.parametrize("temperature, top_p, min_p", sorted({(c.params.temperature, c.params.top_p, c.params.min_p)
                                                        for c in DEFAULT if c.params.top_k == 0
                                                        and (c.params.top_p < 1) != (c.params.min_p > 0)}))
def test_single_filter_cells_really_filter(pair, temperature, top_p, min_p):
    """A top-p-only or min-p-only cell must change the distribution, or it tests nothing new."""
    p = SamplingParams(temperature=temperature, top_p=top_p, min_p=min_p)
    unfiltered = exact_distribution(pair[0], PROMPT, SamplingParams(temperature=p.temperature), 4)
    filtered = exact_distribution(pair[0], PROMPT, p, 4)
    assert len(filtered) < len(unfiltered)  # some sequences became impossible
    assert total_variation({k: v * 10 ** 6 for k, v in filtered.items()}, unfiltered, 10 ** 6) > 0.05


@pytest.mark.slow
@pytest.mark.parametrize("cell", SLOW, ids=Cell.label)
def test_each_filter_alone_matches_exact_distribution(pair, cell):
    run(pair, cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)


COMPILED = [Cell("ddtree", 6, SamplingParams(temperature=1.0, top_k=5, top_p=0.9), 20000, compile=True),
            Cell("dflash", None, SamplingParams(temperature=0.7, min_p=0.05), 20000, "target", compile=True)]


PAGED = [Cell("ddtree", 6, SamplingParams(temperature=1.0, top_k=5, top_p=0.9), 20000, page_size=2),
         Cell("dflash", None, SamplingParams(temperature=1.5, top_k=4, top_p=0.9, min_p=0.05), 20000, page_size=2)]


@pytest.mark.parametrize("cell", PAGED, ids=lambda c: c.label() + " page_size=2")
def test_samples_through_shared_prefix_pages_match_exact_distribution(pair, cell):
    """Two-token pages: every run admitted after the first batch reads the prompt's first page
    (target and drafter rows) from the prefix cache, and its tree writes cross page boundaries.
    The pair's own drafter runs (target-built drafts would leave its context rows unwritten, and
    then no drafter-based request may reuse the pages)."""
    run(pair, cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)
    assert cell.prefix_hit_tokens >= 2 * (cell.n - 512)  # all but the first batch of 512 hit
    assert cell.mean_accept_length > (1.0 if cell.method == "dflash" else 1.2)


@pytest.mark.parametrize("cell", COMPILED, ids=Cell.label)
def test_compiled_runner_samples_match_exact_distribution(pair, cell):
    """The same check with the model runner compiled (torch.compile): exactness holds in that mode too."""
    run(pair, cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)
    assert cell.mean_accept_length > 1.2


@pytest.mark.parametrize("method, budget, drafts", [("ddtree", 6, "model"), ("dflash", None, "target")])
def test_a_wrong_verifier_is_caught_when_compiled(pair, method, budget, drafts):
    cell = run(pair, Cell(method, budget, SamplingParams(temperature=1.0, top_k=5), 20000, drafts, compile=True),
               patch=NEGATIVE_CONTROLS["temperature_x1.1"])
    assert cell.drafts_verified and cell.rejected() and not cell.passed
    assert cell.p_value < 1e-6, (cell.p_value, cell.tv, cell.tv_limit)


@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
@pytest.mark.parametrize("method, budget, drafts", [("ddtree", 6, "model"), ("dflash", None, "target")])
def test_a_wrong_verifier_is_caught(pair, name, method, budget, drafts):
    """x1.1 temperature in the verify draws is subtle (TV ~0.05), yet the chi-square rejects it."""
    cell = run(pair, Cell(method, budget, SamplingParams(temperature=1.0, top_k=5), 20000, drafts),
               patch=NEGATIVE_CONTROLS[name])
    assert cell.drafts_verified and cell.rejected() and not cell.passed
    assert cell.p_value < 1e-6, (cell.p_value, cell.tv, cell.tv_limit)


def test_a_check_that_verifies_no_draft_fails(pair):
    """Exact samples, but from plain decoding (no drafter pass, tau = 1): the guard fails the cell."""
    def no_drafts(engine):
        engine.drafts.source = lambda batch: {}

    cell = run(pair, Cell("ddtree", 6, SamplingParams(temperature=1.0), 3000), patch=no_drafts)
    assert cell.mean_accept_length == 1.0
    assert cell.p_value > P_MIN and cell.tv <= cell.tv_limit  # the statistics alone would pass
    assert not cell.passed and not cell.rejected()


def test_greedy_is_a_point_mass(pair):
    cell = run(pair, Cell("ddtree", 6, SamplingParams(temperature=0.0), 200))
    assert cell.passed and cell.tv == 0.0


def test_real_pair_comparison_verifies_drafts(tiny_pair):
    """`flashtree verify --pair`: runs generate past the counted tokens, and a row is failed unless
    drafts were verified (with max_tokens == n_tokens, as before, no draft ever is)."""
    from flashtree import LLM
    llm = LLM(model=tiny_pair[0], draft=tiny_pair[1], device="cpu", max_batch_size=64)
    rows = compare_with_plain(llm, n=300, prompts=["t5 t6 t7"], n_tokens=2, budget=8, methods=("dflash", "ddtree"))
    assert [r["method"] for r in rows] == ["dflash", "ddtree"]
    for r in rows:
        assert r["max_tokens"] == 2 + 8 and r["mean_accept_length"] > 1 and r["p_value"] > P_MIN and r["passed"], r
    old = compare_with_plain(llm, n=300, prompts=["t5 t6 t7"], n_tokens=2, budget=8, max_tokens=2,
                             methods=("dflash", "ddtree"))
    for r in old:
        assert r["mean_accept_length"] == 1.0 and r["p_value"] > P_MIN and not r["passed"], r


@pytest.mark.parametrize("batch", [1, 12])
def test_seeded_speculation_commits_seeded_plain_decodings_tokens(pair, batch):
    """Every output position has its own uniform (`sampling.Uniforms`), so a seeded sampled request
    commits plain decoding's seeded tokens, token for token, whatever method, budget or batch drafts
    them — the strongest form of "lossless": the same sample, not only the same distribution."""
    from flashtree.engine.engine import Engine, EngineConfig
    target, drafter = pair
    params = [SamplingParams(temperature=1.0, top_k=6, top_p=0.95, min_p=0.02, max_tokens=14, ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.8, max_tokens=14, ignore_eos=True)]

    def outputs(method, budget):
        eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=batch,
                                                   max_model_len=32, max_budget=32))
        if budget == "auto" or method == "ngram":  # pinned costs (a wide tree almost free): the choices of auto
            # and of ngram (which copies only what pays under the costs) do not hang on this machine's timings
            pin(lambda b, t: 1e-3 * (1 + 0.001 * t), draft=1e-5)(eng)
        seqs = [eng.add_request(PROMPT[:1 + i % 3], replace(params[i % 2], seed=100 + i))
                for i in range(24)]
        while eng.has_work():
            eng.step()
        taus = [t for s in seqs for t in s.metrics.accept_lengths]
        return [s.output_ids for s in seqs], sum(taus) / len(taus)

    plain, _ = outputs("ar", None)
    assert len({tuple(o) for o in plain}) == 24  # the seeds really sample different outputs
    for method, budget in [("dflash", None), ("ddtree", 1), ("ddtree", 6), ("ddtree", 24), ("ddtree", "auto"),
                           ("hybrid", "auto"), ("ngram", None)]:
        out, tau = outputs(method, budget)
        assert out == plain, (method, budget)
        # drafts were accepted, so the identity was tested (the random drafter's argmax chain, which
        # dflash and a 1-node tree verify, is accepted least; auto, on costs where a tree is almost
        # free, drafts most rounds: τ 1.2-1.9 here)
        wide = isinstance(budget, int) and budget > 1 or budget == "auto" or method == "ngram"
        assert tau > (1.1 if wide else 1.0), (method, budget, tau)
