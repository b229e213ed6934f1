"""budget="auto": calibrated acceptance, measured costs, the per-round choice, and that decoding
with it stays exact (greedy == plain; sampled output matches the target's distribution, and a
wrong verifier is still caught) — plus its surface: bad values, metrics, the server and the CLI."""
import argparse
import json
import math
import re

import httpx
import numpy as np
import pytest

from flashtree import LLM, SamplingParams
from flashtree.cli import main
from flashtree.commands.generate import budget_arg
from flashtree.engine.engine import Engine, EngineConfig, RequestError
from flashtree.engine.round import RoundTimes
from flashtree.errors import UserError
from flashtree.measure.exactness import (
    NEGATIVE_CONTROLS,
    Cell,
    check_cell,
    target_drafts,
    tiny_pair,
)
from flashtree.server.app import create_app
from flashtree.speculative.calibration import (
    BIN_CENTRES,
    Calibration,
    path_logprobs,
    tau_curve,
)
from flashtree.speculative.costs import CostTable, choose_tokens
from flashtree.speculative.hybrid import build_hybrid
from flashtree.speculative.tree import build_ddtree, prefix
from helpers import cost_table as table
from helpers import pin, repetitive_prompts
from serving import Running, metric
from test_spec_greedy import (
    prompts,  # the same random prompts as the fixed-budget greedy checks
)


def drafts(L=4, K=6, seed=0, V=50):
    rng = np.random.default_rng(seed)
    lp = np.sort(np.log(rng.dirichlet(np.ones(V) * 0.3, size=L)), axis=1)[:, ::-1][:, :K].copy()
    ids = np.stack([rng.permutation(V)[:K] for _ in range(L)])
    return lp, ids


# ------------------------------------------------------------------------------- calibration
def test_calibration_prior_is_the_draft_probability():
    cal = Calibration()
    assert np.allclose(cal.rate(BIN_CENTRES), np.exp(BIN_CENTRES))  # no evidence: trust the drafter
    lps = np.linspace(-9, 0, 40)
    assert np.all(np.diff(cal.rate(lps)) >= 0)  # likelier paths are accepted more often


def test_calibration_learns_the_observed_frequency():
    cal, rng = Calibration(), np.random.default_rng(0)
    lp = np.full(400, -0.3)           # a bin whose draft probability is ~0.76
    seen = rng.random(400) < 0.2      # ... but only 20 % of its nodes are accepted
    before = float(cal.rate([-0.3])[0])
    for i in range(0, 400, 40):       # rounds of 40 nodes
        cal = cal.updated(lp[i:i + 40], seen[i:i + 40])
    after = float(cal.rate([-0.3])[0])
    assert before > 0.7 and abs(after - seen.mean()) < 0.02
    assert float(cal.rate([-5.0])[0]) == pytest.approx(math.exp(BIN_CENTRES[1]))  # other bins untouched


def test_calibration_bins_hold_their_upper_edge():
    """bin i holds BIN_EDGES[i-1] < lp <= BIN_EDGES[i]: an edge value falls in the bin below it."""
    edges = np.array([-6.0, -4.0, -0.15])
    assert Calibration.bins(edges).tolist() == [0, 1, 8]
    assert Calibration.bins(edges + 1e-9).tolist() == [1, 2, 9]
    assert Calibration.bins(np.array([-50.0, 0.0])).tolist() == [0, 9]


def test_tau_curve_starts_at_one_and_grows():
    lp, ids = drafts()
    tree = build_ddtree(7, lp, ids, 20)
    cal = Calibration()
    curve = np.array(tau_curve(path_logprobs(tree)[1:], cal))
    assert len(curve) == tree.size and curve[0] == 1.0 and np.all(np.diff(curve) >= 0)
    assert curve[-1] < 1 + (tree.size - 1)
    cal = cal.updated(path_logprobs(tree)[1:], np.zeros(tree.size - 1, dtype=bool))  # nothing accepted
    assert np.all(np.array(tau_curve(path_logprobs(tree)[1:], cal))[1:] < curve[1:])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_prefix_of_a_best_first_tree_is_the_smaller_budget_tree(seed):
    """Cutting an auto round's tree to N nodes verifies exactly what budget N would have built."""
    lp, ids = drafts(seed=seed)
    big = build_ddtree(7, lp, ids, 30)
    for n in (0, 1, 5, 17, 30):
        assert prefix(big, n) == build_ddtree(7, lp, ids, n)
    copy = [int(ids[0, 2]), int(ids[1, 0]), 3, 4]
    big = build_hybrid(7, lp, ids, copy, 30, math.log(0.4))
    for n in (1, 3, 9, 30):
        assert prefix(big, n) == build_hybrid(7, lp, ids, copy, n, math.log(0.4))


# ------------------------------------------------------------------------------------- costs
def test_cost_table_interpolates_and_extrapolates():
    c = CostTable()
    assert c.verify(1, 4) is None and c.draft(1) is None
    for t, s in ((1, 1.0), (4, 2.0), (8, 4.0)):
        c.record_verify(1, t, s)
    assert c.verify(1, 4) == 2.0
    assert c.verify(1, 2) == pytest.approx(1 + 1 / 3)       # between measured widths
    assert c.verify(1, 16) == pytest.approx(8.0)             # beyond: the last segment's slope
    assert c.verify(2, 4) == pytest.approx(4.0)              # unseen batch: batch 1 at the same total tokens
    c.record_verify(2, 1, 1.5)                               # one point at batch 2 sets its level
    assert c.verify(2, 4) == pytest.approx(4.0 * 1.5 / c.verify(1, 2))
    c.record_verify(1, 1, 0.5)
    assert c.verify(1, 1) == pytest.approx(0.8 * 1.0 + 0.2 * 0.5)  # an EMA of measurements
    c.record_verify(1, 1, 9.0)                               # a spike counts as 1.25x the estimate
    assert c.verify(1, 1) == pytest.approx(0.9 + 0.2 * 0.25 * 0.9)
    c.record_draft(1, 0.5)
    assert c.draft(4) == pytest.approx(2.0)                  # one point: proportional
    # an array of widths reads the same line as each width alone, on both sides of the points
    ws = np.array([1, 2, 3, 4, 6, 8, 12, 16, 40])
    assert np.allclose(c.verify(1, ws), [c.verify(1, int(w)) for w in ws])
    c.record_verify(3, 2, 1.0)
    c.record_verify(3, 5, 2.5)
    assert c.verify(3, 1) == pytest.approx(0.5) and c.verify(3, 9) == pytest.approx(4.5)  # extended below and above


def test_round_costs_follow_every_record():
    """A round's cost curve is kept between records (a verdict and a fit read it several times) and
    follows each new measurement: of the forward, the walk and the overhead."""
    c = CostTable()
    assert c.round_cost(1, 1) is None
    for t in (1, 2, 4, 8):
        c.record_verify(1, t, 1e-3 * t)
    assert c.round_cost(1, 8) == pytest.approx(8e-3)
    assert np.allclose(c.round_cost(1, np.arange(1, 9)), 1e-3 * np.arange(1, 9))
    assert c.round_cost(1, 40) == pytest.approx(40e-3)      # wider than the curve so far: extended
    c.record_verify(1, 8, 9e-3)                              # EMA: 0.8 * 8 + 0.2 * 9 = 8.2 ms
    assert c.round_cost(1, 8) == pytest.approx(8.2e-3)
    c.observe(1, 1, 0, RoundTimes(verify_forward=1e-3, verify_walk=0.2e-3), seconds=1.5e-3)  # a plain round
    assert c.round_cost(1, 1) == pytest.approx(1e-3 + 0.2e-3 + 0.3e-3)
    assert c.round_cost(1, 2) == pytest.approx(2e-3 + 0.2e-3 + 0.3e-3)  # until a wide round is measured
    c.observe(1, 4, 1, RoundTimes(verify_forward=4e-3, draft=1e-3, verify_walk=0.5e-3), seconds=6.5e-3)
    assert c.round_cost(1, 4) == pytest.approx(4e-3 + 0.5e-3 + 1e-3)  # walk 0.2 + 3 rows x 0.1; overhead 1
    assert c.round_cost(1, 1) == pytest.approx(1.5e-3)


