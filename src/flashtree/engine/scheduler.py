"""What runs in a step: waiting and running queues, admission against free pages, the per-step
prefill token budget (chunked prefill) and preemption when pages run out.

Each step, every running sequence that has finished its prefill gets the pages one round may
write (its length plus its largest tree); when they do not fit, the most recently admitted
sequence is preempted — its pages are let go (named ones stay in the prefix cache) and it goes
back to the front of the queue, to be recomputed from its prompt and the tokens it already has.
Then prompts are prefilled, oldest first, at most `max_num_batched_tokens` prompt tokens a step:
a longer prompt is prefilled over several steps, interleaved with the running sequences' rounds.
A waiting request is admitted (FIFO, never skipped) when a slot is free and its prompt's pages
fit; the pages its prompt shares with cached ones (prefix caching) are adopted, not computed.

It runs no model and knows no method; the engine tells it how many rows a sequence's round may
write (`round_rows`) and whether its method reads the drafter's context (`needs_draft`).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence


@dataclass(slots=True)
class Schedule:
    prefills: list[Sequence] = field(default_factory=list)   # each computes its next `chunk` prompt tokens
    decode: list[Sequence] = field(default_factory=list)     # a round each (pages reserved)
    preempted: list[Sequence] = field(default_factory=list)  # sent back to the queue this step


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch_size: int, max_num_batched_tokens: int,
                 round_rows: Callable[[Sequence], int], needs_draft: Callable[[Sequence], bool]):
        self.blocks = blocks
        self.max_batch_size, self.max_num_batched_tokens = max_batch_size, max_num_batched_tokens
        self.round_rows, self.needs_draft = round_rows, needs_draft
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []   # in admission order
        self.preemptions = 0                # a counter
        self.prefix_hit_tokens = 0          # prompt tokens not computed thanks to the prefix cache (a counter)

    def schedule(self) -> Schedule:
        out = Schedule()
        for s in list(self.running):
            if s in self.running and s.decoding and not s.finished \
                    and self._reserve(s, s.length + self.round_rows(s), out):
                out.decode.append(s)
        budget = self.max_num_batched_tokens
        for s in self.running:
            if budget <= 0:
                break
            if not s.decoding and not s.finished:
                budget -= self._chunk(s, budget, out)
        while budget > 0 and self.waiting and len(self.running) < self.max_batch_size and self._admit(self.waiting[0]):
            s = self.waiting.popleft()
            self.running.append(s)
            budget -= self._chunk(s, budget, out)
        return out

    def _chunk(self, s: Sequence, budget: int, out: Schedule) -> int:
        """Schedule the next chunk of s's prompt (its pages were reserved at admission)."""
        s.chunk = min(len(s.cache_ids) - s.prefilled, budget)
        out.prefills.append(s)
        return s.chunk

    def _admit(self, s: Sequence) -> bool:
        """A slot for s, the cached pages of its prompt's prefix, and pages for the rest of it and
        its first round (so a prefill, once admitted, never waits for pages)."""
        b = self.blocks
        if not b.free_slots:
            return False
        ids = s.cache_ids
        slot = b.allocate()
        pages, names = b.match(ids, self.needs_draft(s))
        hit = b.adopt(slot, pages, names)
        if not b.reserve(slot, len(ids) + self.round_rows(s)):
            b.free(slot)
            return False
        s.slot, s.prefilled, s.length = slot, hit, hit
        self.prefix_hit_tokens += hit
        return True

    def _reserve(self, s: Sequence, rows: int, out: Schedule) -> bool:
        """Pages for s's rows [0, rows), preempting the newest sequences while they do not fit.
        False when s itself was preempted."""
        while not self.blocks.reserve(s.slot, rows):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim in out.decode:
                out.decode.remove(victim)
            if victim is s:
                return False
        return True

    def preempt(self, s: Sequence) -> None:
        """Back to the front of the queue with no pages (recomputed when readmitted)."""
        self.running.remove(s)
        self.blocks.free(s.slot)
        s.slot, s.prefilled, s.length, s.decoding = -1, 0, 0, False
        self.waiting.appendleft(s)
        self.preemptions += 1

    def release(self, s: Sequence) -> None:
        """A finished or aborted sequence leaves: its slot and pages go back."""
        self.running.remove(s)
        self.blocks.free(s.slot)
