"""`budget="auto"`: the tree size each round that maximises expected committed tokens per second.

The pieces (SPEC §2 "Adaptive budget") live beside this module, each pure: `calibration.py`
(E[tau | N] of a tree from its draft probabilities, calibrated per sequence), `costs.py` (the
measured cost of a round by batch and width, the width that is fastest, whether drafting pays) and
`probes.py` (when a sequence that decodes plainly drafts again). `AdaptiveBudget` is the engine's
controller. Each auto sequence's state is a value (`AutoState`); the rules are pure functions
of states and inputs that return new states — `started`, `verdict`, `learned`, `settled`,
`repeat_gains` — and the controller keeps what they return. The engine calls it four times a
round at most:

1. `depths` (before drafting), through `decide`, which keeps the states `verdict` returns:
   the drafter runs unless every sequence's verdict is plain —
   its mean curve of its last RECENT_TREES trees predicts plain decoding is faster, drafter cost
   included — and none is due for a probe or has repeating text calling one (`repeats`: the
   committed tokens' last 3-gram occurred earlier, where acceptance is high, while such rounds
   have gained tokens over plain ones in the regime). A plain verdict stands unread (`Steady`)
   while its batch is unchanged and no probe is due.
2. `fit` (after the trees are built): picks the forward width T and cuts each auto sequence's
   tree to its first T-1 nodes.
3. `observe` (after the commit): `learn` and `settle` — the verified nodes train the calibration, the tree
   becomes the next curve, and the batch's probe gap follows `probes.gap_after`.
4. `release` (a sequence leaves): a regime whose probes stopped paying passes its clock on.

Every input is committed history, draft probabilities or measured time — never the current
round's verify draws — so the choice keeps decoding lossless. Decisions read state and return
(`decide` and `holds` give the same answer asked twice in a step; `fit` changes nothing a
verdict reads), so a round rerun per sequence decides as the batch did. This module does not
build trees, verify or sample.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from .calibration import Calibration, mean_curve, path_logprobs, tau_curve
from .costs import CostTable, choose_tokens, drafting_pays
from .probes import (
    PROBE_EVERY,
    beats_plain,
    gap_after,
    passed_on,
    peers_clock,
    rounds_to_probe,
)
from .tree import DraftTree, prefix

if TYPE_CHECKING:
    from ..engine.sequence import RequestMetrics, Sequence

RECENT_TREES = 4        # the plain-or-draft verdict reads the mean curve of a sequence's last 4 trees:
                        # one tree is a noisy guess of the next (real pair, T=0: one unsure tree sent
                        # a sequence that drafted at tau 2.6 to plain rounds for most of its answer)
REPEAT_NGRAM = 3        # a plain-decoding sequence whose last 3-gram occurred earlier re-probes at once:
                        # repeating text is where drafts are accepted (the target's confidence is no guide)
REPEAT_PRIOR = 1.0      # ... while drafting rounds decided in repeating text gained tokens over plain rounds
                        # on the whole (this many to start with): such rounds win big or lose, so the
                        # credit counts tokens gained, not how often a round beat plain decoding


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
class RepeatIndex:
    """The REPEAT_NGRAM-grams of a sequence's committed tokens so far, and whether the last one
    occurred earlier: a cache that `repeats` brings up to date when a decision reads it (filling
    it changes no answer), so it is shared by every value of the sequence's `AutoState`."""
    grams: set = field(default_factory=set)
    seen: int = 0           # committed tokens already in `grams`
    repeats: bool = False   # the last committed n-gram occurred earlier (as of the last read: `repeats`
                            # runs in decide only, for a round that may draft or a regime with repeat credit)


