"""Auto's costs: measured seconds of a round's parts, and the forward width they make fastest.

`CostTable` (one per engine) holds measured seconds of the drafter pass by batch size (and per
context row it must first catch up on), of the verify forward by (batch size, tokens per
sequence), of the sampling walk and of the rest of a round by batch size; seeded by timing real
forwards on free cache slots (`engine/cost_seeding.py`) and refreshed online from the engine's
typed per-round phase times (`RoundTimes`, an EMA). Once a batch size is seeded, its verify costs
are the seeds' line x the batch's clock (`drift`: how the rounds run against the seeds, followed
quickly, every round at any width moving it) x each width's own residual (learnt slowly from
that width's rounds): the machine's speed moves every width at once, so a width measured
minutes ago and one measured now are priced on the same clock, and a width's timing noise stays
its own. A measurement counts as at most `COST_SPIKE` x the estimate it moves: a forward runs
slower, never faster, than its cost when another process or a cold call interrupts it. No
hand-written constants of the machine.
`token_rates` / `choose_tokens`: the forward's tokens per sequence T (1 = plain decoding)
maximising expected committed tokens / (drafter cost + round cost at T), given E[tau | N] curves
(`calibration.py`). This module does not decide whether to draft (`adaptive.py`) or time anything.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..engine.round import RoundTimes

COST_EMA = 0.2          # weight of a new measurement in the cost table
RESIDUAL_EMA = 0.02     # weight of a round in its width's residual against the batch's clock: slow,
                        # so that what every width shares (the machine's speed) goes to the clock
COST_SPIKE = 1.25       # a measurement counts as at most this multiple of the estimate it moves


def eased(old: float, new: float, rate: float = COST_EMA) -> float:
    """`old` moved `rate` of the way to `new`, with `new` clipped at COST_SPIKE x old: timing
    noise is one-sided (an interrupted forward takes longer, none runs faster than its cost), so
    one spike moves the estimate 5 % instead of 20 % of the spike; a real slowdown of 40 % is
    followed within ten rounds, and a drop at the EMA's full rate. (An estimate of 0, as tests
    pin one, is not a scale to clip by.)"""
    if old > 0:
        new = min(new, COST_SPIKE * old)
    return old + rate * (new - old)


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
    catch_up_ema: tuple[float, float] | None = None  # EMAs of (rows, excess seconds) of the catch-up passes
    wide_error: dict[int, float] = field(default_factory=dict)  # batch -> its steady drafting rounds' wall time
                                                                # over their predicted cost (an EMA; see error)
    drift: dict[int, float] = field(default_factory=dict)  # seeded batch -> its clock: rounds' verify seconds
                                                           # over the seeds' line x the width's residual
    learn: bool = True
    _seeds: dict[int, dict[int, float]] = field(default_factory=dict, repr=False)  # batch -> {tokens: seeded secs}
    _residual: dict[int, dict[int, float]] = field(default_factory=dict, repr=False)  # seeded batch -> {tokens:
                                                           # a round-measured width's cost over line x clock}
    _rounds: dict[int, set[int]] = field(default_factory=dict, repr=False)  # batch -> widths a round measured
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

    def seed_verify(self, batch: int, tokens: int, secs: float) -> None:
        """A verify forward timed apart from any round (`CostSeeder`): a point of the batch's seed
        line, which prices the batch from its second seed on (`_price_seeded`). A seed moves only
        widths no round has measured: those keep their price, their residuals rescaled to the new
        line. The first line's clock is where the rounds so far run against it (the geometric mean
        of their ratios), so seeded widths no round uses are priced on the rounds' clock at once."""
        seeds = self._seeds.setdefault(batch, {})
        seeds[tokens] = secs
        measured = {t: self.verify_s[batch, t] for t in sorted(self._rounds.get(batch, ()))}
        if len(seeds) < 2:
            if tokens not in measured:
                self.verify_s[batch, tokens] = secs
                self._invalidate()
            return
        lines = line(seeds, list(measured))
        if batch not in self.drift and measured:
            self.drift[batch] = math.exp(statistics.fmean(math.log(p / fit) for p, fit in zip(measured.values(), lines)))
        clock = self.drift.get(batch, 1.0)
        self._residual[batch] = {t: p / (fit * clock) for (t, p), fit in zip(measured.items(), lines)}
        self._price_seeded(batch)

    def record_verify(self, batch: int, tokens: int, secs: float) -> None:
        """A round's verify forward. A seeded batch: the clock moves quickly toward this round's
        ratio to its predicted cost, and this width's residual slowly toward what the clock leaves
        unexplained (the residuals of the measured widths average 1); every width is then
        repriced (line x clock x residual). Else: the width's own EMA (`eased`)."""
        self._rounds.setdefault(batch, set()).add(tokens)
        seeds = self._seeds.get(batch)
        if seeds is None or len(seeds) < 2:
            old = self.verify_s.get((batch, tokens))
            self.verify_s[batch, tokens] = secs if old is None else eased(old, secs)
            self._invalidate()
            return
        base = line(seeds, [tokens])[0]
        residuals = self._residual.setdefault(batch, {})
        r = residuals.get(tokens, 1.0)
        clock = eased(self.drift.get(batch, 1.0), secs / (base * r))
        residuals[tokens] = eased(r, secs / (base * clock), RESIDUAL_EMA)
        # what the residuals share is the clock's: their geometric mean moves to it (no measured
        # width's price changes; the widths no round measures follow the measured ones)
        mean = math.exp(statistics.fmean(map(math.log, residuals.values())))
        for t in residuals:
            residuals[t] /= mean
        self.drift[batch] = clock * mean
        self._price_seeded(batch)

    def _price_seeded(self, batch: int) -> None:
        """verify_s of a seeded batch: at every seeded or round-measured width, the seeds' line x
        the batch's clock x the width's residual (1 where no round measured it)."""
        seeds, clock = self._seeds[batch], self.drift.get(batch, 1.0)
        residuals = self._residual.get(batch, {})
        widths = sorted(set(seeds) | self._rounds.get(batch, set()))
        for t, s in zip(widths, line(seeds, widths)):
            self.verify_s[batch, t] = s * clock * residuals.get(t, 1.0)
        self._invalidate()

    def _invalidate(self) -> None:
        self._curves.clear()
        self._by_batch = None

    def record_draft(self, batch: int, secs: float) -> None:
        old = self.draft_s.get(batch)
        self.draft_s[batch] = secs if old is None else eased(old, secs)
        self._curves.clear()

    def seed_draft(self, batch: int, secs: float) -> None:
        """A drafter pass timed apart from any round (`CostSeeder`): the entry, unless a round has
        measured that batch size already."""
        if batch not in self.draft_s:
            self.draft_s[batch] = secs

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
        """A drafter pass that caught up on `rows` context rows cost `secs` more than a steady pass
        (negative when it ran faster: timing noise). The per-row cost is the ratio of the EMAs of
        rows and seconds — a line through the origin, each pass weighted by its rows — not an EMA
        of each pass's secs / rows: the excess of a pass that caught up on 2 rows is mostly the
        steady pass's noise (steady passes of 9-15 ms at C=8, amx), and divided by 2 it would price
        a row at ~1 ms, 20x and more what long catch-ups measure (0.006-0.05 ms a row): every probe
        after a plain stretch would look ruinous, and a repeat-called one would be judged on that
        price."""
        if self.catch_up_ema is None:
            self.catch_up_ema = (float(rows), secs)
        else:
            r, s = self.catch_up_ema
            self.catch_up_ema = (r + COST_EMA * (rows - r), s + COST_EMA * (secs - s))

    @property
    def context_row_s(self) -> float | None:
        """Drafter pass seconds per context row it catches up on (see `record_catch_up`), never
        below 0; None until a catch-up is measured."""
        if self.catch_up_ema is None:
            return None
        rows, secs = self.catch_up_ema
        return max(secs, 0.0) / rows

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

    def error(self, batch: int) -> float:
        """How drafting rounds of `batch` sequences have run against their predicted cost (1 until
        one is measured): the factor a drafting round's predicted cost is multiplied by before it
        is weighed against plain decoding. The prediction is biased low where it matters: a batch
        size no seed priced (C=8 beside seeds at 1 and 16) has each width's price from its own
        rounds, the wide ones measured minutes apart from the plain one, and a round is drafted
        exactly when its price looks low — at C=8, T=0 (amx) rounds predicted at 1.02-1.07x plain
        decoding's rate ran at 0.78-0.92x, their wall time 5-10 % over the prediction."""
        return self.wide_error.get(batch, 1.0)

    def priced(self, batch: int, tokens: int, secs: float) -> float:
        """`secs` (a round's predicted draft + round cost at width `tokens`) as the choice weighs
        it: a drafting width's times `error(batch)`, a plain one's as it is."""
        return secs * self.error(batch) if tokens > 1 else secs

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
        draft = times.draft + times.tree
        if tokens > 1 and drafted and not caught_up and drafted in self._passes_seen and self.draft_s:
            # a steady drafting round against its prediction, priced before this round's records
            predicted = self.round_cost(batch, tokens) + self.draft(drafted)
            self.wide_error[batch] = eased(self.error(batch), seconds / predicted)
        self.record_verify(batch, tokens, times.verify_forward)
        if drafted and not caught_up and drafted not in self._passes_seen:
            self._passes_seen.add(drafted)  # a first pass at a batch size is a cold call (~100x a steady one, eager)
        elif drafted and not caught_up:
            self.record_draft(drafted, draft)
        elif drafted and self.draft_s:
            self.record_catch_up(caught_up, draft - self.draft(drafted))
        walk = times.verify_walk
        self.record_walk(batch, tokens, walk)
        self.record_overhead(batch, tokens, max(seconds - times.verify_forward - draft - walk, 0.0))