def test_seeded_widths_no_round_measures_follow_the_drift_of_those_rounds_do():
    """A table seeded while the machine ran 1.5x slower than it does for the rounds: the widths
    the rounds use converge to their own costs, and the seeded widths they never use follow
    the same clock (seed x drift), so the choice between narrow and wide trees reads one machine.
    Other batches are untouched; a late seed moves no width a round measured."""
    c = CostTable()
    seeds = {1: 15e-3, 2: 16.5e-3, 4: 18e-3, 8: 24e-3, 16: 36e-3}
    for t, s in seeds.items():
        c.seed_verify(1, t, s)
    c.seed_verify(4, 1, 30e-3)
    assert c.verify(1, 8) == pytest.approx(24e-3) and c.drift == {}
    for _ in range(60):                     # rounds at widths 1 and 4 only, 1.5x faster than seeded
        c.record_verify(1, 1, 10e-3)
        c.record_verify(1, 4, 12e-3)
    assert c.drift[1] == pytest.approx(1 / 1.5, rel=1e-3)
    assert c.verify(1, 1) == pytest.approx(10e-3, rel=1e-3) and c.verify(1, 4) == pytest.approx(12e-3, rel=1e-3)
    assert c.verify(1, 8) == pytest.approx(16e-3, rel=1e-3) and c.verify(1, 16) == pytest.approx(24e-3, rel=1e-3)
    assert c.verify(1, 2) == pytest.approx(11e-3, rel=1e-3)  # seeded, never a round's width: follows too
    assert c.verify(4, 1) == 30e-3 and 4 not in c.drift     # another batch: its own seeds, its own rounds
    c.seed_verify(1, 4, 99e-3)               # a late seed never moves a width a round measured
    assert c.verify(1, 4) == pytest.approx(12e-3, rel=1e-3) and c.verify(1, 1) == pytest.approx(10e-3, rel=1e-3)
    c.record_draft(1, 2e-3)
    c.seed_draft(1, 9e-3)                    # nor a drafter pass a round measured; an unmeasured batch's it sets
    c.seed_draft(4, 5e-3)
    assert c.draft_s == {1: 2e-3, 4: 5e-3}


def test_a_width_measured_long_ago_follows_the_machine_and_a_spike_barely_moves_it():
    """Rounds at widths 4 and 8, then the machine slows 1.4x and only width 4 runs: width 8 is
    priced on today's clock, not at what it cost then (a per-width EMA would keep it 29 % low).
    One 3x spike moves a width by a few percent, and the rounds after it take that back."""
    true = {1: 10e-3, 2: 11e-3, 4: 12e-3, 8: 16e-3, 16: 24e-3}
    c = CostTable()
    for t, s in true.items():
        c.seed_verify(1, t, 1.5 * s)
    for _ in range(60):
        for t in (4, 8):
            c.record_verify(1, t, true[t])
    assert c.verify(1, 8) == pytest.approx(16e-3, rel=1e-2)
    for _ in range(60):
        c.record_verify(1, 4, 1.4 * true[4])
    assert c.verify(1, 4) == pytest.approx(1.4 * 12e-3, rel=1e-2)
    assert c.verify(1, 8) == pytest.approx(1.4 * 16e-3, rel=0.04)
    assert c.verify(1, 16) == pytest.approx(1.4 * 24e-3, rel=0.04)
    before = c.verify(1, 8)
    c.record_verify(1, 8, 3 * before)        # another process took the core for one forward
    assert 1.0 < c.verify(1, 8) / before < 1.08
    for _ in range(30):
        c.record_verify(1, 4, 1.4 * true[4])
    assert c.verify(1, 8) == pytest.approx(1.4 * 16e-3, rel=0.04)
    unseeded = CostTable()                   # without seeds, each width its own EMA: a spike, clipped
    unseeded.record_verify(2, 8, 16e-3)
    unseeded.record_verify(2, 8, 160e-3)
    assert unseeded.verify(2, 8) == pytest.approx(16e-3 * (1 + 0.2 * 0.25))
    unseeded.record_draft(2, 0.0)            # an estimate of 0 (a pinned table's) still learns
    unseeded.record_draft(2, 1e-3)
    assert unseeded.draft(2) == pytest.approx(0.2e-3)


def test_seeds_after_rounds_keep_their_prices_and_start_the_clock_where_they_run():
    """A busy engine's batch size: rounds measured widths 1 and 2 before its seeds came, the
    seeds timed 1.4x faster (a short dummy context). The measured widths keep their prices; the
    widths only the seeds know start on the rounds' clock (1.4x), not at the bare seeds."""
    true = {1: 14e-3, 2: 16e-3, 4: 21e-3, 8: 35e-3}
    c = CostTable()
    for _ in range(20):
        c.record_verify(8, 1, true[1])
        c.record_verify(8, 2, true[2])
    for t, s in true.items():
        c.seed_verify(8, t, s / 1.4)
    assert c.verify(8, 1) == pytest.approx(true[1]) and c.verify(8, 2) == pytest.approx(true[2])
    assert c.drift[8] == pytest.approx(1.4)
    assert c.verify(8, 4) == pytest.approx(true[4]) and c.verify(8, 8) == pytest.approx(true[8])
    for _ in range(40):                      # then rounds go on at width 2: nothing moves
        c.record_verify(8, 2, true[2])
    assert c.verify(8, 8) == pytest.approx(true[8], rel=1e-3)


def test_a_stale_seed_no_longer_shrinks_auto_trees():
    """The choice itself: seeded 1.5x slow and refreshed only at the narrow widths in use, the
    table without the drift would price a wide tree at its stale seed and choose a narrower one
    than the same machine's true costs choose; with the drift it chooses as the true costs do."""
    true = {1: 10e-3, 2: 11e-3, 4: 12e-3, 8: 16e-3, 16: 24e-3}
    curve = [[0.9, 1.7, 2.4, 3.0, 3.5, 3.9, 4.2, 4.45, 4.65, 4.8, 4.9, 5.0, 5.05, 5.1, 5.12, 5.14]]
    exact = CostTable()
    for t, s in true.items():
        exact.record_verify(1, t, s)
    drifting = CostTable()
    for t, s in true.items():
        drifting.seed_verify(1, t, 1.5 * s)
    for _ in range(60):
        for t in (1, 4):
            drifting.record_verify(1, t, true[t])
    best = choose_tokens(curve, exact, 1, 2e-3)
    assert best > 5 and choose_tokens(curve, drifting, 1, 2e-3) == best
    stale = CostTable()                      # the same history with the seeds kept as they were
    for t, s in true.items():
        stale.record_verify(1, t, 1.5 * s)
    for _ in range(60):
        for t in (1, 4):
            stale.record_verify(1, t, true[t])
    assert choose_tokens(curve, stale, 1, 2e-3) < best


