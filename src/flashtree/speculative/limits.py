"""What a request's speculative options may be, and the engine's defaults for them.

`RequestLimits` is built once per engine from its config and its drafter's block size; proposers
check a request's options against it (`Proposer.configure`) and the engine's callers read the
defaults off it. Every check raises a `RequestError` naming the option and its allowed range. It
knows no model and keeps no state.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError

AUTO = "auto"  # budget="auto": the tree size is chosen each round (adaptive.py)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    drafter_block_size: int      # the drafter's trained block (0: no drafter)
    default_block_size: int      # a request's block size when it names none (1: no drafter)
    max_budget: int              # the largest integer budget
    auto_budget: int             # the most nodes a budget="auto" tree holds
    default_budget: int | str    # a request's budget when it names none
    default_topk: int | None     # the engine-wide branching cap (None: no cap)
    max_ngram: int               # ngram and hybrid's defaults
    min_ngram: int
    draft_len: int

    @classmethod
    def build(cls, *, drafter_block_size: int, block_size: int | None, max_budget: int, auto_budget: int,
              budget: int | str, topk: int | None, check_default_budget: bool, max_ngram: int, min_ngram: int,
              draft_len: int) -> RequestLimits:
        """The engine's limits; its own defaults are checked like a request's."""
        bare = cls(drafter_block_size, 1, max_budget, auto_budget, budget, None, max_ngram, min_ngram, draft_len)
        default_block = bare.check_block_size(block_size) if drafter_block_size else 1
        if check_default_budget:
            bare.check_budget(budget)
        cap = bare.check_topk(topk, bare.nodes_of(budget)) if topk is not None else None
        return cls(drafter_block_size, default_block, max_budget, auto_budget, budget, cap, max_ngram, min_ngram,
                   draft_len)

    def block_size_of(self, block_size: int | None) -> int:
        """A request's block size: its own (checked) or the default."""
        return self.check_block_size(block_size) if block_size is not None else self.default_block_size

    def check_block_size(self, block_size: int | None) -> int:
        if block_size is None:
            return self.drafter_block_size
        if isinstance(block_size, bool) or not isinstance(block_size, int) or \
                not 2 <= block_size <= self.drafter_block_size:
            raise RequestError(f"block_size must be an integer in [2, {self.drafter_block_size}] (the drafter "
                               f"was trained with block_size {self.drafter_block_size}), got {block_size}",
                               "speculative")
        return block_size

    def check_budget(self, budget: int | str) -> int | str:
        """A tree budget: an integer in [1, max_budget], or "auto"."""
        if isinstance(budget, str) and budget == AUTO:
            return budget
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= self.max_budget:
            raise RequestError(f"budget must be an integer in [1, {self.max_budget}] or \"auto\" (the tree size "
                               f"chosen each round), got {budget!r}", "speculative")
        return budget

    def budget_of(self, budget: int | str | None) -> int | str:
        """A request's budget: its own (checked) or the default."""
        return self.check_budget(budget) if budget is not None else self.default_budget

    def nodes_of(self, budget: int | str) -> int:
        """The most nodes a tree of this (checked) budget holds: "auto" drafts up to auto_budget."""
        return self.auto_budget if budget == AUTO else budget

    def check_topk(self, topk: int, budget: int) -> int:
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= budget:
            raise RequestError(f"topk (the most children per tree node) must be an integer in [1, budget={budget}] "
                               f"(1 = a chain), got {topk!r}", "speculative")
        return topk