# -------------------------------------------------------------------------------- the choice
def token_rates(curves: list, costs: CostTable, batch: int, draft_cost: float,
                floor: int = 1, fixed: float = 0.0) -> list[tuple[int, float]] | None:
    """Expected committed tokens per second of the round for each forward width T >= floor (the
    widest tree of the batch's other sequences): (fixed + sum of each curve at min(T-1, its last
    node)) / (draft_cost + round cost at T), priced by `CostTable.priced` (a drafting width's
    corrected by how such rounds ran).
    `fixed`: tokens expected from the other sequences.
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
    return [(T, gain[T] / costs.priced(batch, T, draft_cost + cost[T])) for T in range(floor, top + 1)]


def choose_tokens(curves: list, costs: CostTable, batch: int, draft_cost: float,
                  floor: int = 1, fixed: float = 0.0) -> int:
    """The forward's tokens per sequence T (1 = plain) with the best expected token rate; ties go
    to the smaller T. Unmeasured costs: the widest tree (trust the drafter until timed)."""
    rates = token_rates(curves, costs, batch, draft_cost, floor, fixed)
    if rates is None:
        return max([floor] + [len(c) for c in curves])
    return max(rates, key=lambda tr: (tr[1], -tr[0]))[0]


def drafting_pays(curves: list, costs: CostTable, batch: int, draft_cost: float, fixed: float = 0.0) -> bool:
    """Whether the best expected token rate of a drafting round (widths >= 2, the drafter's
    `draft_cost` included) beats plain decoding's: `fixed` + one token per curve a plain round.
    False while no forward is measured."""
    spec = token_rates(curves, costs, batch, draft_cost, floor=2, fixed=fixed)
    if not spec:
        return False
    plain = (fixed + len(curves)) / costs.round_cost(batch, 1)
    return max(r for _, r in spec) > plain