@dataclass(slots=True, frozen=True)
class AutoState:
    """One auto sequence's state, a value: the controller's pure transitions (`started`,
    `verdict`, `learned`, `settled`) return new ones."""
    setting: tuple                        # its sampling setting (see `setting`: a request's never changes)
    metrics: RequestMetrics               # its request's metrics: `rounds` counts its committed rounds
    calibration: Calibration = field(default_factory=Calibration)
    recent: tuple = ()                    # the path log-probs (root excluded) of its last RECENT_TREES
                                          # drafted trees, oldest first
    drafted_at: int = 0                   # metrics.rounds after the last round it drafted in (see undrafted)
    probe_gap: int | None = None          # undrafted rounds before the next probe; None: the controller's
                                          # probe_every (it backs off, see settled)
    prefers_plain: bool = False           # the last verdict on its current curve: plain decoding is faster
    probed: bool = False                  # its last drafted round came after a plain verdict (a probe)
    drafted: int = 0                      # rounds it drafted in
    started_plain: bool = False           # it began on plain rounds with a probe clock passed on (see started)
    batch: int = 1                        # the size of the batch it last ran in
    text: RepeatIndex = field(default_factory=RepeatIndex)  # its committed n-grams (a cache, see RepeatIndex)

    @property
    def undrafted(self) -> int:
        """Rounds since it last drafted: counted by the request's own round count, so a plain
        round costs the controller no call at all."""
        return self.metrics.rounds - self.drafted_at


def started(seq: Sequence, batch: int, clock: tuple[int, int] | None) -> AutoState:
    """A new auto sequence's state in a batch of `batch`: it starts by drafting, or — given a
    probe clock (probe gap, undrafted rounds so far) passed on by its regime or its peers — on
    plain rounds where that clock stood."""
    st = AutoState(setting(seq), seq.metrics, drafted_at=seq.metrics.rounds, batch=batch)
    if clock is None:
        return st
    gap, undrafted = clock
    return replace(st, probe_gap=gap, drafted_at=seq.metrics.rounds - undrafted, prefers_plain=True,
                   started_plain=True)


def learned(st: AutoState, tree: DraftTree, path: list[int], choice: Choice) -> AutoState:
    """st after a round that drafted `tree` for it (the commit counted in st.metrics.rounds;
    `path`: the accepted nodes, root first): the verified nodes train the calibration and the
    tree becomes its latest curve. A round that drafted nothing for it (its tree the root) teaches
    nothing: its undrafted rounds count themselves."""
    if choice.paths is None:
        return st
    calibration = st.calibration
    if tree.size > 1:
        accepted = np.zeros(tree.size, dtype=bool)
        accepted[path] = True
        calibration = calibration.updated(path_logprobs(tree)[1:], accepted[1:])
    return replace(st, calibration=calibration, recent=(st.recent + (choice.paths,))[-RECENT_TREES:],
                   drafted_at=st.metrics.rounds, prefers_plain=False,
                   probed=st.prefers_plain)  # drafted after a plain verdict: settled judges the probe


def settled(states: list[AutoState], taus: list[int], break_even: float, verified: bool,
            probe_every: int) -> list[AutoState]:
    """The states of one drafting round's auto sequences after it (see AdaptiveBudget.settle;
    `taus`: the tokens each committed, `verified`: whether the round verified any node): each
    counts the round; those it judges — past their first drafted round, or started plain — share
    one probe gap, `probes.gap_after` from the largest of theirs, when the round's mean tau beat
    plain decoding or the round was a probe. A losing round of a drafting streak changes no gap."""
    mean_tau = sum(taus) / len(taus)
    # the first drafted round of a sequence that started by drafting judges nothing: acceptance
    # starts low and climbs over the first rounds (T=0: tau 2.5, 2.3, 3.0, 3.5, 4.3 -> 4.0 mean)
    judged = [st.drafted > 0 or st.started_plain for st in states]  # this round is not its first
    sets_gap = any(judged) and (beats_plain(mean_tau, break_even, verified)
                                or any(st.probed for st, j in zip(states, judged) if j))
    if not sets_gap:
        return [replace(st, drafted=st.drafted + 1) for st in states]
    # one gap for the batch, from the one that backed off most (see AdaptiveBudget.settle)
    gap = gap_after(max(st.probe_gap or probe_every for st, j in zip(states, judged) if j),
                    mean_tau, break_even, verified)
    return [replace(st, drafted=st.drafted + 1, probe_gap=gap if j else st.probe_gap)
            for st, j in zip(states, judged)]


def repeat_gains(states: list[AutoState], taus: list[int], break_even: float) -> dict[tuple, float]:
    """What one drafting round gained over plain decoding (its mean tau - break_even), summed per
    regime over those of its sequences whose text repeated when it was decided (see _credit)."""
    mean_tau = sum(taus) / len(taus)
    gains: dict[tuple, float] = {}
    for st in states:
        if st.text.repeats:
            key = regime(st.setting, st.batch)
            gains[key] = gains.get(key, 0.0) + mean_tau - break_even
    return gains


