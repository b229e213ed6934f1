"""`budget="auto"`: the tree size each round that maximises expected committed tokens per second.

Three pieces (SPEC §2 "Adaptive budget"), and the per-engine controller that uses them:

- `Calibration` (one per auto sequence): the acceptance probability of a tree node as a function
  of its draft *path* log-prob, in fixed bins, each a Beta posterior whose prior is centred on the
  bin's draft probability — so before any evidence it trusts the drafter — learned from the
  sequence's own committed rounds (every verified node is one trial; a success is a node on the
  accepted path). Per sequence is per temperature setting: a request's sampling never changes.
- `tau_curve`: E[tau | N] = 1 + the calibrated probabilities of the first N nodes summed. Trees
  are in best-first pop order, so the first N nodes of a budget-M tree are the budget-N tree.
- `CostTable` (one per engine): measured seconds of the drafter pass by batch size (and per
  context row it must first catch up on), of the verify forward by (batch size, tokens per
  sequence) and of the rest of a round by batch size; seeded
  by timing real forwards on free cache slots (`engine/cost_seeding.py`) and refreshed online from the
  engine's per-round phase times (an EMA). No hand-written constants.
- `choose_tokens`: the forward's tokens per sequence T (1 = plain decoding) maximising the batch's
  expected committed tokens / (drafter cost + round cost at T).

`AdaptiveBudget` ties them to the engine: before drafting it says whether the drafter should run
(each sequence's mean curve of its last RECENT_TREES trees under the current calibration — a
plain verdict stands, unread, while its batch is unchanged and no probe is due (`Steady`); a
sequence that stopped drafting re-probes after a gap that doubles while probe rounds (drafting
rounds after a plain verdict) do not commit enough tokens to recover half their cost over a
plain round (the sequences of one drafting round leave it with one gap),
or at once when its text starts repeating itself — the
committed tokens' last 3-gram occurred earlier in them, where greedy acceptance on the bundled
pair is twice what it is elsewhere (tau 4.4 vs 2.1) — while drafting in repeating text has
gained tokens over plain decoding in its regime (sampling setting and batch size class);
after the trees are built it picks T and cuts each auto sequence's tree to its first T-1 nodes;
after the commit it learns. When a sequence finishes having found that drafting did not pay,
the next one in the same regime starts on plain rounds where its probe clock stood instead of a
drafting round (`release`). Every input is committed history, draft probabilities or measured time — never the
current round's verify draws — so the choice keeps decoding lossless. This module does not build
trees, verify or sample.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .tree import DraftTree

if TYPE_CHECKING:
    from ..engine.round import RoundTimes
    from ..engine.sequence import RequestMetrics, Sequence

# path log-prob bin edges (ascending); 10 bins: (-inf, -6], (-6, -4], ..., (-0.15, 0]
BIN_EDGES = np.array([-6.0, -4.0, -3.0, -2.2, -1.6, -1.1, -0.7, -0.4, -0.15])
# each bin's centre: the midpoint of its edges (the open lowest bin: 2 below its upper edge)
BIN_CENTRES = np.concatenate([[BIN_EDGES[0] - 2.0], (BIN_EDGES[:-1] + BIN_EDGES[1:]) / 2, [BIN_EDGES[-1] / 2]])
PRIOR_COUNT = 2.0       # pseudo-trials of the drafter's own estimate per bin
PRIOR_HITS = PRIOR_COUNT * np.exp(BIN_CENTRES)  # ... and their pseudo-successes
EDGES = BIN_EDGES.tolist()
COST_EMA = 0.2          # weight of a new measurement in the cost table
PROBE_EVERY = 8         # an auto sequence that stopped drafting drafts again every 8th round ...
MAX_PROBE_GAP = 1024    # ... a gap that doubles while probes do not pay, up to this (a probe that feeds
                        # the drafter a long plain stretch costs many plain rounds)
PROBE_LOSS = 0.01       # and at least as long as keeps a probe's loss below 1 % of plain decoding's time
RECENT_TREES = 4       # the plain-or-draft verdict reads the mean curve of a sequence's last 4 trees:
                        # one tree is a noisy guess of the next (real pair, T=0: one unsure tree sent
                        # a sequence that drafted at tau 2.6 to plain rounds for most of its answer)
INHERIT_GAP = 4 * PROBE_EVERY  # a finished sequence passes on a probe gap this large (two unpaid probes)
REPEAT_NGRAM = 3        # a plain-decoding sequence whose last 3-gram occurred earlier re-probes at once:
                        # repeating text is where drafts are accepted (the target's confidence is no guide)
REPEAT_PRIOR = 1.0      # ... while drafting rounds decided in repeating text gained tokens over plain rounds
                        # on the whole (this many to start with): such rounds win big or lose, so the
                        # credit counts tokens gained, not how often a round beat plain decoding


# ------------------------------------------------------------------------------- calibration
def path_logprobs(tree: DraftTree) -> np.ndarray:
    """[N+1] each node's draft path log-prob: its own log-prob plus its parent's (root 0).
    Parents precede children in a tree, so one pass suffices."""
    out = [0.0] * tree.size
    for i in range(1, tree.size):
        out[i] = out[tree.parents[i]] + tree.logprobs[i]
    return np.asarray(out)


@dataclass(slots=True)
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

    def update(self, path_lp: np.ndarray, accepted: np.ndarray) -> None:
        """One trial per node; a success when the node is on the accepted path."""
        idx = self.bins(path_lp)
        np.add.at(self.trials, idx, 1.0)
        np.add.at(self.hits, idx, np.asarray(accepted, dtype=float))


def tau_curve(paths: np.ndarray, calibration: Calibration) -> list[float]:
    """E[tau | N] for N = 0..len(paths) of a tree whose nodes have these path log-probs (root
    excluded, `path_logprobs(tree)[1:]`): 1 (the bonus) + the calibrated acceptance probabilities
    of the first N nodes (a node accepted adds one token; tau = 1 + accepted nodes). Plain Python,
    as is the rest of a round's choice (token_rates, the cost curve): its arrays are a few dozen
    numbers, and in a round, right after the forwards, caches are cold and each numpy call costs
    several microseconds — a numpy verdict took ~320 us there, this one ~170 (bisect_left on the
    edges is Calibration.bins)."""
    table = calibration.table()
    out, tau = [1.0], 1.0
    for lp in (paths.tolist() if isinstance(paths, np.ndarray) else paths):
        tau += table[bisect.bisect_left(EDGES, lp)]
        out.append(tau)
    return out


def recent_curve(st: AutoState) -> list[float]:
    """E[tau | N] of st's next tree, guessed as the mean of its last trees' curves under its
    current calibration, each held at its last value past its own size ([1.0], plain's one token,
    before any tree)."""
    curves = [tau_curve(p, st.calibration) for p in st.recent]
    if len(curves) <= 1:
        return curves[0] if curves else [1.0]
    total = [0.0] * max(len(c) for c in curves)  # summed in tree order at every index (plain Python,
    for c in curves:                             # as tau_curve: a verdict reads it every drafting round)
        for i, v in enumerate(c):
            total[i] += v
        for i in range(len(c), len(total)):
            total[i] += c[-1]
    return [t / len(curves) for t in total]


def setting(seq: Sequence) -> tuple:
    """What makes two requests' acceptance alike: method and sampling parameters (greedy: any filters)."""
    p = seq.params
    return (seq.method, 0.0) if p.greedy else (seq.method, p.temperature, p.top_k, p.top_p, p.min_p)


