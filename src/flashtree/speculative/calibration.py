"""Auto's calibration: how likely a draft node is to be accepted, learned per sequence.

`Calibration` holds, in fixed bins of a node's draft *path* log-prob, a Beta posterior of its
acceptance probability whose prior is centred on the bin's draft probability (before any evidence
it trusts the drafter), updated with the sequence's committed rounds: every verified node is one
trial, a success when it is on the accepted path. `tau_curve` turns a tree's path log-probs into
E[tau | N], the tokens a round verifying its first N nodes is expected to commit; `mean_curve`
averages a sequence's recent trees' curves. Pure numbers in, numbers out: no engine, no costs, no
decisions (`adaptive.py` decides).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from .tree import DraftTree

# path log-prob bin edges (ascending); 10 bins: (-inf, -6], (-6, -4], ..., (-0.15, 0]
BIN_EDGES = np.array([-6.0, -4.0, -3.0, -2.2, -1.6, -1.1, -0.7, -0.4, -0.15])
# each bin's centre: the midpoint of its edges (the open lowest bin: 2 below its upper edge)
BIN_CENTRES = np.concatenate([[BIN_EDGES[0] - 2.0], (BIN_EDGES[:-1] + BIN_EDGES[1:]) / 2, [BIN_EDGES[-1] / 2]])
PRIOR_COUNT = 2.0       # pseudo-trials of the drafter's own estimate per bin
PRIOR_HITS = PRIOR_COUNT * np.exp(BIN_CENTRES)  # ... and their pseudo-successes
EDGES = BIN_EDGES.tolist()


def path_logprobs(tree: DraftTree) -> np.ndarray:
    """[N+1] each node's draft path log-prob: its own log-prob plus its parent's (root 0).
    Parents precede children in a tree, so one pass suffices."""
    out = [0.0] * tree.size
    for i in range(1, tree.size):
        out[i] = out[tree.parents[i]] + tree.logprobs[i]
    return np.asarray(out)


@dataclass(slots=True, frozen=True)
class Calibration:
    """Acceptance rate by draft path log-prob bin: Beta(PRIOR_COUNT * p, PRIOR_COUNT * (1 - p))
    priors, p = exp(bin centre), updated with the sequence's verified nodes."""
    hits: np.ndarray = field(default_factory=lambda: np.zeros(len(BIN_CENTRES)))
    trials: np.ndarray = field(default_factory=lambda: np.zeros(len(BIN_CENTRES)))

    @staticmethod
    def bins(path_lp: np.ndarray) -> np.ndarray:
        # bin i holds BIN_EDGES[i-1] < lp <= BIN_EDGES[i] (np.digitize(right=True), without its checks)
        return np.searchsorted(BIN_EDGES, np.asarray(path_lp, dtype=float), side="left")

    def table(self) -> list[float]:
        """The calibrated acceptance probability of each bin (posterior means)."""
        return ((PRIOR_HITS + self.hits) / (PRIOR_COUNT + self.trials)).tolist()

    def rate(self, path_lp: np.ndarray) -> np.ndarray:
        """Calibrated acceptance probability of nodes with these path log-probs."""
        return np.asarray(self.table())[self.bins(path_lp)]

    def updated(self, path_lp: np.ndarray, accepted: np.ndarray) -> Calibration:
        """This calibration with one more trial per node; a success when the node is on the
        accepted path. A new value: the arrays of `self` are not written."""
        idx, n = self.bins(path_lp), len(BIN_CENTRES)
        return Calibration(self.hits + np.bincount(idx, weights=np.asarray(accepted, dtype=float), minlength=n),
                           self.trials + np.bincount(idx, minlength=n))


def tau_curve(paths: np.ndarray, calibration: Calibration) -> list[float]:
    """E[tau | N] for N = 0..len(paths) of a tree whose nodes have these path log-probs (root
    excluded, `path_logprobs(tree)[1:]`): 1 (the bonus) + the calibrated acceptance probabilities
    of the first N nodes (a node accepted adds one token; tau = 1 + accepted nodes). Plain Python,
    as is the rest of a round's choice (token_rates, the cost curve): its arrays are a few dozen
    numbers, and in a round, right after the forwards, caches are cold and each numpy call costs
    several microseconds — a numpy verdict took ~320 us there, this one ~170 (bisect_left on the
    edges is Calibration.bins)."""
    return _curve(paths, calibration.table())


def _curve(paths, table: list[float]) -> list[float]:
    """tau_curve under a calibration's table (read once for many trees)."""
    out, tau = [1.0], 1.0
    for lp in (paths.tolist() if isinstance(paths, np.ndarray) else paths):
        tau += table[bisect.bisect_left(EDGES, lp)]
        out.append(tau)
    return out


def mean_curve(recent, calibration: Calibration) -> list[float]:
    """E[tau | N] of a sequence's next tree, guessed as the mean of its recent trees' curves
    (`recent`: their path log-probs, oldest first) under its current calibration, each held at
    its last value past its own size ([1.0], plain's one token, before any tree)."""
    table = calibration.table()
    curves = [_curve(p, table) for p in recent]
    if len(curves) <= 1:
        return curves[0] if curves else [1.0]
    total = [0.0] * max(len(c) for c in curves)  # summed in tree order at every index (plain Python,
    for c in curves:                             # as tau_curve: a verdict reads it every drafting round)
        for i, v in enumerate(c):
            total[i] += v
        for i in range(len(c), len(total)):
            total[i] += c[-1]
    return [t / len(curves) for t in total]