@dataclass(slots=True, frozen=True)
class Steady:
    """A batch whose plain verdict stands without a look at its sequences' states: the same
    sequences in a batch of the same size, until its first sequence has committed `until` rounds
    (then the first of them is due for a probe), unless repeats of `callers` (those with repeat
    credit) call one. Any drafting round ends it (learn, settle: they change what the verdict read)."""
    seqs: list
    batch: int
    until: int      # seqs[0].metrics.rounds at which the verdict expires
    callers: list   # [(seq, its AutoState)]


def repeats(seq: Sequence, index: RepeatIndex, n: int = REPEAT_NGRAM) -> bool:
    """Whether the last n-gram of seq's committed tokens (prompt + output) occurred earlier in
    them; `index` keeps the n-grams seen so far, so each call only adds the new tokens' n-grams."""
    P, out = seq.prompt_ids, seq.output_ids
    total = len(P) + len(out)
    if index.seen == total:
        return index.repeats
    if total == index.seen + 1 and len(out) >= n:  # one new token (a plain round): its one n-gram
        g = tuple(out[-n:])
        index.repeats, index.seen = g in index.grams, total
        index.grams.add(g)
        return index.repeats
    base = max(0, index.seen - n + 1)  # the first new n-gram starts here: it ends at max(seen + 1, n)
    toks = (P[base:] + out) if base < len(P) else out[base - len(P):]
    new = list(zip(*(toks[i:] for i in range(n))))  # the new n-grams in order (a 100-token prompt:
    if new:                                         # 27 us, against 49 with a tuple() per n-gram)
        last = new[-1]  # it repeats if it occurred before: among the old n-grams or earlier new ones
        index.repeats = last in index.grams or new.index(last) < len(new) - 1
        index.grams.update(new)
    index.seen = total
    return index.repeats


def due(st: AutoState, probe_every: int) -> bool:
    """A sequence with no curve yet (unless it started plain, see release) or whose probe gap
    has passed drafts this round (the drafter then runs for the whole batch, so one pass serves
    every due sequence and resets all their gaps together)."""
    if not st.recent and st.probe_gap is None:
        return True
    return rounds_to_probe(st.probe_gap, st.undrafted, probe_every) <= 0


def repeats_call(callers: list[tuple[Sequence, AutoState]], batch: int) -> bool:
    """More than half of a batch of `batch` are callers (plain-decoding sequences whose regime
    has repeat credit, see AdaptiveBudget._credit) whose text repeats itself; counting stops once
    the rest could not make that majority (the others' n-grams catch up when they next matter)."""
    need, left = batch // 2 + 1, len(callers)
    for s, st in callers:
        if need > left:
            return False
        need, left = need - repeats(s, st.text), left - 1
        if need <= 0:
            return True
    return False


@dataclass(slots=True, frozen=True)
class Verdict:
    """A decision on a batch's auto sequences: whether the drafter runs, and their states after it."""
    draft: bool
    states: list                   # [AutoState] in the order of the sequences decided on
    steady: Steady | None = None   # the plain verdict that stands unread from now on


