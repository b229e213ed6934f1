"""Auto's probe clock: when a sequence that decodes plainly drafts again, as pure rules.

A sequence whose curve says plain decoding is faster stops drafting and re-probes (drafts one
round, which refreshes its curve) after a gap of undrafted rounds. These are the clock's rules,
each a pure function of committed outcomes and measured costs — so the choice stays lossless and
a decision taken twice comes out the same: when a probe is due, the batch's gap after a judged
drafting round, the clock a finished sequence passes on, and the one a newcomer joining plainly
decoding peers starts on. `adaptive.py` keeps each sequence's clock and applies these rules.
"""
from __future__ import annotations

import math

PROBE_EVERY = 8         # an auto sequence that stopped drafting drafts again every 8th round ...
MAX_PROBE_GAP = 1024    # ... a gap that doubles while probes do not pay, up to this (a probe that feeds
                        # the drafter a long plain stretch costs many plain rounds)
PROBE_LOSS = 0.01       # and at least as long as keeps a probe's loss below 1 % of plain decoding's time
INHERIT_GAP = 4 * PROBE_EVERY  # a finished sequence passes on a probe gap this large (two unpaid probes)

Clock = tuple[int, int]  # (probe gap, undrafted rounds so far) a sequence starts plain on


def rounds_to_probe(gap: int | None, undrafted: int, probe_every: int = PROBE_EVERY) -> int:
    """Rounds after this one before a probe gap (None: `probe_every`) has passed, `undrafted`
    rounds after the last drafting round (<= 0: a probe is due this round)."""
    return (gap or probe_every) - undrafted - 1


def beats_plain(mean_tau: float, break_even: float, verified: bool) -> bool:
    """A drafting round was faster than plain rounds: it verified draft nodes and committed at
    least `break_even` tokens a sequence (the plain rounds its measured cost is worth)."""
    return verified and mean_tau >= break_even


def gap_after(base: int, mean_tau: float, break_even: float, verified: bool) -> int | None:
    """The batch's probe gap after a judged drafting round, from `base` (the largest gap of its
    sequences): None (back to every PROBE_EVERY rounds) if it beat plain decoding; kept if it
    recovered at least half of what it cost over a plain round (tau >= 1 + (break_even - 1) / 2);
    else doubled, up to MAX_PROBE_GAP. A round that did not beat plain decoding also waits at
    least its loss in plain rounds, (break_even - tau) / PROBE_LOSS, so probes that commit a little
    more than a plain round but less than they cost come rarely."""
    if beats_plain(mean_tau, break_even, verified):
        return None
    paid = verified and mean_tau >= 1 + (break_even - 1) / 2
    loss_gap = math.ceil((break_even - mean_tau) / PROBE_LOSS)
    return min(max(base * (1 if paid else 2), loss_gap), MAX_PROBE_GAP)


def passed_on(gap: int | None, undrafted: int) -> Clock | None:
    """The clock a finished sequence passes to the next one of its regime: its own if its last two
    probes did not pay (a gap of at least INHERIT_GAP), the undrafted rounds capped below the gap
    (the next one probes as one long sequence would); else None (the next one starts by drafting)."""
    if (gap or 0) < INHERIT_GAP:
        return None
    return gap, min(undrafted, gap - 1)


def peers_clock(clocks: list[tuple[int | None, int]], probe_every: int = PROBE_EVERY) -> Clock:
    """The clock a newcomer starts plain on beside peers that all decode plainly (`clocks`: their
    (gap, undrafted)): the one that backed off most, so arrivals do not keep the batch probing."""
    gap, undrafted = max(((g or probe_every), u) for g, u in clocks)
    return gap, min(undrafted, gap - 1)