def test_a_round_of_ngram_chains_alone_is_no_drafter_pass(models):
    """n-gram chains need no drafter pass: rounds in which only they drafted record no drafter
    cost (counted as a pass, their lookups' ~0.2 ms went into the table as the pass's cost, and
    an auto request joining later would draft on it)."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ngram", max_batch_size=4, max_model_len=128))
    # a flat verify cost, still learning (every chain is worth verifying whole), and a drafter pass's
    eng.adaptive.costs = costs = table(lambda b, t: 1e-3, batches=(4,), widths=(1, 2, 4, 8, 16), draft=2e-3)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seqs = [eng.add_request(p, params) for p in repetitive_prompts(8)]
    while eng.has_work():
        eng.step()
    assert sum(t > 1 for s in seqs for t in s.metrics.accept_lengths) > 5  # chains drafted and accepted
    assert len(costs.verify_s) > 5 and costs.draft_s[4] == 2e-3  # rounds timed; no drafter pass among them
                                                                  # (the seeder's passes set other batch sizes)


def test_a_drafter_pass_that_catches_up_on_a_long_context_is_not_the_drafters_cost(models):
    """A drafting round after plain rounds feeds the drafter every row since: a one-off the next
    drafting round does not pay, so it does not set the drafter's cost; the steady round after
    it does. (Counted, a probe at C=1 made the drafter look 2-4x dearer than it is and kept auto
    plain.) Neither does an engine's first pass at a batch size (a cold call); the prompt's rows
    go to the drafter at prefill, so the second round's pass is steady."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget=8, max_batch_size=1, max_model_len=128))
    s = eng.add_request(list(range(1, 41)), SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    costs = eng.adaptive.costs
    eng.step()  # the prefill, then a round with the engine's first drafter pass
    assert s.metrics.rounds == 1 and costs.verify_s and not costs.draft_s
    eng.step()  # at most block_size rows since: a steady pass
    assert s.metrics.rounds == 2 and list(costs.draft_s) == [1]
    c = CostTable()
    c.observe(1, 9, 1, RoundTimes(verify_forward=2e-3, draft=0.1), 0.103)  # a cold first pass
    assert not c.draft_s
    c.observe(1, 9, 1, RoundTimes(verify_forward=2e-3, draft=5e-3), 8e-3, caught_up=32)
    assert not c.draft_s and c.context_row_s is None  # no steady pass to compare it with yet
    c.observe(1, 9, 1, RoundTimes(verify_forward=2e-3, draft=1e-3), 4e-3)
    assert c.draft_s == {1: 1e-3} and c.overhead_s == {(1, True): pytest.approx(1e-3)}  # (its rest still counts)
    # a later catch-up: what it cost beyond a steady pass, per row
    c.observe(1, 9, 1, RoundTimes(verify_forward=2e-3, draft=4e-3, tree=1e-3), 8e-3, caught_up=100)
    assert c.draft_s == {1: 1e-3} and c.context_row_s == pytest.approx(4e-5)
    assert c.catch_up(50) == pytest.approx(2e-3) and c.catch_up(0) == 0.0 and CostTable().catch_up(50) == 0.0


def test_the_catch_up_price_weighs_each_pass_by_its_rows():
    """A catch-up of 2 rows whose excess is the steady pass's timing noise (5 ms) does not set
    the price of a row: the price is total excess over total rows (EMAs of both), so 400 rows
    caught up at 0.05 ms each bring it within 2x of that, where an EMA of per-pass prices would
    stay at ~2 ms a row. A pass that ran faster than a steady one lowers it; it never goes below 0."""
    c = CostTable()
    c.record_catch_up(2, 5e-3)
    assert c.context_row_s == pytest.approx(2.5e-3)
    c.record_catch_up(400, 400 * 5e-5)
    assert 5e-5 < c.context_row_s < 1e-4  # (0.8 * 5 + 0.2 * 20 ms) / (0.8 * 2 + 0.2 * 400 rows)
    before = c.context_row_s
    c.record_catch_up(10, -1e-3)
    assert 0 < c.context_row_s < before
    d = CostTable()
    d.record_catch_up(3, -2e-3)
    assert d.context_row_s == 0.0 and d.catch_up(100) == 0.0


def test_drafting_rounds_that_ran_over_their_price_raise_the_price_of_the_next():
    """A batch size's steady drafting rounds that take longer than their predicted cost (verify +
    walk + overhead at their width, and the drafter pass) teach the table a factor that the next
    drafting round's price is multiplied by, so a round predicted to beat plain decoding by a few
    percent no longer drafts where such rounds have run 10 % over. Plain rounds, a batch size's
    first (cold) drafter pass and a pass that caught up on context rows teach nothing; another
    batch size keeps its own factor."""
    from flashtree.speculative.costs import drafting_pays
    c = table(lambda b, t: 1e-3 * (1 + 0.25 * (t - 1)), batches=(1, 8), draft=1e-3)
    predicted = c.round_cost(8, 4) + c.draft(8)
    c.observe(8, 1, 0, RoundTimes(verify_forward=1e-3), 3e-3)                          # plain
    c.observe(8, 4, 8, RoundTimes(verify_forward=1.75e-3, draft=1e-3), 10 * predicted)  # cold first pass
    c.observe(8, 4, 8, RoundTimes(verify_forward=1.75e-3, draft=1e-3), 2 * predicted, caught_up=50)
    assert c.error(8) == 1.0 and c.wide_error == {}
    c.observe(1, 4, 1, RoundTimes(verify_forward=1.75e-3, draft=1e-3), 10 * predicted)  # batch 1's cold pass
    for _ in range(30):
        c.observe(8, 4, 8, RoundTimes(verify_forward=1.75e-3, draft=1e-3), 1.1 * (c.round_cost(8, 4) + c.draft(8)))
        c.observe(1, 4, 1, RoundTimes(verify_forward=1.75e-3, draft=1e-3), c.round_cost(1, 4) + c.draft(1))
    assert 1.05 < c.error(8) < 1.15 and c.error(1) == pytest.approx(1.0)
    assert c.priced(8, 4, 1.0) == c.error(8) and c.priced(8, 1, 1.0) == 1.0  # a plain width is not corrected
    # a curve worth 1.05x plain decoding's rate at width 4 before: not once its rounds run 10 % over
    c2 = table(lambda b, t: 1e-3 * (1 + 0.25 * (t - 1)), batches=(8,), draft=1e-3, learn=False)
    plain_rate = 8 / c2.round_cost(8, 1)
    per_seq = 1.05 * plain_rate * (c2.round_cost(8, 4) + 1e-3) / 8   # tokens a sequence must commit at T=4
    curve = np.array([1.0, per_seq - 1, per_seq - 0.5, per_seq])  # E[tau | N nodes], N = 0..3: best at T=4
    assert drafting_pays([curve] * 8, c2, 8, 1e-3)
    c2.wide_error[8] = 1.1
    assert not drafting_pays([curve] * 8, c2, 8, 1e-3)


def test_a_drafting_round_that_must_catch_up_is_charged_for_it():
    """The context rows a drafter pass would first feed (what its sequences decoded plainly since
    they last drafted) are part of that round's cost: a curve that beats plain decoding with a
    steady pass does not when the pass must catch up first (at C=8 auto re-drafted on stale curves
    at ~2x the cost it predicted), and a probe's break-even is what the probe cost."""
    from flashtree.speculative.adaptive import PROBE_EVERY, AdaptiveBudget, Choice, verdict
    ctl = AdaptiveBudget()
    ctl.costs = table(lambda b, t: 1e-3 * (1 + 0.05 * t), draft=1e-3, learn=False)  # steady round: ~2 plain ones
    ctl.costs.record_catch_up(1, 5e-5)  # a context row at 0.05 ms
    seq = FakeSeq(prompt=[1, 2, 3, 4, 5])
    seq.auto = True
    tree = build_ddtree(0, *drafts(L=4, K=3, seed=1), budget=8)
    choice = Choice(tree.size - 1, 2.0, path_logprobs(tree)[1:])
    for _ in range(20):                                      # a curve whose nodes were all accepted
        ctl.learn(seq, tree, list(range(tree.size)), choice)  # (E[tau] 8.7 at 9 tokens); no probe due
    st = ctl.state(seq, 1)

    def drafts_at(catch_up):
        return verdict([seq], [st], 1, ctl.costs, catch_up, PROBE_EVERY, [True]).draft

    assert drafts_at(0)
    assert drafts_at(20)        # 1 ms more: still pays
    assert not drafts_at(400)   # 20 ms more: plain is faster
    # fit: the round's break-even counts the rows it caught up on
    _, (steady,) = ctl.fit([seq], [tree], 1)
    _, (probe,) = ctl.fit([seq], [tree], 1, caught_up=400)
    plain = ctl.costs.round_cost(1, 1)
    assert probe.break_even == pytest.approx(steady.break_even + 400 * 5e-5 / plain)


def test_choose_tokens_weighs_expected_tokens_against_measured_cost():
    curve = np.concatenate([[1.0], 1 + np.cumsum(np.full(31, 0.5))])  # every node: 50 % acceptance
    steep = table(lambda b, t: 1e-3 * t)                 # each token costs as much as a plain step
    assert choose_tokens([curve], steep, 1, 0.0) == 1
    flat = table(lambda b, t: 1e-3 * (1 + 0.001 * t))    # a wider forward is almost free
    assert choose_tokens([curve], flat, 1, 0.0) == 32    # the whole tree
    middle = table(lambda b, t: 1e-3 * (1 + 0.2 * t))
    saturating = np.concatenate([[1.0], 1 + np.cumsum(0.9 ** np.arange(1, 32))])
    T = choose_tokens([saturating], middle, 1, 2e-4)
    assert 2 < T < 32
    assert choose_tokens([saturating, saturating], middle, 2, 2e-4, floor=T + 3) >= T + 3  # others' trees
    assert choose_tokens([curve], CostTable(), 1, 0.0) == 32  # unmeasured: trust the drafter


# ----------------------------------------------------------------------- exactness with auto
def run(models, method, budget=None, batch=1, ps=(), patch=None):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=batch, max_model_len=128))
    if patch is not None:
        patch(eng)
    seqs = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)) for p in ps]
    while eng.has_work():
        eng.step()
    assert eng.blocks.free_slots == batch and not eng.adaptive.states  # slots and auto state released
    return [s.output_ids for s in seqs], [s.metrics for s in seqs]


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_auto_equals_ar(models, batch):
    """Measured costs on the random pair: whatever it chooses, greedy output is plain decoding's."""
    ps = prompts(12)
    ref, _ = run(models, "ar", ps=ps)
    out, metrics = run(models, "ddtree", "auto", batch=batch, ps=ps)
    assert out == ref
    for m in metrics:
        assert len(m.budgets) == len(m.predicted_taus) == m.rounds > 0
        assert all(0 <= n <= 32 for n in m.budgets) and all(p >= 1.0 for p in m.predicted_taus)