def verdict(seqs: list[Sequence], states: list[AutoState], batch: int, costs: CostTable, catch_up: int,
            probe_every: int, credited: list[bool]) -> Verdict:
    """Whether the drafter runs for these auto sequences (their `states`; in a batch of `batch`;
    `credited`: whether each one's regime has repeat credit). It does unless every one has a
    curve, none is due for a re-probe, at most half the batch has a repeat calling one (see
    repeats_call: the pass and the widest tree are paid by every sequence of the batch), and
    plain decoding's predicted rate beats the best rate with the drafter's cost included — with
    the context rows the pass would first feed (`catch_up`: what the sequences decoded plainly
    since they last drafted), which this round pays. Returns the states with the verdict
    recorded (`prefers_plain`); only their n-gram index (`RepeatIndex`, a cache of the committed
    tokens) is written, brought up to date."""
    # plain-decoding sequences whose regime has repeat credit: a repeat of theirs calls a probe
    callers = [(s, st) for s, st, cr in zip(seqs, states, credited) if st.prefers_plain and cr]
    # those whose n-grams are up to date first: a count that stops early then never reads the
    # others (catching up is the costly part: a newcomer's whole prompt)
    callers.sort(key=lambda c: len(c[0].prompt_ids) + len(c[0].output_ids) - c[1].text.seen)
    is_due = not costs.measured or not costs.draft_s or any(due(st, probe_every) for st in states) \
        or repeats_call(callers, batch)
    if not is_due and all(st.prefers_plain for st in states):  # no new curve since that verdict:
        # it stands while the first of them is not due: next round is seqs[0]'s rounds + 1
        left = min(rounds_to_probe(st.probe_gap, st.undrafted, probe_every) for st in states)
        return Verdict(False, list(states), Steady(list(seqs), batch, seqs[0].metrics.rounds + left, callers))
    for s, st in zip(seqs, states):  # a round that may draft: settle reads whether each one's text repeats
        repeats(s, st.text)
    if is_due:
        return Verdict(True, list(states))
    curves = [mean_curve(st.recent, st.calibration) for st in states]
    wants = drafting_pays(curves, costs, batch, costs.draft(batch) + costs.catch_up(catch_up), fixed=batch - len(seqs))
    return Verdict(wants, [st if st.prefers_plain == (not wants) else replace(st, prefers_plain=not wants)
                           for st in states])


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
            start = (self.starts.get(regime(setting(seq), batch or 1)) if self.starts else None) \
                or self._peers_clock(seq)
            st = self.states[seq] = started(seq, batch or 1, start)
        elif batch is not None and st.batch != batch:
            st = self.states[seq] = replace(st, batch=batch)
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
        return peers_clock([(st.probe_gap, st.undrafted) for st in peers], self.probe_every)

    def depths(self, batch: list[Sequence], limits: list[int], catch_up: int = 0, held: int = 0) -> list[int]:
        """Each sequence's draft depth this round: its limit, or 0 for the auto sequences when the
        batch's drafting sequences are all auto and their curves predict plain decoding is faster
        (a standing verdict, `holds`, or a fresh one, `decide`; `catch_up`: the context rows
        a drafter pass would first feed those sequences)."""
        if self.holds(batch, len(batch)):  # a standing plain verdict on this very batch
            return [0] * len(batch)
        auto = [s for s, d in zip(batch, limits) if s.auto and d > 0]
        if not auto or any(d > 0 and not s.auto for s, d in zip(batch, limits)) \
                or self.decide(auto, len(batch), catch_up, held):
            return limits
        return [0 if s.auto else d for s, d in zip(batch, limits)]

    def decide(self, seqs: list[Sequence], batch: int, catch_up: int = 0, held: int = 0) -> bool:
        """Whether the drafter runs for these auto sequences (a batch of `batch`, all auto; `held`:
        the batch the engine has work for, prefilling and waiting sequences included — the batch
        size class they run in, see `regime`): a standing plain verdict (`holds`), or a fresh
        `verdict` on their states, whose new states and `Steady` this keeps."""
        if self.holds(seqs, batch):
            return False
        states = [self.state(s, max(batch, held)) for s in seqs]
        v = verdict(seqs, states, batch, self.costs, catch_up, self.probe_every, [self._credit(st) for st in states])
        self.steady = v.steady
        self.states.update(zip(seqs, v.states))
        return v.draft

    def holds(self, seqs: list[Sequence], batch: int) -> bool:
        """The standing plain verdict (`Steady`) covers these auto sequences in a batch of `batch`
        this round: nothing it read has changed, no probe is due and no repeat of its callers calls
        one. Reads only, but for the n-gram index `repeats` brings up to the committed tokens (a
        cache: filling it changes no answer), so asked twice in a step it answers the same. (Under cProfile a look cost
        ~5 us a round at T=0, C=8 and ~19 at T=1, C=8, where eight callers' repeats are read.)"""
        hold = self.steady
        return hold is not None and hold.batch == batch and hold.seqs == seqs \
            and seqs[0].metrics.rounds < hold.until \
            and not (hold.callers and repeats_call(hold.callers, batch))

    def _credit(self, st: AutoState) -> bool:
        """Drafting rounds decided in repeating text have gained tokens over plain decoding on the
        whole in st's regime (REPEAT_PRIOR to start with)."""
        return REPEAT_PRIOR + self.repeat_gain.get(regime(st.setting, st.batch), 0.0) > 0

    def fit(self, batch: list[Sequence], trees: list[DraftTree], drafted: int, caught_up: int = 0,
            held: int = 0) -> tuple[list[DraftTree], list[Choice | None]]:
        """Pick the round's forward width and cut each auto sequence's tree to it. `drafted`: the
        sequences the drafter pass ran for (its cost counts, with the `caught_up` context rows it
        fed first: a probe's break-even is what the probe cost); `held`: as in decide.
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
        break_even = self.costs.priced(len(batch), T, draft_cost + spent) / plain if plain else 2.0
        trees, choices = list(trees), [None] * len(batch)
        for b, curve in curves.items():
            n = min(T - 1, trees[b].size - 1)
            choices[b] = Choice(n, float(curve[n]), paths[b] if trees[b].size > 1 else None, float(break_even))
            trees[b] = prefix(trees[b], n)
        return trees, choices

    def learn(self, seq: Sequence, tree: DraftTree, path: list[int], choice: Choice) -> None:
        """After the commit (seq.metrics.rounds counts it): seq's state becomes `learned`'s (the
        engine calls it only for a sequence that drafted); a standing verdict read the old one."""
        if choice.paths is None:  # nothing drafted for it (its tree was the root)
            return
        self.states[seq] = learned(self.state(seq), tree, path, choice)
        self.steady = None

    def observe(self, drafted: list[tuple[Sequence, DraftTree, list[int], Choice]]) -> None:
        """After a round's commits: each auto sequence that drafted, with its verified tree, its
        accepted path (root first) and its choice. Each one's calibration learns (`learn`), then
        the batch gets its one verdict (`settle`)."""
        for seq, tree, path, choice in drafted:
            self.learn(seq, tree, path, choice)
        self.settle([(seq, choice, len(path)) for seq, _, path, choice in drafted])

    def settle(self, drafted: list[tuple[Sequence, Choice, int]]) -> None:
        """After a round's commits: (sequence, its choice, its tau) for each auto sequence that
        drafted. The drafter ran for all of them at once, so they share one verdict on their mean
        tau and one probe gap, `probes.gap_after` from the largest of theirs, set when the round
        beat plain decoding (back to PROBE_EVERY) or was a probe (a round drafted after a plain
        verdict; committed outcomes and measured costs only: lossless). A losing round of a
        drafting streak changes no gap: its sequences' curves said drafting pays, and whether they
        still do is the next verdict's (one round's tau is noisy; backing off on it stopped drafting
        that paid 1.8x plain decoding on average). The verdict and the gap are the
        batch's, not each sequence's: one lucky sequence cannot keep the whole batch probing, and
        the batch does not probe whenever its first member is due. A sequence's first drafted round gives
        it no verdict (its acceptance is not yet what it will be) unless it started on plain rounds
        with a passed-on probe clock (see release): then its first probe comes mid-text. What the
        round gained over plain decoding (mean tau - break_even) counts, per regime, for the
        sequences whose text repeated (see _credit). The rules are the pure `settled` and
        `repeat_gains`; this keeps what they return."""
        if not drafted:
            return
        self.steady = None
        seqs, taus = [seq for seq, _, _ in drafted], [tau for _, _, tau in drafted]
        break_even = drafted[0][1].break_even
        verified = any(c.nodes > 0 for _, c, _ in drafted)
        states = [self.state(seq) for seq in seqs]
        for key, gain in repeat_gains(states, taus, break_even).items():
            self.repeat_gain[key] = self.repeat_gain.get(key, 0.0) + gain
        self.states.update(zip(seqs, settled(states, taus, break_even, verified, self.probe_every)))

    def release(self, seq: Sequence) -> None:
        """The sequence left the engine. If it finished with its last two probe rounds unpaid
        (`probes.passed_on`), the next sequence of its regime starts where it
        left off: plain rounds, its probe clock where this one's stood (the plain rounds since
        its last probe count), so the setting re-probes as one long sequence would — not a
        drafting round and a probe every 8, 16, 32 rounds, which every request otherwise pays (at
        T=1 C=8 five drafting rounds in 96), and not a gap that outlasts every request. Else the
        next one starts by drafting. Committed outcomes only, so lossless; a setting whose probes
        start paying again stops passing a gap on."""
        st = self.states.pop(seq, None)
        if st is None or not seq.finished:  # preempted: it comes back with a fresh state
            return
        clock, key = passed_on(st.probe_gap, st.undrafted), regime(st.setting, st.batch)
        if clock is not None:
            self.starts[key] = clock
        else:
            self.starts.pop(key, None)
