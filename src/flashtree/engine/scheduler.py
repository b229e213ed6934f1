"""What runs in a step: waiting and running queues, admission against free pages, the per-step
prefill token budget (chunked prefill) and preemption when pages run out.

Each step, every running sequence that has finished its prefill gets the pages one round may
write (its length plus its largest tree); when they do not fit, the most recently admitted
sequence is preempted — its pages are let go (named ones stay in the prefix cache) and it goes
back to the front of the queue, to be recomputed from its prompt and the tokens it already has.
Then prompts are prefilled, oldest first, at most `max_num_batched_tokens` rows a step, padding
included (see `chunks`), and, while other sequences decode, only as many as the engine's pacing
test lets through (`prefill_pacing.py`: a chunk may cost a few of their rounds): a longer prompt
is prefilled over several steps, interleaved with the running sequences' rounds.
A waiting request is admitted (FIFO, never skipped) when a slot is free and its prompt's pages
fit; the pages its prompt shares with cached ones (prefix caching) are adopted, not computed.

It runs no model and knows no method; a sequence says how many rows its round may write
(`Sequence.round_rows`), and the engine says whether a prefix hit needs drafted pages (`match_drafted`: with a drafter,
every request writes its drafter rows, so every request matches only pages that hold them).
It keeps no counters: each step's `Schedule` says whom it preempted and how many prompt tokens its
admissions adopted from the prefix cache, and the engine counts those (`EngineStats`).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .round import StepEvent
from .sequence import Sequence


@dataclass(slots=True)
class Schedule:
    prefills: list[Sequence] = field(default_factory=list)   # each computes its next `chunk` prompt tokens
    preempted: list[Sequence] = field(default_factory=list)  # sent back to the queue this step
    prefix_hit_tokens: int = 0  # prompt tokens the sequences admitted this step adopted from the prefix cache


def _rest(s: Sequence) -> int:
    """Prompt tokens s has still to prefill."""
    return len(s.cache_ids) - s.prefilled


def chunks(prefilling: list[Sequence], budget: int,
           fits: Callable[[list[Sequence], int], bool] | None = None) -> list[Sequence]:
    """This step's prefills, oldest first, each with its `chunk` set: the first k sequences, k and
    the chunk length T chosen for the most prompt tokens with k x T <= budget and fits(first k, T)
    (each gets min(its rest, T)). A prefill forward computes k x T rows — its chunks padded to the
    longest — so the budget counts those: filling the budget with whatever came next (a 56-token
    tail beside a 200-token chunk) had 32 % of the rows padding in a C=8 run of the held-out prompts.
    `fits` (None: any) is monotone in T; T = 1 is always allowed, so every prompt progresses."""
    best, best_k, best_t, longest = 0, 0, 0, 0
    for k, s in enumerate(prefilling[:budget], 1):
        longest = max(longest, _rest(s))
        t = min(longest, budget // k)
        if fits is not None:
            t = _largest_fitting(prefilling[:k], t, fits)
        tokens = sum(min(_rest(c), t) for c in prefilling[:k])
        if tokens > best:
            best, best_k, best_t = tokens, k, t
    for s in prefilling[:best_k]:
        s.chunk = min(_rest(s), best_t)
    return prefilling[:best_k]


def _largest_fitting(seqs: list[Sequence], t: int, fits: Callable[[list[Sequence], int], bool]) -> int:
    """The largest T in [1, t] with fits(seqs, T) (1 when none does)."""
    lo, hi = 1, t
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(seqs, mid) else (lo, mid - 1)
    return lo


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch_size: int, max_num_batched_tokens: int,
                 match_drafted: bool):
        self.blocks = blocks
        self.max_batch_size, self.max_num_batched_tokens = max_batch_size, max_num_batched_tokens
        self.match_drafted = match_drafted
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # in admission order

    def schedule(self, fits: Callable[[list[Sequence], int], bool] | None = None) -> Schedule:
        """fits: the pacing test of this step's prefill chunks (see `chunks`; None: the row budget only)."""
        out = Schedule()
        for s in list(self.running):
            if s in self.running and s.decoding and not s.finished:  # pages for its round (or preempted)
                self._reserve(s, s.length + s.round_rows, out)
        prefilling = [s for s in self.running if not s.decoding and not s.finished]
        left = self.max_num_batched_tokens - sum(_rest(s) for s in prefilling)
        while (left > 0 and self.waiting and len(self.running) < self.max_batch_size
               and self._admit(self.waiting[0], out)):
            s = self.waiting.popleft()
            self.running.append(s)
            prefilling.append(s)
            left -= _rest(s)
        out.prefills = chunks(prefilling, self.max_num_batched_tokens, fits)
        return out

    def _admit(self, s: Sequence, out: Schedule) -> bool:
        """A slot for s, the cached pages of its prompt's prefix (counted in `out`), and pages for
        the rest of it and its first round (so a prefill, once admitted, never waits for pages)."""
        b = self.blocks
        if not b.free_slots:
            return False
        ids = s.cache_ids
        slot = b.allocate()
        # (a prompt whose logprobs are asked for is computed whole: an adopted page has no logits)
        pages, names = b.match(ids, self.match_drafted) if not s.wants_prompt_rows else ([], [])
        hit = b.adopt(slot, pages, names)
        if not b.reserve(slot, len(ids) + s.round_rows):
            b.free(slot)
            return False
        s.slot, s.prefilled, s.length = slot, hit, hit
        out.prefix_hit_tokens += hit
        return True

    def _reserve(self, s: Sequence, rows: int, out: Schedule) -> bool:
        """Pages for s's rows [0, rows), preempting the newest sequences while they do not fit.
        False when s itself was preempted."""
        while not self.blocks.reserve(s.slot, rows):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is s:
                return False
        return True

    def preempt(self, s: Sequence) -> None:
        """Back to the front of the queue with no pages (recomputed when readmitted)."""
        self.running.remove(s)
        self.blocks.free(s.slot)
        s.slot, s.prefilled, s.length, s.decoding = -1, 0, 0, False
        self.waiting.appendleft(s)

    def decoding(self) -> list[Sequence]:
        """The running sequences past their prefill: this step's round."""
        return [s for s in self.running if s.decoding and not s.finished]

    def postprocess(self) -> tuple[list[StepEvent], list[Sequence]]:
        """After the step: an event for each running sequence with tokens not yet reported or a
        finish, and the finished sequences (the engine releases them)."""
        events, finished = [], []
        for s in self.running:
            if len(s.output_ids) > s.emitted or s.finished:
                events.append(StepEvent(s, s.output_ids[s.emitted:]))
                s.emitted = len(s.output_ids)
            if s.finished:
                finished.append(s)
        return events, finished

    def release(self, s: Sequence) -> None:
        """A finished or aborted sequence leaves: its slot and pages go back."""
        self.running.remove(s)
        self.blocks.free(s.slot)