def regime(key: tuple, batch: int) -> tuple:
    """A sequence's setting (`key`, see `setting`) and the batch size class it runs in (1, 2-3,
    4-7, 8-15, ...): whether drafting pays depends on both — on a 2-core CPU a drafting round costs
    ~2.8 plain rounds at batch 1 and ~4 at batch 8, so greedy repeats that beat plain decoding at
    C=1 lost at C=8. The batch is the one the engine has work for (prefilling and waiting
    sequences included, up to its batch limit): a wave
    of 8 arriving at an idle engine decodes its first one alone while the rest prefill, and as a
    batch of 1 it found no probe clock passed on at batch 8, drafted, and 8 rounds later made the
    whole wave probe (T=1, C=8: 9 drafting rounds a 32-request pass, auto 0.97x plain)."""
    return key + (batch.bit_length(),)


# ------------------------------------------------------------------------------------- costs
def interpolate(points: dict[float, float], x):
    """Piecewise-linear y(x) through measured points; beyond them the nearest segment's slope;
    from a single point, proportional (y = y0 * x / x0). Never below a microsecond. `x` may be a
    number (returns a float) or an array (returns an array)."""
    if isinstance(x, (int, float)) or np.ndim(x) == 0:
        return max(float(points[x]), 1e-6) if x in points else line(points, [float(x)])[0]
    return np.array(line(points, np.asarray(x, dtype=float).ravel().tolist())).reshape(np.shape(x))


def line(points: dict[float, float], qs) -> list[float]:
    """`interpolate`'s rule at each of qs (an iterable of numbers; fastest ascending), in plain
    Python (see tau_curve)."""
    xs = sorted(points)
    ys = [points[k] for k in xs]
    if len(xs) == 1:
        return [max(ys[0] * q / xs[0], 1e-6) for q in qs]
    slopes = [(ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1]) for i in range(1, len(xs))]
    last, i, prev, out = len(xs) - 1, 1, -math.inf, []
    for q in qs:
        if q < prev:  # not ascending: walk again from the first segment
            i = 1
        prev = q
        while i < last and xs[i] < q:  # segment [xs[i-1], xs[i]] holds q (the end ones extended)
            i += 1
        y = ys[i - 1] + slopes[i - 1] * (q - xs[i - 1])
        out.append(y if y > 1e-6 else 1e-6)
    return out


