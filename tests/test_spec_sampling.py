"""Sampled speculative decoding has exactly the target's distribution (and the check can fail).

A V=8 target's distribution over its first 3 generated tokens is enumerated exactly; 20,000
seeded dflash / ddtree runs must match it (chi-square p > 0.001 with small cells pooled, and a
total-variation distance within that of an equally sized direct sample plus a small margin).
The default run covers T in {0.7, 1.0, 1.5} with all filters off and all on; `-m slow` adds
each filter on its own for both methods.
"""
import pytest

from flashtree import SamplingParams
from flashtree.exactness import NEGATIVE_CONTROLS, Cell, check_cell, grid, tiny_pair

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=4)


def run(pair, cell, patch=None):
    return check_cell(*pair, PROMPT, cell, n_tokens=3, patch=patch)


DEFAULT = grid(filters=("none", "all"), methods=(("ddtree", 6),)) + grid(filters=("all",), methods=(("dflash", None),))
SLOW = [c for c in grid() if c.label() not in {d.label() for d in DEFAULT}]


@pytest.mark.parametrize("cell", DEFAULT, ids=Cell.label)
def test_speculative_samples_match_exact_distribution(pair, cell):
    run(pair, cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit)
    if cell.method == "ddtree":  # the tree really accepted drafts, so the walk was exercised
        assert cell.notes["mean_accept_length"] > 1.2


@pytest.mark.slow
@pytest.mark.parametrize("cell", SLOW, ids=Cell.label)
def test_each_filter_alone_matches_exact_distribution(pair, cell):
    run(pair, cell)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit)


@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
def test_a_wrong_verifier_is_caught(pair, name):
    cell = run(pair, Cell("ddtree", 6, SamplingParams(temperature=1.0, top_k=5), 20000), patch=NEGATIVE_CONTROLS[name])
    assert not cell.passed and cell.p_value < 1e-6 and cell.tv > cell.tv_limit


def test_greedy_is_a_point_mass(pair):
    cell = run(pair, Cell("ddtree", 6, SamplingParams(temperature=0.0), 200))
    assert cell.passed and cell.tv == 0.0