pinned = pin(lambda b, t: 1e-3 * (1 + 0.06 * t))  # a tree pays, but not an arbitrarily wide one


@pytest.mark.parametrize("method, batch", [("ddtree", 1), ("ddtree", 4), ("hybrid", 2)])
def test_greedy_auto_with_accepted_drafts_chooses_and_equals_ar(models, method, batch):
    """Drafts the target agrees with (its own greedy continuation, ranked): auto verifies real
    trees, their sizes vary with the calibrated curves, and the output is still plain decoding's."""
    ps = prompts(8, seed=4)
    ref, _ = run(models, "ar", ps=ps)
    drafts = target_drafts(models[0])
    out, metrics = run(models, method, "auto", batch=batch, ps=ps, patch=lambda eng: (drafts(eng), pinned(eng)))
    assert out == ref
    budgets = [n for m in metrics for n in m.budgets]
    taus = [t for m in metrics for t in m.accept_lengths]
    assert len(budgets) == len(taus) and max(budgets) > 0 and len(set(budgets)) > 2
    assert sum(taus) / len(taus) > 2


def test_flat_costs_verify_whole_trees_and_the_calibration_follows_the_realised_tau(models):
    """A wider forward is free: every drafting round verifies its whole tree (32 nodes). Greedy
    acceptance of the target's own ranked continuation is far above its draft probabilities (the
    prior), so predicted tau tracks the realised one only because the calibration learns."""
    ps = prompts(8, seed=6)
    drafts = target_drafts(models[0])
    flat = pin(lambda b, t: 1e-3)
    _, metrics = run(models, "ddtree", "auto", batch=4, ps=ps, patch=lambda eng: (drafts(eng), flat(eng)))
    budgets = [n for m in metrics for n in m.budgets]
    assert set(budgets) <= {0, 32} and budgets.count(32) > 0.8 * len(budgets)  # 0: the last, depth-0 rounds
    late = [(p, t) for m in metrics for p, t in list(zip(m.predicted_taus, m.accept_lengths))[3:]]
    predicted, realised = (sum(x) / len(x) for x in zip(*late))
    assert realised > 2.5 and abs(predicted - realised) < 0.15 * realised, (predicted, realised)


def drafting_never_pays(models, max_tokens):
    """A greedy auto run whose pinned costs make every extra verified token cost a plain step:
    (its budgets per round, the drafter passes it ran)."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=1, max_model_len=128))
    pin(lambda b, t: 1e-3 * t, draft=1e-3)(eng)
    s = eng.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while eng.has_work():
        eng.step()
    return s.metrics.budgets, eng.runner.shapes["drafter", 1, drafter.config.block_size]


def test_auto_skips_the_drafter_when_plain_decoding_is_predicted_faster(models):
    """After the first (probing) round no tree pays, so rounds are plain (N = 0) except re-probes."""
    budgets, drafter_runs = drafting_never_pays(models, 30)
    assert 1 <= drafter_runs <= len(budgets) / 8 + 1  # the first round, then at most every 8th
    assert budgets.count(0) >= len(budgets) - drafter_runs


def test_probes_back_off_while_drafting_does_not_pay(models):
    """Probes that verify no draft node double the gap to the next one (8, 16, 32, ...): over
    100 plain rounds the drafter runs about 4 times, not 13."""
    budgets, drafter_runs = drafting_never_pays(models, 100)
    assert len(budgets) >= 95 and budgets.count(0) >= len(budgets) - drafter_runs
    assert 2 <= drafter_runs <= 5, drafter_runs


def test_accepted_probes_that_do_not_pay_for_their_round_back_off(models):
    """Drafts the target accepts, but a drafter pass that costs ten plain steps: no probe commits
    enough to pay for its round, so probes back off (8, 16, 32, ...) although every one accepts
    nodes — counting acceptance alone re-probed every 8th round (12 probes here)."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=1, max_model_len=160))
    target_drafts(target)(eng)
    pin(lambda b, t: 1e-3 * (1 + 0.06 * t), draft=10e-3)(eng)
    s = eng.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    while eng.has_work():
        eng.step()
    probes = [t for t, n in zip(s.metrics.accept_lengths, s.metrics.budgets) if n]  # (oracle drafts: no pass to count)
    assert probes and min(probes) > 1  # every probe accepted nodes ...
    assert len(probes) <= 5, s.metrics.budgets  # ... and still they backed off (rounds 0, 16, 48)


def test_a_setting_where_drafting_did_not_pay_starts_the_next_request_plain(models):
    """The first request probes and backs off; the next one of the same setting starts on plain
    rounds at that gap (no drafting round 0), one of another setting still starts by drafting, and
    where drafts pay the next request drafts from its first round."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=1, max_model_len=160))
    pin(lambda b, t: 1e-3 * t, draft=1e-3)(eng)
    greedy = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)

    def request(params, method="ddtree"):
        passes = eng.runner.shapes["drafter", 1, drafter.config.block_size]
        s = eng.add_request([5, 6, 7], params, method=method)
        while eng.has_work():
            eng.step()
        return s.metrics.budgets, eng.runner.shapes["drafter", 1, drafter.config.block_size] - passes

    first, first_passes = request(greedy)
    assert first_passes >= 3  # round 0 and probes after 8 and 16 plain rounds (then 32)
    second, second_passes = request(greedy)
    assert second[0] == 0 and second_passes < first_passes  # plain from round 0
    assert eng.adaptive.starts  # its probes did not pay either: the setting keeps starting plain
    sampled, sampled_passes = request(SamplingParams(temperature=1.0, max_tokens=100, ignore_eos=True))
    assert sampled_passes >= 2  # another setting: it drafts in round 0 and probes afresh (after 8 rounds)

    # where drafts pay, every request drafts from its first round
    target_drafts(target)(eng)
    pinned(eng)
    eng.adaptive.starts.clear()
    for _ in range(2):
        budgets, _ = request(greedy)
        assert budgets[0] > 0
    assert not eng.adaptive.starts


def test_a_request_joining_plain_decoders_of_its_setting_starts_plain(models):
    """A request that arrives while the running ones of its setting all decode plainly starts plain
    on their probe clock (its own first drafting round would draft and verify for the whole batch);
    one of another setting, or one joining a batch that drafts, starts by drafting."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=3, max_model_len=160))
    pin(lambda b, t: 1e-3 * t, draft=1e-3)(eng)  # drafting never pays
    passes = lambda: sum(n for k, n in eng.runner.shapes.items() if k[0] == "drafter")
    greedy = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    first = eng.add_request([5, 6, 7], greedy)
    for _ in range(3):
        eng.step()
    assert first.metrics.budgets[1:] == [0, 0]  # it drafted in round 0, then decodes plainly
    before = passes()
    joined = eng.add_request([8, 9, 10], greedy)
    eng.step()
    assert passes() == before and joined.metrics.budgets == [0]  # no drafting round for the newcomer
    other = eng.add_request([8, 9, 11], SamplingParams(temperature=1.0, max_tokens=60, ignore_eos=True))
    eng.step()
    assert passes() == before + 1  # another setting drafts at once (the drafter runs for the whole batch)
    assert eng.adaptive.state(other).recent


class FakeSeq:
    """What the controller reads of a sequence: its method, sampling, committed tokens and
    round count (the engine counts a round in `metrics.rounds` before `learn`)."""
    def __init__(self, prompt=(5, 6, 7), temperature=0.0):
        from flashtree.engine.sequence import RequestMetrics
        self.method, self.params = "ddtree", SamplingParams(temperature=temperature)
        self.prompt_ids, self.output_ids = list(prompt), []
        self.metrics = RequestMetrics()