@dataclass(slots=True)
class CostTable:
    """Measured seconds per round component. `learn=False` pins the table (no online refresh, no
    seeding): a seam for reproducible runs and tests."""
    verify_s: dict[tuple[int, int], float] = field(default_factory=dict)  # (batch, tokens/seq) -> target forward
    draft_s: dict[int, float] = field(default_factory=dict)               # batch -> drafter pass + tree build
    overhead_s: dict[tuple[int, bool], float] = field(default_factory=dict)  # (batch, wide) -> the rest of a
                                                                          # round (wide: verified > 1 token/seq)
    walk_s: dict[int, float] = field(default_factory=dict)                # batch -> sampling walk of a plain round
    walk_row_s: dict[int, float] = field(default_factory=dict)            # batch -> its cost per extra row verified
    context_row_s: float | None = None    # drafter pass seconds per context row it catches up on (see catch_up)
    learn: bool = True
    _by_batch: dict | None = field(default=None, repr=False)  # verify_s grouped by batch (rebuilt after a record)
    _curves: dict[int, list[float]] = field(default_factory=dict, repr=False)  # batch -> round_costs (until a record)
    _passes_seen: set[int] = field(default_factory=set, repr=False)  # batch sizes whose first pass went unrecorded

    @property
    def measured(self) -> bool:
        return bool(self.verify_s)

    def _ema(self, table: dict, key, secs: float) -> None:
        old = table.get(key)
        table[key] = secs if old is None else (1 - COST_EMA) * old + COST_EMA * secs
        self._curves.clear()

    def record_verify(self, batch: int, tokens: int, secs: float) -> None:
        self._ema(self.verify_s, (batch, tokens), secs)
        self._by_batch = None

    def record_draft(self, batch: int, secs: float) -> None:
        self._ema(self.draft_s, batch, secs)

    def record_overhead(self, batch: int, tokens: int, secs: float) -> None:
        self._ema(self.overhead_s, (batch, tokens > 1), secs)

    def verify(self, batch: int, tokens):
        """The target forward of `batch` sequences x `tokens` (a number or an array of them):
        interpolated over the tokens measured at this batch size; else from the nearest measured
        batch size at the same total tokens (batch x tokens), rescaled to this batch's one
        measured point if it has one (at that point the two agree)."""
        if not self.verify_s:
            return None
        by_batch = self._grouped()
        own = by_batch.get(batch, {})
        if len(own) >= 2 or (own and np.all(np.isin(tokens, list(own)))):
            return interpolate(own, tokens)
        ref = min(by_batch, key=lambda b: (len(by_batch[b]) < 2, abs(math.log(b / batch))))
        est = interpolate(by_batch[ref], np.asarray(tokens, dtype=float) * batch / ref)
        if own:  # one point here: the reference curve's shape, this batch's level
            (t0, s0), = own.items()
            est = est * (s0 / interpolate(by_batch[ref], t0 * batch / ref))
        return est

    def _grouped(self) -> dict[int, dict[int, float]]:
        """verify_s as batch -> {tokens: seconds} (rebuilt after a record)."""
        if self._by_batch is None:
            self._by_batch = {}
            for (b, t), s in self.verify_s.items():
                self._by_batch.setdefault(b, {})[t] = s
        return self._by_batch

    def draft(self, batch: int) -> float | None:
        return interpolate(self.draft_s, batch) if self.draft_s else None

    def record_catch_up(self, rows: int, secs: float) -> None:
        """A drafter pass that caught up on `rows` context rows cost `secs` more than a steady pass."""
        per_row = secs / rows
        old = self.context_row_s
        self.context_row_s = per_row if old is None else (1 - COST_EMA) * old + COST_EMA * per_row

    def catch_up(self, rows: int) -> float:
        """What a drafter pass costs beyond a steady one for `rows` context rows it must first
        catch up on (decoded plainly since the sequence's last drafting round, beyond a block's
        worth): each goes through the drafter's context projection and K/V (0 until measured)."""
        return rows * self.context_row_s if rows and self.context_row_s else 0.0

    def overheads(self, batch: int) -> tuple[float, float]:
        """The rest of a round of `batch` sequences (all but its model calls and walk): a plain
        round's and a wider one's, measured apart (a wide round packs trees and commits paths, so
        one average overprices plain rounds); either stands in for the other until both are measured."""
        plain, wide = ({b: s for (b, w), s in self.overhead_s.items() if w == kind} for kind in (False, True))
        if not plain and not wide:
            return 0.0, 0.0
        return interpolate(plain or wide, batch), interpolate(wide or plain, batch)

    def record_walk(self, batch: int, tokens: int, secs: float) -> None:
        """The verify walk (sampling every row, then the accept walk) of a round: a plain round's
        is the base; a wider one's excess over it, per extra row, is the row cost (with top-p each
        row is a vocabulary sort, which can cost more than the row's share of the forward)."""
        if tokens == 1:
            self._ema(self.walk_s, batch, secs)
        elif batch in self.walk_s:
            self._ema(self.walk_row_s, batch, max(secs - self.walk_s[batch], 0.0) / (batch * (tokens - 1)))

    def round_cost(self, batch: int, tokens):
        """A round without its draft: the verify forward, its sampling walk and the round's other
        work (`tokens`: a width >= 1, or an array of them). None until a forward is measured."""
        if isinstance(tokens, int) or np.ndim(tokens) == 0:
            curve = self.round_costs(batch, int(tokens))
            return None if curve is None else curve[int(tokens)]
        tokens = np.asarray(tokens)
        curve = self.round_costs(batch, int(tokens.max()))
        return None if curve is None else np.asarray(curve)[tokens]

    def round_costs(self, batch: int, top: int) -> list[float] | None:
        """round_cost of every width 0..>= top as a list (index 0: nan), kept until the next record:
        a round's verdict and its fit read it several times, and the table changes once a round."""
        if not self.verify_s:
            return None
        curve = self._curves.get(batch)
        if curve is None or len(curve) <= top:
            curve = self._curves[batch] = self._curve(batch, top)
        return curve

    def _curve(self, batch: int, top: int) -> list[float]:
        """[nan, round cost of width 1, ..., of width top] (see round_costs)."""
        own = self._grouped().get(batch, {})
        widths = range(1, top + 1)
        verify = line(own, widths) if len(own) >= 2 else self.verify(batch, np.arange(1, top + 1)).tolist()
        base = interpolate(self.walk_s, batch) if self.walk_s else 0.0
        row = interpolate(self.walk_row_s, batch) if self.walk_row_s else 0.0
        plain, wide = self.overheads(batch)
        # verify + walk (base + row per extra row verified) + the overhead (width 1: a plain round's)
        return [math.nan] + [v + base + row * batch * (w - 1) + (plain if w == 1 else wide)
                             for w, v in zip(widths, verify)]

    def observe(self, batch: int, tokens: int, drafted: int, times: RoundTimes, seconds: float,
                caught_up: int = 0) -> None:
        """Learn from one round's phase times (`Engine.round_times`) and its whole wall time
        `seconds` (the step's, less its prefill): the verify forward at its shape; the drafter
        pass and tree build at the number of sequences it drafted (if any) — or, when the pass
        `caught_up` on that many context rows (a prompt, or what was decoded plainly since the
        last drafting round, beyond a block's worth a sequence), what it cost beyond a steady
        pass, per row (neither the steady pass's cost, which it would inflate, nor nothing, which
        would underprice the next probe); the sampling walk (it grows with the rows verified);
        and all the rest — packing, commit, scheduling, Python — which a plain round pays too."""
        if not self.learn:
            return
        self.record_verify(batch, tokens, times.verify_forward)
        draft = times.draft + times.tree
        if drafted and not caught_up and drafted not in self._passes_seen:
            self._passes_seen.add(drafted)  # a first pass at a batch size is a cold call (~100x a steady one, eager)
        elif drafted and not caught_up:
            self.record_draft(drafted, draft)
        elif drafted and self.draft_s:
            self.record_catch_up(caught_up, max(draft - self.draft(drafted), 0.0))
        walk = times.verify_walk
        self.record_walk(batch, tokens, walk)
        self.record_overhead(batch, tokens, max(seconds - times.verify_forward - draft - walk, 0.0))


