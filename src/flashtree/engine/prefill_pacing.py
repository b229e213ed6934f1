"""How many prompt rows a step may prefill while other sequences decode: a long prompt must not
stall the streams (a 256-row chunk of the real model is ~10 of their rounds on two cores).

`PrefillPacer` learns two times from the steps the engine runs: an undisturbed decode round's
(in a step that prefills nothing), and a prefill
forward's per unit of `prefill_work` — its rows, each weighted by the keys it attends, so a chunk
late in a long prompt counts for more than one near its start (attention grows with the context:
a 256-row chunk of the tiny pair takes 16 ms at the start of a prompt and 40-50 ms near 1,800
tokens). A step that prefills beside decoding streams may then take `stall` times their round
for its chunks, and a prompt's chunks grow at most twofold a step from MIN_ROWS (the learned time
can come from unlike forwards); a step with no stream decoding prefills the scheduler's whole row
budget.
It decides nothing about which prompts prefill (the scheduler's `chunks`) and runs no model.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .sequence import Sequence

EMA = 0.3          # weight of the newest observation in both learned times
MIN_ROWS = 8       # a paced chunk has at least these rows (progress whatever the costs say)


def prefill_work(starts: list[int], rows: int, break_even: float) -> float:
    """Work of a prefill forward of len(starts) chunks padded to `rows` rows, chunk b after
    starts[b] cached rows, in row units: rows x (1 + keys attended / break_even), where a row
    attends on average start + rows/2 keys and `break_even` is the context at which a row's
    attention costs as much as its projections."""
    return sum(rows * (1.0 + (s + rows / 2) / break_even) for s in starts)


def break_even_context(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> float:
    """Keys at which a row's attention FLOPs (4 x heads x head_dim a key: QK and PV) equal its
    projection FLOPs (2 x a layer's weights): ~1,500 for the tiny pair, ~3,100 for SmolLM2-135M.
    The learned time per unit absorbs how far each kernel is from its peak."""
    weights = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * intermediate
    return 2 * weights / (4 * heads * head_dim)


@dataclass(slots=True)
class PrefillPacer:
    break_even: float
    stall: float                      # a paced prefill takes at most this many decode rounds' time
    unit_s: float | None = None       # seconds per unit of prefill_work (learned)
    round_s: float | None = None      # seconds of a decode round in a step that prefills nothing (learned)

    def observe_prefill(self, seqs: list[Sequence], seconds: float) -> None:
        """seqs were prefilled (each its `chunk` rows after its `prefilled - chunk` cached ones) in
        `seconds`."""
        rows = max(s.chunk for s in seqs)
        work = prefill_work([s.prefilled - s.chunk for s in seqs], rows, self.break_even)
        self.unit_s = _ema(self.unit_s, seconds / work)

    def observe_round(self, seconds: float) -> None:
        self.round_s = _ema(self.round_s, seconds)

    def fits(self, decoding: bool) -> Callable[[list[Sequence], int], bool] | None:
        """The test the scheduler's `chunks` applies to a candidate (prefills, chunk rows) this step:
        None (no pacing) when nothing decodes or either time is not known yet."""
        if not decoding or self.unit_s is None or self.round_s is None:
            return None
        allowed = self.stall * self.round_s

        def fits(seqs: list[Sequence], rows: int) -> bool:
            return rows <= MIN_ROWS or (rows <= growth_cap(seqs) and
                                        self.unit_s * prefill_work([s.prefilled for s in seqs], rows,
                                                                   self.break_even) <= allowed)
        return fits


def growth_cap(seqs: list[Sequence]) -> int:
    """The most rows a paced chunk of `seqs` may have: twice the smallest chunk any of them
    prefilled last (MIN_ROWS for a prompt not started). The learned time per unit comes from
    other forwards (other methods' prefills, other contexts, another kernel's fixed cost), so a
    prompt's chunks grow from small ones its own steps time, not from a guess: one chunk priced
    from four plain streams' short prompts took 6x their round beside them."""
    return max(MIN_ROWS, 2 * min(s.chunk if s.prefilled else 0 for s in seqs))


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new