def test_a_probe_round_resets_the_gaps_when_it_beats_plain_keeps_them_when_half_paid_else_backs_off():
    """One verdict on the round's mean tau for all its drafting sequences (one drafter pass):
    tau >= break_even resets the gaps, 1 + (break_even - 1) / 2 <= tau < break_even keeps them,
    less doubles them; and a gap after a round that lost is at least its loss in plain rounds
    (break_even - tau) / PROBE_LOSS, so probing costs at most PROBE_LOSS of plain decoding."""
    from dataclasses import replace

    from flashtree.speculative.adaptive import Choice, learned, settled, started
    from flashtree.speculative.probes import PROBE_LOSS
    assert PROBE_LOSS == 0.01
    tree = build_ddtree(0, *drafts(L=3, K=2), budget=6)
    paths = path_logprobs(tree)[1:]
    seq = FakeSeq()
    states = {}

    def probe(seqs_taus, nodes=6, break_even=5.0):  # half-paid: mean tau >= 3; beat: >= 5
        choice = Choice(nodes, 2.5, paths, break_even)
        after = []
        for s, tau in seqs_taus:  # a probe: the round drafts after a plain verdict
            st = replace(states.get(s) or started(s, 1, None), prefers_plain=True)
            after.append(learned(st, tree, list(range(tau)), choice))
        taus = [tau for _, tau in seqs_taus]
        states.update(zip([s for s, _ in seqs_taus], settled(after, taus, break_even, nodes > 0, 8)))

    probe([(seq, 2)])
    assert states[seq].probe_gap is None  # its first drafted round: no verdict (2 < 3 would back off)
    probe([(seq, 2)], break_even=2.05)
    assert states[seq].probe_gap == 8      # half-paid, losing 0.05 plain rounds: kept
    probe([(seq, 1)], break_even=1.1)
    assert states[seq].probe_gap == 16     # accepted nothing: doubled (its loss alone asks for 5)
    probe([(seq, 1)], break_even=1.1)
    assert states[seq].probe_gap == 32
    probe([(seq, 4)])
    assert states[seq].probe_gap == 100    # half-paid, but it lost one plain round: 1 / 0.01
    probe([(seq, 5)])
    assert states[seq].probe_gap is None   # beat plain decoding
    probe([(seq, 1)], nodes=0, break_even=1.1)
    assert states[seq].probe_gap == 16     # verified nothing
    probe([(seq, 1)], nodes=0)
    assert states[seq].probe_gap == 400    # ... and lost four plain rounds
    batch = [FakeSeq() for _ in range(8)]
    probe([(s, 1) for s in batch])  # their first drafted round
    assert all(states[s].probe_gap is None for s in batch)
    probe([(batch[0], 4)] + [(s, 1) for s in batch[1:]], break_even=1.2)  # one of 8 did well: the mean,
    assert all(states[s].probe_gap is None for s in batch)              # 1.375, beats 1.2
    probe([(batch[0], 4)] + [(s, 1) for s in batch[1:]], break_even=3.0)  # mean 1.375 < 2: doubled, and
    assert all(states[s].probe_gap == 163 for s in batch)               # its loss: (3 - 1.375) / 0.01


def test_a_losing_round_of_a_drafting_streak_leaves_the_gap_and_the_verdict_reads_recent_trees():
    """Only a probe (a round drafted after a plain verdict) backs off: a streak's round that loses
    leaves the gap alone, and the next verdict weighs the mean curve of the last RECENT_TREES
    trees, so one unsure tree among sure ones does not send a sequence to plain rounds."""
    from dataclasses import replace

    from flashtree.speculative.adaptive import RECENT_TREES, AdaptiveBudget, Choice, verdict
    from flashtree.speculative.calibration import mean_curve
    ctl = AdaptiveBudget(probe_every=8)
    ctl.costs = table(lambda b, t: 1e-3 * (1 + 0.05 * t), draft=2e-4, learn=False)  # 8 nodes: ~1.65 plain rounds
    ids = np.arange(1, 9).reshape(4, 2)
    sure = build_ddtree(0, np.log([[0.9, 0.05]] * 4), ids, budget=8)    # confident drafts: tau ~4 expected
    unsure = build_ddtree(0, np.log([[0.15, 0.1]] * 4), ids, budget=8)  # flat drafts: little expected
    seq = FakeSeq(prompt=[1, 2, 3])
    seq.auto = True

    def round_(tree, tau, break_even=1.65):
        seq.metrics.rounds += 1
        choice = Choice(tree.size - 1, 2.0, path_logprobs(tree)[1:], break_even)
        ctl.learn(seq, tree, list(range(tau)), choice)
        ctl.settle([(seq, choice, tau)])

    for _ in range(RECENT_TREES - 1):
        round_(sure, 4)
    st = ctl.state(seq, 1)
    assert not st.probed and st.probe_gap is None
    round_(unsure, 1)                       # a streak's round that lost: no back-off
    st = ctl.state(seq, 1)
    assert st.probe_gap is None
    alone = tau_curve(path_logprobs(unsure)[1:], st.calibration)
    assert len(st.recent) == RECENT_TREES and mean_curve(st.recent, st.calibration)[-1] > alone[-1]
    assert ctl.decide([seq], 1)        # the mean of the recent curves still pays ...
    unsure_alone = replace(st, recent=(path_logprobs(unsure)[1:],))
    assert not verdict([seq], [unsure_alone], 1, ctl.costs, 0, 8, [True]).draft  # ... the unsure tree's alone does not
    for _ in range(RECENT_TREES - 1):
        round_(unsure, 1)
    assert not ctl.decide([seq], 1)         # unsure trees only: a plain verdict, so the next drafted
    round_(unsure, 1)                       # round is a probe
    st = ctl.state(seq, 1)
    assert st.probed and st.probe_gap > 8   # that lost: backed off


def test_a_batch_probe_leaves_one_gap_and_judges_a_sequence_that_started_plain():
    """The sequences of one drafting round leave it with one probe gap — the largest of theirs,
    then doubled or kept by the shared verdict — so a batch whose sequences came in with different
    gaps probes again when that gap has passed, not when the first of them is due. A sequence that
    started plain on a passed-on probe clock is judged by its first drafted round (it comes
    mid-text); one that started by drafting is not."""
    from dataclasses import replace

    from flashtree.speculative.adaptive import AdaptiveBudget, Choice, learned, regime, setting, settled, started
    from flashtree.speculative.probes import MAX_PROBE_GAP
    tree = build_ddtree(0, *drafts(L=3, K=2), budget=6)
    paths = path_logprobs(tree)[1:]

    def probe(states, taus, break_even=5.0):  # a probe: the round drafts after a plain verdict
        choice = Choice(6, 2.5, paths, break_even)
        after = [learned(replace(st, prefers_plain=True), tree, list(range(tau)), choice)
                 for st, tau in zip(states, taus)]
        return settled(after, taus, break_even, True, 8)

    old = [replace(started(FakeSeq(prompt=[1, 2, 3 + i]), 8, None), drafted=2, probe_gap=gap)
           for i, gap in enumerate((170, 872, None))]
    assert MAX_PROBE_GAP == 1024
    old = probe(old, [2] * 3, break_even=4.0)  # mean 2 < 2.5: unpaid, the largest (872) doubled, capped
    assert [st.probe_gap for st in old] == [MAX_PROBE_GAP] * 3
    old = probe(old, [3] * 3, break_even=4.0)  # half paid: kept (its loss alone asks for 100)
    assert [st.probe_gap for st in old] == [MAX_PROBE_GAP] * 3
    old = probe(old, [4] * 3, break_even=4.0)  # beat plain decoding: every gap back to probe_every
    assert [st.probe_gap for st in old] == [None] * 3

    ctl = AdaptiveBudget(probe_every=8)
    fresh = FakeSeq(prompt=[9, 9, 9])
    ctl.starts[regime(setting(fresh), 8)] = (64, 10)  # its regime passes on a clock: it starts plain
    inherited, drafting = ctl.state(fresh, 8), ctl.state(FakeSeq(prompt=[8, 8, 8], temperature=1.0), 8)
    assert inherited.started_plain and inherited.probe_gap == 64 and not drafting.started_plain
    (after,) = probe([inherited], [1], break_even=3.0)  # its first probe lost: judged (doubled, and its loss: 200)
    assert after.probe_gap == 200


PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=3)


@pytest.mark.parametrize("method, params", [("ddtree", SamplingParams(temperature=1.0, top_k=5)),
                                            ("hybrid", SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05))])
def test_sampled_auto_matches_the_exact_distribution(pair, method, params):
    cell = check_cell(*pair, PROMPT, Cell(method, "auto", params, 20000, "target"), patch=pinned)
    assert cell.passed, (cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)
    assert cell.mean_accept_length > 1.2