# -------------------------------------------------------------------------------- the choice
def token_rates(curves: list, costs: CostTable, batch: int, draft_cost: float,
                floor: int = 1, fixed: float = 0.0) -> list[tuple[int, float]] | None:
    """Expected committed tokens per second of the round for each forward width T >= floor (the
    widest tree of the batch's other sequences): (fixed + sum of each curve at min(T-1, its last
    node)) / (draft_cost + round cost at T). `fixed`: tokens expected from the other sequences.
    Returns [(T, rate)] in increasing T, or None while no forward is measured."""
    top = max([floor] + [len(c) for c in curves])
    cost = costs.round_costs(batch, top)
    if cost is None:
        return None
    gain = [fixed] * (top + 1)  # gain[T]: the tokens a width-T forward is expected to commit
    for c in curves:
        n = len(c)
        for T in range(floor, top + 1):
            gain[T] += c[T - 1] if T <= n else c[n - 1]
    return [(T, gain[T] / (draft_cost + cost[T])) for T in range(floor, top + 1)]


def choose_tokens(curves: list, costs: CostTable, batch: int, draft_cost: float,
                  floor: int = 1, fixed: float = 0.0) -> int:
    """The forward's tokens per sequence T (1 = plain) with the best expected token rate; ties go
    to the smaller T. Unmeasured costs: the widest tree (trust the drafter until timed)."""
    rates = token_rates(curves, costs, batch, draft_cost, floor, fixed)
    if rates is None:
        return max([floor] + [len(c) for c in curves])
    return max(rates, key=lambda tr: (tr[1], -tr[0]))[0]


def prefix(tree: DraftTree, nodes: int) -> DraftTree:
    """The tree's root and its first `nodes` nodes: in best-first pop order that is the tree a
    budget of `nodes` would have built (parents precede children, so it is a tree)."""
    if nodes + 1 >= tree.size:
        return tree
    n = nodes + 1
    return DraftTree(tree.tokens[:n], tree.parents[:n], tree.depths[:n], tree.logprobs[:n])


# ---------------------------------------------------------------------------- the controller
@dataclass(slots=True, frozen=True)
class Choice:
    """One auto sequence's round: the nodes it verifies and the tau they are expected to give."""
    nodes: int
    predicted_tau: float
    paths: np.ndarray | None   # path log-probs of its whole drafted tree (root excluded); None: no draft
    break_even: float = 2.0    # the tau at which this round's measured cost matches plain decoding's rate


PLAIN = Choice(0, 1.0, None)   # a plain round's choice (no draft: one token expected)


@dataclass(slots=True)
class AutoState:
    setting: tuple                        # its sampling setting (see `setting`: a request's never changes)
    metrics: RequestMetrics               # its request's metrics: `rounds` counts its committed rounds
    calibration: Calibration = field(default_factory=Calibration)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_TREES))  # the path log-probs (root
                                          # excluded) of its last drafted trees, oldest first
    drafted_at: int = 0                   # metrics.rounds after the last round it drafted in (see undrafted)
    probe_gap: int | None = None          # undrafted rounds before the next probe; None: the controller's
                                          # probe_every (it backs off, see settle)
    prefers_plain: bool = False           # the last verdict on its current curve: plain decoding is faster
    probed: bool = False                  # its last drafted round came after a plain verdict (a probe)
    drafted: int = 0                      # rounds it drafted in
    started_plain: bool = False           # it began on plain rounds with a probe clock passed on (see state)
    grams: set = field(default_factory=set)  # the REPEAT_NGRAM-grams of its committed tokens so far
    seen: int = 0                         # committed tokens already in `grams`
    batch: int = 1                        # the size of the batch it last ran in
    repeats: bool = False                 # the last committed REPEAT_NGRAM-gram occurred earlier (as of
                                          # the last decision that read it: `repeats` runs in wants_draft
                                          # only, for a round that may draft or a regime with repeat credit)

    @property
    def undrafted(self) -> int:
        """Rounds since it last drafted: counted by the request's own round count, so a plain
        round costs the controller no call at all."""
        return self.metrics.rounds - self.drafted_at

    @undrafted.setter
    def undrafted(self, rounds: int) -> None:
        self.drafted_at = self.metrics.rounds - rounds


@dataclass(slots=True)
class Steady:
    """A batch whose plain verdict stands without a look at its sequences' states: the same
    sequences in a batch of the same size, for `rounds` more rounds — until the first of them is
    due for a probe — unless repeats of `callers` (those with repeat credit) call one. Any drafting
    round ends it (learn, settle: they change what the verdict read)."""
    seqs: list
    batch: int
    rounds: int
    callers: list   # [(seq, its AutoState)]


def repeats(seq: Sequence, st: AutoState, n: int = REPEAT_NGRAM) -> bool:
    """Whether the last n-gram of seq's committed tokens (prompt + output) occurred earlier in
    them; `st` keeps the n-grams seen so far, so each call only adds the new tokens' n-grams."""
    P, out = seq.prompt_ids, seq.output_ids
    total = len(P) + len(out)
    if st.seen == total:
        return st.repeats
    if total == st.seen + 1 and len(out) >= n:  # one new token (a plain round): its one n-gram
        g = tuple(out[-n:])
        st.repeats, st.seen = g in st.grams, total
        st.grams.add(g)
        return st.repeats
    base = max(0, st.seen - n + 1)  # the first new n-gram starts here: it ends at max(seen + 1, n)
    toks = (P[base:] + out) if base < len(P) else out[base - len(P):]
    new = list(zip(*(toks[i:] for i in range(n))))  # the new n-grams in order (a 100-token prompt:
    if new:                                         # 27 us, against 49 with a tuple() per n-gram)
        last = new[-1]  # it repeats if it occurred before: among the old n-grams or earlier new ones
        st.repeats = last in st.grams or new.index(last) < len(new) - 1
        st.grams.update(new)
    st.seen = total
    return st.repeats