def test_a_wrong_verifier_is_caught_with_auto(pair):
    wrong = NEGATIVE_CONTROLS["temperature_x1.1"]
    cell = check_cell(*pair, PROMPT, Cell("ddtree", "auto", SamplingParams(temperature=1.0, top_k=5), 20000, "target"),
                      patch=lambda eng: (pinned(eng), wrong(eng)))
    assert cell.drafts_verified and cell.rejected() and not cell.passed
    assert cell.p_value < 1e-6, (cell.p_value, cell.tv, cell.tv_limit)


# ----------------------------------------------------------------------------------- surface
@pytest.mark.parametrize("bad", ["big", 0, -1, True, 2.5, 257])
def test_bad_budgets_name_the_allowed_values(models, bad):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", max_model_len=64))
    with pytest.raises(RequestError, match=r'budget must be an integer in \[1, 256\] or "auto"') as e:
        eng.add_request([1, 2], SamplingParams(max_tokens=2), budget=bad)
    assert e.value.param == "speculative"
    with pytest.raises(UserError, match='or "auto"'):
        Engine(target, drafter, EngineConfig(method="hybrid", budget=bad, max_model_len=64))


def test_auto_is_refused_where_there_is_no_tree_and_parsed_on_the_cli(models):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", max_model_len=64))
    with pytest.raises(RequestError, match="budget applies to methods 'ddtree', 'hybrid' only"):
        eng.add_request([1, 2], SamplingParams(max_tokens=2), method="dflash", budget="auto")
    assert budget_arg("auto") == "auto" and budget_arg("12") == 12
    with pytest.raises(argparse.ArgumentTypeError, match="an integer or 'auto'"):
        budget_arg("big")


def test_cli_generate_json_carries_the_chosen_budgets(tiny_pair, capsys):
    assert main(["generate", "t1 t2", "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--budget", "auto",
                 "--max-tokens", "10", "--json", "--no-compile"]) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert len(m["budgets"]) == len(m["predicted_taus"]) == m["rounds"] > 0


def test_trace_shows_each_auto_round_with_its_prediction(tiny_pair, tmp_path):
    page = tmp_path / "trace.html"
    assert main(["trace", "t1 t2 t3", "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--budget", "auto",
                 "--max-tokens", "8", "--out", str(page), "--no-compile"]) == 0
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="trace-data">(.*?)</script>', text, re.S).group(1).replace("<\\/", "</"))
    assert data["meta"]["budget"] == "auto" and data["rounds"]
    assert all(r["predicted_tau"] >= 1.0 for r in data["rounds"]) and text.count("(predicted ") == len(data["rounds"])


def test_server_auto_budget_reports_budgets(tiny_pair):
    llm = LLM(model=tiny_pair[0], draft=tiny_pair[1], max_batch_size=2)
    srv = Running(create_app(llm, model_name="tiny"))
    try:
        with httpx.Client(base_url=srv.base, timeout=60) as h:
            r = h.post("/v1/completions", json={"model": "tiny", "prompt": "t1 t2 t3", "max_tokens": 12,
                                                "temperature": 0, "speculative": {"budget": "auto"}})
            assert r.status_code == 200, r.text
            spec = r.json()["usage"]["spec"]
            assert sum(spec["budget_histogram"].values()) == spec["rounds"] > 0
            assert spec["mean_predicted_accept_length"] >= 1.0
            assert metric(srv.base, "flashtree_spec_budget_count") == spec["rounds"]
            r = h.post("/v1/completions", json={"model": "tiny", "prompt": "t1", "speculative": {"budget": "big"}})
            assert r.status_code == 400 and r.json()["error"]["param"] == "speculative"
            assert '"auto"' in r.json()["error"]["message"]
            r = h.post("/v1/completions", json={"model": "tiny", "prompt": "t1", "max_tokens": 4, "temperature": 0,
                                                "speculative": {"budget": 8}})
            assert r.status_code == 200 and r.json()["usage"]["spec"]["budget_histogram"] is None  # a fixed budget
    finally:
        srv.stop()


def test_repeats_finds_an_earlier_occurrence_of_the_last_3gram_incrementally():
    """The incremental check equals the definition at every length, prompt and output alike,
    whether it runs every round or catches up on many rounds at once (a regime whose repeat credit
    is spent checks only when a round may draft)."""
    from flashtree.speculative.adaptive import RepeatIndex, repeats
    rng = np.random.default_rng(0)
    for trial in range(30):
        toks = rng.integers(0, 4, size=40).tolist()
        seq = FakeSeq(prompt=toks[:7])
        st = RepeatIndex()
        step = 1 if trial % 2 else int(rng.integers(2, 12))  # one plain round's token at a time, or many rounds'
        for k in range(7, 41, step):
            seq.output_ids = toks[7:k]
            tail = tuple(toks[k - 3:k])
            want = any(tuple(toks[j:j + 3]) == tail for j in range(k - 3))
            assert repeats(seq, st) == want, (toks[:k], k)


def never_pays():
    """A pinned cost table where every verified token costs a plain step and the drafter one more."""
    return table(lambda b, t: 1e-3 * t, draft=1e-3, learn=False)


def test_a_repeat_calls_a_re_probe_while_drafting_in_repeats_pays_in_its_setting():
    """A sequence that starts plain (its setting's drafting did not pay) still probes in its first
    round when its text repeats itself; one whose text does not waits for its gap. Repeats stop
    calling probes in a regime where drafting rounds decided in repeating text lost tokens against
    plain decoding on the whole (one token of credit to start), and call them again once such
    rounds have gained more than they lost. In a batch, more than half its sequences must call one."""
    from flashtree.speculative.adaptive import AdaptiveBudget, Choice, repeats
    ctl = AdaptiveBudget()
    ctl.costs = never_pays()
    ctl.starts[("ddtree", 0.0, 1)] = (32, 0)  # greedy ddtree requests alone start plain, next probe in 32
    plain, looping = FakeSeq(prompt=[1, 2, 3, 4, 5]), FakeSeq(prompt=[1, 2, 3, 4, 1, 2, 3])
    assert not ctl.decide([plain], 1)
    assert ctl.decide([looping], 1)
    assert ctl.decide([FakeSeq(prompt=[1, 2, 3, 4, 1, 2, 3], temperature=1.0)], 1)  # a fresh setting drafts

    tree = build_ddtree(0, *drafts(L=3, K=2), budget=6)
    paths = path_logprobs(tree)[1:]

    def drafted(seq, tau):  # the round costs 5 plain ones: it beat plain decoding when tau >= 5
        repeats(seq, ctl.state(seq).text)  # as decide does for a round that drafts (a probe, here)
        choice = Choice(6, 2.5, paths, 5.0)
        ctl.learn(seq, tree, list(range(tau)), choice)
        ctl.settle([(seq, choice, tau)])

    drafted(looping, 4)            # drafting in repeating text paid half its cost but lost a token to plain: 1 - 1
    looping.output_ids = [4]       # (2, 3, 4): repeats again, but its curve says plain is faster ...
    assert not ctl.decide([looping], 1)
    assert not ctl.decide([FakeSeq(prompt=[7, 8, 9, 7, 8, 9])], 1)  # ... and repeats no longer call probes
    paying = FakeSeq(prompt=[5, 6, 7, 5, 6, 7])
    assert not ctl.decide([paying], 1)
    drafted(paying, 5)             # a round in repeating text that only matched plain decoding: still 0 ...
    assert not ctl.decide([FakeSeq(prompt=[7, 8, 9, 7, 8, 9])], 1)
    drafted(paying, 6)             # ... and one that beat it by a token: 1 - 1 + 0 + 1 > 0
    assert ctl.decide([FakeSeq(prompt=[7, 8, 9, 7, 8, 9])], 1)
    # in a batch the pass (and the widest tree) costs every sequence: more than half must call it
    ctl.starts[("ddtree", 0.0, 2)] = ctl.starts[("ddtree", 0.0, 3)] = (32, 0)  # batches of 2-3 and 4-7 start plain
    calm, loop = (lambda: FakeSeq(prompt=[1, 2, 3, 4, 5])), (lambda: FakeSeq(prompt=[7, 8, 9, 7, 8, 9]))
    assert not ctl.decide([loop(), calm(), calm()], 3)
    assert not ctl.decide([loop(), loop(), calm(), calm()], 4)
    assert ctl.decide([loop(), loop(), calm()], 3)
    assert ctl.decide([calm(), calm(), loop(), loop(), loop()], 5)
    quiet = [calm(), calm(), calm(), loop(), loop()]  # once the rest cannot make a majority, they are not read
    assert not ctl.decide(quiet, 5) and [ctl.state(s).text.seen for s in quiet] == [5, 5, 5, 0, 0]
    newcomer = calm()  # ... and those already read go first: a newcomer's prompt is not read either
    for s in quiet[:3]:
        s.output_ids.append(6)
    ctl.steady = None
    assert not ctl.decide([newcomer] + quiet, 6) and ctl.state(newcomer).text.seen == 0
    assert [ctl.state(s).text.seen for s in quiet] == [6, 6, 6, 0, 0]
    # the gains are kept per batch size class: batches of 2-3 have their own (fresh: repeats call)
    assert set(ctl.repeat_gain) == {("ddtree", 0.0, 1)}