class AdaptiveBudget:
    """The engine's `budget="auto"` controller: per-sequence calibration, one cost table."""

    def __init__(self, probe_every: int = PROBE_EVERY):
        self.costs = CostTable()
        self.probe_every = probe_every
        self.states: dict[Sequence, AutoState] = {}
        # regime (setting, batch class) -> (probe gap, plain rounds since the last probe) a new sequence starts
        # with: set when the last sequence of that regime to finish found drafting did not pay (see
        # release); absent: start by drafting
        self.starts: dict[tuple, tuple[int, int]] = {}
        # regime (setting, batch class) -> tokens its drafting rounds decided while the text repeated
        # committed beyond what plain rounds would have in the same time (sum of tau - break-even):
        # a repeat calls a re-probe while REPEAT_PRIOR + gain > 0
        self.repeat_gain: dict[tuple, float] = {}
        self.steady: Steady | None = None  # the last plain verdict, while it stands (see Steady)

    def state(self, seq: Sequence, batch: int | None = None) -> AutoState:
        """seq's state (created on first sight, in a batch of `batch`); its batch size noted."""
        st = self.states.get(seq)
        if st is None:
            key = setting(seq)
            start = (self.starts.get(regime(key, batch or 1)) if self.starts else None) or self._peers_clock(seq)
            st = self.states[seq] = AutoState(key, seq.metrics, drafted_at=seq.metrics.rounds)
            if start is not None:
                st.probe_gap, st.undrafted, st.prefers_plain, st.started_plain = start[0], start[1], True, True
        if batch is not None:
            st.batch = batch
        return st

    def _peers_clock(self, seq: Sequence) -> tuple[int, int] | None:
        """A sequence joining running sequences of its sampling setting that all decode plainly
        starts plain too, on the probe clock of the one that backed off most: its own first
        drafting round would draft (and verify the widest tree) for the whole batch, so frequent
        arrivals would keep a batch drafting that should decode plainly. Else None."""
        key = setting(seq)
        peers = [st for st in self.states.values() if st.setting == key]
        if not peers or not all(st.prefers_plain for st in peers):
            return None
        st = max(peers, key=lambda st: (st.probe_gap or self.probe_every, st.undrafted))
        gap = st.probe_gap or self.probe_every
        return gap, min(st.undrafted, gap - 1)

    def wants_draft(self, seqs: list[Sequence], batch: int, catch_up: Callable[[], int] | None = None,
                    held: int = 0) -> bool:
        """Should the drafter run for these auto sequences (a batch of `batch`, all auto; `held`:
        the batch the engine has work for, prefilling and waiting sequences included — the batch
        size class they run in, see `regime`)? Yes
        unless every one has a curve, none is due for a re-probe, at most half the batch has a
        repeat calling one (see _repeats_call: the pass and the widest tree are paid by every
        sequence of the batch), and plain decoding's predicted rate beats the best rate with the
        drafter's cost included — with the context rows the pass would first feed (`catch_up()`:
        what the sequences decoded plainly since they last drafted; asked only when the curves
        are compared), which this round pays."""
        if self.holds(seqs, batch):
            return False
        self.steady = None
        states = [self.state(s, max(batch, held)) for s in seqs]
        c = self.costs
        # plain-decoding sequences whose regime has repeat credit: a repeat of theirs calls a probe
        callers = [(s, st) for s, st in zip(seqs, states) if st.prefers_plain and self._credit(st)]
        # those whose n-grams are up to date first: a count that stops early then never reads the
        # others (catching up is the costly part: a newcomer's whole prompt)
        callers.sort(key=lambda c: len(c[0].prompt_ids) + len(c[0].output_ids) - c[1].seen)
        due = not c.measured or not c.draft_s or any(self._due(st) for st in states) \
            or self._repeats_call(callers, batch)
        if not due and all(st.prefers_plain for st in states):  # no new curve since that verdict: it
            self.steady = Steady(list(seqs), batch, min(self._rounds_to_probe(st) for st in states) - 1, callers)
            return False                                        # stands until the first of them is due
        for s, st in zip(seqs, states):  # a round that may draft: settle reads whether each one's text repeats
            repeats(s, st)
        if due:
            return True
        curves = [recent_curve(st) for st in states]
        fixed = batch - len(seqs)
        draft = c.draft(batch) + c.catch_up(catch_up() if catch_up else 0)
        spec = token_rates(curves, c, batch, draft, floor=2, fixed=fixed)
        plain = (fixed + len(seqs)) / c.round_cost(batch, 1)
        wants = bool(spec) and max(r for _, r in spec) > plain
        for st in states:
            st.prefers_plain = not wants
        return wants

    def holds(self, seqs: list[Sequence], batch: int) -> bool:
        """The standing plain verdict (`Steady`) covers these auto sequences in a batch of `batch`
        for one more round: nothing it read has changed and no repeat of its callers calls a probe.
        Uses the round up. (Under cProfile a look cost ~5 us a round at T=0, C=8 and ~19 at T=1,
        C=8, where eight callers' repeats are read.)"""
        hold = self.steady
        if hold is None or hold.rounds <= 0 or hold.batch != batch or hold.seqs != seqs \
                or (hold.callers and self._repeats_call(hold.callers, batch)):
            return False
        hold.rounds -= 1
        return True

    def _due(self, st: AutoState) -> bool:
        """A sequence with no curve yet (unless it started plain, see release) or whose probe gap
        has passed drafts this round (the drafter then runs for the whole batch, so one pass serves
        every due sequence and resets all their gaps together)."""
        if not st.recent and st.probe_gap is None:
            return True
        return self._rounds_to_probe(st) <= 0

    def _rounds_to_probe(self, st: AutoState) -> int:
        """Rounds after this one before st's probe gap has passed (<= 0: this round)."""
        return (st.probe_gap or self.probe_every) - st.undrafted - 1

    @staticmethod
    def _repeats_call(callers: list[tuple[Sequence, AutoState]], batch: int) -> bool:
        """More than half of a batch of `batch` are callers (plain-decoding sequences whose regime
        has repeat credit, see _credit) whose text repeats itself; counting stops once the rest
        could not make that majority (the others' n-grams catch up when they next matter)."""
        need, left = batch // 2 + 1, len(callers)
        for s, st in callers:
            if need > left:
                return False
            need, left = need - repeats(s, st), left - 1
            if need <= 0:
                return True
        return False

    def _credit(self, st: AutoState) -> bool:
        """Drafting rounds decided in repeating text have gained tokens over plain decoding on the
        whole in st's regime (REPEAT_PRIOR to start with)."""
        return REPEAT_PRIOR + self.repeat_gain.get(regime(st.setting, st.batch), 0.0) > 0

    def fit(self, batch: list[Sequence], trees: list[DraftTree], drafted: int, caught_up: int = 0,
            held: int = 0) -> tuple[list[DraftTree], list[Choice | None]]:
        """Pick the round's forward width and cut each auto sequence's tree to it. `drafted`: the
        sequences the drafter pass ran for (its cost counts, with the `caught_up` context rows it
        fed first: a probe's break-even is what the probe cost); `held`: as in wants_draft.
        Returns the trees and, per sequence, its `Choice` (None for a sequence with a fixed budget)."""
        if not drafted and all(t.size == 1 for t in trees):  # a plain round: nothing to choose
            return trees, [PLAIN if s.auto else None for s in batch]
        auto = [b for b, s in enumerate(batch) if s.auto]
        if not auto:
            return trees, [None] * len(batch)
        paths = {b: path_logprobs(trees[b])[1:] for b in auto}  # [N_b] each (empty: not drafted)
        curves = {b: tau_curve(paths[b], self.state(batch[b], max(len(batch), held)).calibration) for b in auto}
        floor = max([trees[b].size for b in range(len(batch)) if b not in curves] + [1])
        draft_cost = (self.costs.draft(drafted) or 0.0) + self.costs.catch_up(caught_up) if drafted else 0.0
        T = choose_tokens(list(curves.values()), self.costs, len(batch), draft_cost, floor,
                          fixed=len(batch) - len(auto))
        plain, spent = self.costs.round_cost(len(batch), 1), self.costs.round_cost(len(batch), T)
        # the round costs (draft + forward at T) what `break_even` plain rounds do: each sequence
        # must commit that many tokens for drafting to have paid
        break_even = (draft_cost + spent) / plain if plain else 2.0
        trees, choices = list(trees), [None] * len(batch)
        for b, curve in curves.items():
            n = min(T - 1, trees[b].size - 1)
            choices[b] = Choice(n, float(curve[n]), paths[b] if trees[b].size > 1 else None, float(break_even))
            trees[b] = prefix(trees[b], n)
        return trees, choices

    def learn(self, seq: Sequence, tree: DraftTree, path: list[int], choice: Choice) -> None:
        """After the commit (seq.metrics.rounds counts it): the verified nodes train the
        calibration; the drafted tree is the next round's curve. A round that drafted nothing for
        seq teaches nothing (its undrafted rounds count themselves): the engine calls it only for
        a sequence that drafted."""
        if choice.paths is None:  # nothing drafted for it (its tree was the root)
            return
        st = self.state(seq)
        if tree.size > 1:
            accepted = np.zeros(tree.size, dtype=bool)
            accepted[path] = True
            st.calibration.update(path_logprobs(tree)[1:], accepted[1:])
        st.probed = st.prefers_plain  # drafted after a plain verdict: settle judges the probe
        st.recent.append(choice.paths)
        st.undrafted, st.prefers_plain = 0, False  # a fresh curve (a probe's gap: settle)
        self.steady = None

    def settle(self, drafted: list[tuple[Sequence, Choice, int]]) -> None:
        """After a round's commits: (sequence, its choice, its tau) for each auto sequence that
        drafted. The drafter ran for all of them at once, so they share one verdict on their mean
        tau and one probe gap, the largest of theirs: a round that beat plain decoding (it verified
        draft nodes and tau >= break_even) resets it to PROBE_EVERY. A probe (a round drafted after
        a plain verdict) that did not beat it: one that recovered at least half of what it cost over
        a plain round (tau >= 1 + (break_even - 1) / 2) keeps the gap; any other doubles it, up to
        MAX_PROBE_GAP (committed outcomes and measured costs only: lossless). A losing round of a
        drafting streak changes no gap: its sequences' curves said drafting pays, and whether they
        still do is the next verdict's (one round's tau is noisy; backing off on it stopped drafting
        that paid 1.8x plain decoding on average).
        A gap after a round that did not beat plain decoding is also at least the probe's loss in
        plain rounds (break_even - tau) / PROBE_LOSS, so a batch whose probes commit a little more
        than a plain round but less than they cost probes rarely. The verdict and the gap are the
        batch's, not each sequence's: one lucky sequence cannot keep the whole batch probing, and
        the batch does not probe whenever its first member is due. A sequence's first drafted round gives
        it no verdict (its acceptance is not yet what it will be) unless it started on plain rounds
        with a passed-on probe clock (see release): then its first probe comes mid-text. What the
        round gained over plain decoding (mean tau - break_even) counts, per regime, for the
        sequences whose text repeated (see _credit)."""
        if not drafted:
            return
        self.steady = None
        mean_tau = sum(tau for _, _, tau in drafted) / len(drafted)
        break_even = drafted[0][1].break_even
        verified = any(c.nodes > 0 for _, c, _ in drafted)
        paid = verified and mean_tau >= 1 + (break_even - 1) / 2
        beat = verified and mean_tau >= break_even  # faster than plain rounds, not just half-way
        loss_gap = math.ceil((break_even - mean_tau) / PROBE_LOSS)  # the probe lost this many plain rounds x 100
        judged = []
        for seq, _, _ in drafted:
            st = self.state(seq)
            st.drafted += 1
            if st.repeats:
                key = regime(st.setting, st.batch)
                self.repeat_gain[key] = self.repeat_gain.get(key, 0.0) + mean_tau - break_even
            # the first drafted round of a sequence that started by drafting judges nothing: acceptance
            # starts low and climbs over the first rounds (T=0: tau 2.5, 2.3, 3.0, 3.5, 4.3 -> 4.0 mean)
            if st.drafted > 1 or st.started_plain:
                judged.append(st)
        if not judged or not (beat or any(st.probed for st in judged)):
            return
        # one gap for the batch, from the one that backed off most (see the docstring)
        base = max(st.probe_gap or self.probe_every for st in judged)
        gap = None if beat else min(max(base * (1 if paid else 2), loss_gap), MAX_PROBE_GAP)
        for st in judged:
            st.probe_gap = gap

    def release(self, seq: Sequence) -> None:
        """The sequence left the engine. If it finished with its last two probe rounds unpaid (a
        gap of at least INHERIT_GAP), the next sequence of its regime starts where it
        left off: plain rounds, its probe clock where this one's stood (the plain rounds since
        its last probe count), so the setting re-probes as one long sequence would — not a
        drafting round and a probe every 8, 16, 32 rounds, which every request otherwise pays (at
        T=1 C=8 five drafting rounds in 96), and not a gap that outlasts every request. Else the
        next one starts by drafting. Committed outcomes only, so lossless; a setting whose probes
        start paying again stops passing a gap on."""
        st = self.states.pop(seq, None)
        if st is None or not seq.finished:  # preempted: it comes back with a fresh state
            return
        if (st.probe_gap or 0) >= INHERIT_GAP:
            self.starts[regime(st.setting, st.batch)] = (st.probe_gap, min(st.undrafted, st.probe_gap - 1))
        else:
            self.starts.pop(regime(st.setting, st.batch), None)


# ----------------------------------------------------------------------------- seeding costs