def test_a_standing_plain_verdict_answers_as_a_fresh_look_would():
    """The controller skips looking at a batch whose plain verdict stands (same sequences, no
    repeat credit, no probe due yet): round by round its answers equal a controller that looks
    every round — through probes that back off, a sequence leaving, and repeats once the regime's
    credit is spent (a repeat probe that lost) and again after a drafting round that won it back."""
    from flashtree.speculative.adaptive import (
        PLAIN,
        AdaptiveBudget,
        Choice,
        regime,
        setting,
    )
    tree = build_ddtree(0, *drafts(L=3, K=2), budget=6)
    paths = path_logprobs(tree)[1:]
    runs, looked = [], []
    for memo in (True, False):
        ctl = AdaptiveBudget(probe_every=4)
        ctl.costs = never_pays()
        seqs = [FakeSeq(prompt=[1, 2, 3, 4 + i], temperature=1.0) for i in range(4)]
        ctl.repeat_gain[regime(setting(seqs[0]), 4)] = -1.5  # spent (one token of credit to start): no repeat calls
        for i, s in enumerate(seqs):  # each starts plain on its own probe clock
            ctl.starts[regime(setting(s), 4)] = (6 + 5 * i, i)
            ctl.state(s, 4)
        ctl.starts.clear()
        answers, held = [], 0
        for r in range(90):
            batch = seqs if r < 50 else seqs[1:]  # the first one leaves at round 50
            for s in batch:
                s.output_ids.append([7, 8, 9][r % 3] if r >= 70 else 100 + r)  # repeating from round 70
            if not memo:
                ctl.steady = None
            elif ctl.steady is not None and ctl.steady.seqs == batch:
                held += 1
            wants = ctl.decide(batch, len(batch))
            answers.append(wants)
            choice = Choice(6, 2.5, paths, 1.2) if wants else PLAIN
            tau = 6 if r >= 75 else 1  # every probe loses until round 75, then they win
            for s in batch:
                s.metrics.rounds += 1
                ctl.learn(s, tree, list(range(tau)) if wants else [0], choice)
            ctl.settle([(s, choice, tau) for s in batch] if wants else [])
        runs.append(answers)
        looked.append(held)
    assert runs[0] == runs[1] and 8 < sum(runs[0]) < 40  # (10 drafting rounds: probes, then the wins)
    assert looked[0] > 30  # the verdict stood without a look in most plain rounds


def test_a_regime_is_the_setting_and_the_batch_size_class():
    """Whether drafting pays depends on the batch (a drafting round costs ~2.8 plain rounds at
    batch 1 and ~4 at batch 8 on a 2-core CPU): what one regime learnt does not steer another."""
    from flashtree.speculative.adaptive import regime, setting
    seq = FakeSeq()
    key = setting(seq)
    assert [regime(key, b)[-1] for b in (1, 2, 3, 4, 7, 8, 15, 16)] == [1, 2, 2, 3, 3, 4, 4, 5]
    assert regime(key, 8)[:-1] == ("ddtree", 0.0) and regime(setting(FakeSeq(temperature=1.0)), 1) != regime(key, 1)


def test_a_setting_that_starts_plain_keeps_its_probe_clock_across_short_requests(models):
    """Requests shorter than the probe gap: each starts plain where the last one's clock stood,
    so the setting still re-probes as one long sequence would — passing the whole gap on made
    every request plain from then on (it never reached its first probe)."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=1, max_model_len=160))
    pin(lambda b, t: 1e-3 * t, draft=1e-3)(eng)
    key = ("drafter", 1, drafter.config.block_size)
    passes = []  # drafter passes per request (a drafted round may verify 0 nodes here: count passes)
    for i in range(12):  # 12 x 20 rounds; no prompt repeats a 3-gram, nor (nearly) its output
        before = eng.runner.shapes[key]
        eng.add_request([10 + i, 40 + i, 70 + i], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        eng.step()  # prefill and its first round
        first_round = eng.runner.shapes[key] - before
        while eng.has_work():
            eng.step()
        passes.append((first_round, eng.runner.shapes[key] - before))
    assert eng.adaptive.starts  # drafting did not pay: later requests start plain ...
    assert sum(f for f, _ in passes[3:]) <= 2, passes  # ... nearly all of them (a repeat may call a probe)
    total = sum(n for _, n in passes)
    assert 4 <= total <= 14, passes  # ... and the setting still probes: rounds 0, 8, 16, then (its gap,
    assert any(n for _, n in passes[3:]), passes  # ~2 plain rounds lost / PROBE_LOSS, passed) in a later request


def test_a_rounds_overhead_is_all_of_its_time_but_the_model_calls():
    """The cost table's overhead is the round's whole wall time less its verify forward, drafter
    pass and tree build — scheduling and Python included, which plain rounds pay as well."""
    c = CostTable()
    times = RoundTimes(draft=1.0e-3, tree=0.2e-3, budget=0.1e-3, pack=0.1e-3, verify_forward=2.0e-3,
                       verify_walk=0.3e-3, commit=0.2e-3)
    c.observe(4, 9, 4, times, seconds=4.5e-3)  # (the first pass at a batch size: a cold call, unrecorded)
    assert not c.draft_s
    c.observe(4, 9, 4, times, seconds=4.5e-3)
    assert c.verify_s == {(4, 9): 2.0e-3} and c.draft_s[4] == pytest.approx(1.2e-3)
    assert c.overhead_s[4, True] == pytest.approx(1.0e-3)  # 0.4 ms of timed phases (the walk apart) + 0.6 untimed
    assert not c.walk_row_s  # no plain round's walk yet to measure the extra rows against
    assert c.overheads(4) == pytest.approx((1.0e-3, 1.0e-3))  # the one measured stands in
    c.observe(4, 1, 0, RoundTimes(verify_forward=1.0e-3, pack=0.1e-3, verify_walk=0.1e-3), seconds=1.5e-3)  # plain
    assert c.overhead_s[4, False] == pytest.approx(0.4e-3) and set(c.draft_s) == {4}
    assert c.walk_s[4] == pytest.approx(0.1e-3)
    # a plain round's overhead and a wide one's are kept apart (one average overpriced plain rounds)
    assert c.overheads(4) == pytest.approx((0.4e-3, 1.0e-3))


def test_the_sampling_walk_costs_each_extra_row_it_verifies():
    """With top-p every row verified is a vocabulary sort: the round cost of a wide tree includes
    its rows' walk, measured as the excess over a plain round's walk per extra row."""
    c = table(lambda b, t: 1e-3, batches=(8,), learn=True)  # a flat forward: any width costs the same
    c.observe(8, 1, 0, RoundTimes(verify_forward=1e-3, verify_walk=2e-3), seconds=3.5e-3)
    c.observe(8, 9, 8, RoundTimes(verify_forward=1e-3, draft=1e-3, verify_walk=2e-3 + 64 * 0.2e-3), seconds=17.3e-3)  # same overhead
    assert c.walk_row_s[8] == pytest.approx(0.2e-3)
    assert c.round_cost(8, 9) - c.round_cost(8, 1) == pytest.approx(64 * 0.2e-3)
    assert np.allclose(c.round_cost(8, np.array([1, 9])), [c.round_cost(8, 1), c.round_cost(8, 9)])


def test_a_wave_arriving_at_an_idle_engine_runs_in_its_batch_size_class(models):
    """Four requests arriving together at an idle engine prefill one per step (a small token
    budget), so the first decodes alone at first: its regime is still the batch of four the
    engine has work for, so it starts plain on the clock the last wave passed on — as a batch of
    one it found no clock, drafted in round 0 and made the whole wave probe 8 rounds later."""
    from flashtree.speculative.adaptive import regime, setting
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=4, max_model_len=160,
                                               max_num_batched_tokens=10))
    pin(lambda b, t: 1e-3 * t, draft=1e-3)(eng)  # drafting never pays
    passes = lambda: sum(n for k, n in eng.runner.shapes.items() if k[0] == "drafter")
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def wave(first: int) -> list:
        seqs = [eng.add_request([first + 10 * i + j for j in range(10)], greedy) for i in range(4)]
        eng.step()
        assert sum(s.decoding for s in seqs) == 1  # the first decodes while the others wait to prefill
        return seqs

    wave(1)
    while eng.has_work():
        eng.step()
    key = regime(setting(FakeSeq()), 4)  # greedy ddtree in a batch of four
    assert key in eng.adaptive.starts  # the first wave's probes did not pay
    for k in [k for k in eng.adaptive.starts if k != key]:  # (its tail, finishing in smaller batches, passed
        del eng.adaptive.starts[k]                          # clocks on there too: a wave ending together does not)
    seq = wave(45)
    before = passes()
    for _ in range(6):  # the others join one per step
        eng.step()
    assert passes() == before and all(s.metrics.budgets[:1] == [0] for s in seq)  # no drafting round 0
    assert [eng.adaptive.state(s).batch for s in seq] == [4] * 4


def test_cost_seeding_never_runs_more_than_one_forward_a_step_while_others_decode(models):
    """Issue 41.3: an auto request arriving while plain streams decode has its cost table seeded
    one target forward per step, never in a step that prefills — seeding all ~40 forwards in one
    step stalled the streams 279x their median gap. On an idle engine it seeds at once."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ar", max_batch_size=6, max_model_len=160))
    plain = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    streams = [eng.add_request(p, plain) for p in repetitive_prompts(4)]
    for _ in range(3):
        eng.step()
    auto = eng.add_request(list(range(1, 90)), SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
                           method="ddtree", budget="auto")
    per_step = []
    while not auto.finished:
        before = sum(n for (m, _, _), n in eng.runner.shapes.items() if m == "target")
        eng.step()
        per_step.append((sum(n for (m, _, _), n in eng.runner.shapes.items() if m == "target") - before,
                         eng.round_times.prefill > 0, eng.round_times.seed_costs > 0))
    assert all(not (pre and seed) for _, pre, seed in per_step), per_step  # never beside a prefill chunk
    assert max(n for n, _, _ in per_step) <= 2, per_step        # a round's forward + one prefill or seed
    assert sum(seed for _, _, seed in per_step) >= 10           # the seeding ran, spread over steps
    assert (1, 1) in eng.adaptive.costs.verify_s and eng.adaptive.costs.draft_s
    assert not any(s.finished for s in streams)                 # (they decoded all along)
    idle = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=6, max_model_len=160))
    s = idle.add_request(list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    idle.step()
    assert idle.seeder.done and s.metrics.rounds == 1           # all at once: no stream to stall


def test_an_auto_request_after_fixed_budget_rounds_still_seeds_what_they_did_not_measure(models):
    """Fixed-budget ddtree rounds measure their own width and the drafter pass; an auto request
    arriving after them still gets the seeding (the widths those rounds never ran, and the
    baseline its drift reads), and no seed replaces what a round measured."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget=4, max_batch_size=4, max_model_len=160))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    eng.add_request(list(range(1, 30)), greedy)
    while eng.has_work():
        eng.step()
    costs = eng.adaptive.costs
    assert not eng.seeder.started and set(costs.verify_s) <= {(1, 1), (1, 5)} and list(costs.draft_s) == [1]
    auto = eng.add_request(list(range(1, 30)), greedy, budget="auto")
    eng.step()
    assert eng.seeder.started and eng.seeder.done and auto.metrics.rounds == 1
    assert {(1, t) for t in (2, 4, 8, 16)} <= set(costs.verify_s) and len(costs.draft_s) == 2  # seeded
    assert 1 in costs.drift  # auto's round read against the seeds


def test_an_engine_with_one_slot_seeds_before_it_admits_the_first_auto_request(models):
    """The seeder times forwards on free slots: an engine of one slot seeds while it is idle,
    before the first auto request takes the slot (after, none would ever be free)."""
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget="auto", max_batch_size=1, max_model_len=160))
    s = eng.add_request(list(range(1, 30)), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    eng.step()
    assert eng.seeder.done and s.metrics.rounds == 1
    assert {(1, t) for t in (1, 2, 4, 8, 16)} <= set(eng.adaptive.costs.verify_s) and 1 in eng.adaptive.costs.draft_s


def test_the_probe_clock_rules_are_pure_functions_of_outcomes_and_costs():
    """The rules `settle`, `release` and a newcomer's start apply, each on its own numbers:
    a round that beats plain decoding resets the gap, a half-paid probe keeps it, any other
    doubles it (at least its loss in plain rounds, at most MAX_PROBE_GAP); only a gap of two
    unpaid probes is passed on; a newcomer takes the clock of the peer that backed off most."""
    from flashtree.speculative.probes import (
        INHERIT_GAP,
        MAX_PROBE_GAP,
        beats_plain,
        gap_after,
        passed_on,
        peers_clock,
        rounds_to_probe,
    )
    assert rounds_to_probe(None, 0, 8) == 7 and rounds_to_probe(16, 15, 8) == 0 and rounds_to_probe(16, 20, 8) < 0
    assert beats_plain(2.0, 2.0, True) and not beats_plain(3.0, 2.0, False) and not beats_plain(1.9, 2.0, True)
    assert gap_after(64, 2.0, 2.0, True) is None                 # beat plain decoding
    assert gap_after(8, 1.5, 2.0, True) == 50                    # half-paid, kept, but lost 0.5 plain rounds
    assert gap_after(64, 1.96, 2.0, True) == 64                  # half-paid, loss 4 rounds: kept
    assert gap_after(64, 1.2, 2.0, True) == 128                  # not half-paid: doubled
    assert gap_after(8, 3.0, 2.0, False) == 16                   # verified nothing: doubled (its "loss" is negative)
    assert gap_after(MAX_PROBE_GAP, 1.0, 2.0, True) == MAX_PROBE_GAP
    assert passed_on(INHERIT_GAP - 1, 5) is None and passed_on(None, 5) is None
    assert passed_on(64, 100) == (64, 63) and passed_on(64, 10) == (64, 10)
    assert peers_clock([(None, 3), (32, 40), (32, 7)], 8) == (32, 31)
    assert peers_clock([(None, 3), (None, 5)], 8) == (8, 5)


def test_the_verdict_asked_twice_in_a_step_answers_the_same_and_changes_nothing_it_reads():
    """`decide` and `holds` read state and record a verdict; asking again in the same step
    (a retried decision) gives the same answer and leaves every sequence's clock and curve as the
    first asking did — for a drafting verdict, a plain one, and a standing plain verdict."""
    from flashtree.speculative.adaptive import AdaptiveBudget, Choice
    tree = build_ddtree(0, *drafts(L=3, K=2), budget=6)
    paths = path_logprobs(tree)[1:]

    def clocks(ctl, seqs):
        return [(st.prefers_plain, st.probe_gap, st.undrafted, st.probed, st.drafted, len(st.recent))
                for st in map(ctl.state, seqs)]

    for costs, expect in ((table(lambda b, t: 1e-3, draft=1e-4, learn=False), True), (never_pays(), False)):
        ctl = AdaptiveBudget()
        ctl.costs = costs
        seqs = [FakeSeq(prompt=[1, 2, 3 + i]) for i in range(2)]
        for s in seqs:  # two drafted rounds each: a curve, no probe due
            for _ in range(2):
                s.metrics.rounds += 1
                ctl.learn(s, tree, [0, 1], Choice(6, 2.5, paths, 1.5))
        ctl.settle([(s, Choice(6, 2.5, paths, 1.5), 2) for s in seqs])
        answers, states = [], []
        for _ in range(3):  # the verdict, asked again, and a third time (a plain one then stands: holds)
            answers.append(ctl.decide(seqs, 2))
            states.append(clocks(ctl, seqs))
        assert answers == [expect] * 3 and states[0] == states[1] == states[2]
        if not expect:
            assert ctl.holds(seqs, 2) and ctl.holds(seqs, 2)  # reads only: it stands the same a second time
            for s in seqs:
                s.metrics.rounds += 8  # past the probe gap: the standing verdict expires
            assert not ctl.holds(seqs, 2) and ctl.decide(seqs, 2)  # a probe is due
