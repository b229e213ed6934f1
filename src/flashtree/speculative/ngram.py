"""`ngram`: prompt-lookup drafting (SPEC §2, "N-gram drafts"); no drafter model.

Find the longest suffix n-gram of the committed tokens (prompt + output), n from `max_ngram` down
to `min_ngram`, that occurred earlier in them; propose the tokens that followed its most recent
earlier occurrence as one chain (at most `draft_len`, the depth limit permitting). Occurrences may
overlap the suffix itself (in "a a a" the suffix "a a" occurred at 0, continued by "a"). The draft
depends on committed tokens only, so the verify rule keeps the target's distribution exactly.

How much of the chain a round verifies follows what it is expected to gain: each sequence's
acceptance of copied tokens (`Acceptance`, learned from its committed rounds, forgotten while it
does not draft so that a plain stretch re-probes) gives the expected tau of every chain length,
and auto's `choose_tokens` picks the forward width with the best expected tokens per second
under the engine's measured costs — no copy at all (a plain round) when none pays. Inputs are
committed history and measured time only, so the choice is lossless too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import RequestError, UserError
from .costs import choose_tokens
from .proposer import DraftShape, Proposer
from .tree import DraftTree, chain_tree

MAX_NGRAM = 64
# a copied token's acceptance (given the one before it was accepted), per sequence: a Beta posterior
# with prior mean PRIOR_RATE over PRIOR_TRIALS pseudo-trials; evidence decays by FORGET per round
PRIOR_RATE, PRIOR_TRIALS, FORGET = 0.5, 2.0, 0.9


@dataclass(slots=True)
class Acceptance:
    hits: float = 0.0       # copied tokens accepted (decayed)
    trials: float = 0.0     # copied tokens verified: the accepted ones and the first rejected (decayed)
    at: int = 0             # metrics.rounds when last updated

    def rate(self, rounds: int) -> float:
        w = FORGET ** max(rounds - self.at, 0)
        return (PRIOR_RATE * PRIOR_TRIALS + w * self.hits) / (PRIOR_TRIALS + w * self.trials)

    def update(self, rounds: int, drafted: int, accepted: int) -> None:
        w = FORGET ** max(rounds - self.at, 0)
        self.hits = w * self.hits + accepted
        self.trials = w * self.trials + accepted + (accepted < drafted)
        self.at = rounds


def chain_curve(rate: float, n: int) -> list[float]:
    """E[tau | N copied tokens verified], N = 0..n: 1 + rate + ... + rate^N (the k-th copied token
    counts only if the k-1 before it were accepted)."""
    out, term = [1.0], 1.0
    for _ in range(n):
        term *= rate
        out.append(out[-1] + term)
    return out


def ngram_match(tokens: list[int] | np.ndarray, max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """The continuation (at most k tokens) of the most recent earlier occurrence of the longest
    suffix n-gram of `tokens`, max_ngram >= n >= min_ngram; [] when no suffix occurred earlier."""
    a = np.asarray(tokens, dtype=np.int64)
    L = len(a)
    if k < 1 or L < 2:
        return []
    # ends: where an occurrence of the length-n suffix ends, before the last token; grow n while any survive
    ends, n, best = np.flatnonzero(a[:-1] == a[-1]), 1, None
    if ends.size and min_ngram <= 1:
        best = ends[-1]
    while n < min(max_ngram, L - 1) and ends.size:
        ends = ends[ends >= n]                      # room for one more token before the occurrence
        ends = ends[a[ends - n] == a[L - 1 - n]]    # ... and it matches the suffix's
        n += 1
        if ends.size and n >= min_ngram:
            best = ends[-1]                          # the longest so far, most recent occurrence
    if best is None:
        return []
    return a[best + 1:best + 1 + k].tolist()


def check_ngram(max_ngram, min_ngram, draft_len, max_draft: int, error=UserError) -> None:
    def bad(x):
        return isinstance(x, bool) or not isinstance(x, int)
    if bad(min_ngram) or bad(max_ngram) or not 1 <= min_ngram <= max_ngram <= MAX_NGRAM:
        raise error(f"n-gram sizes need 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}, "
                    f"got min_ngram={min_ngram!r}, max_ngram={max_ngram!r}")
    if bad(draft_len) or not 1 <= draft_len <= max_draft:
        raise error(f"draft_len (the n-gram chain's length) must be an integer in [1, {max_draft}], got {draft_len!r}")


class NGram(Proposer):
    name = "ngram"
    sized_by_costs = True
    options = ("max_ngram", "min_ngram", "draft_len")
    drafts = "copies one chain from the context (set its length with draft_len)"
    summary = "prompt lookup needs only the target"

    def __init__(self, given):
        super().__init__(given)
        c = self.limits
        self.max_draft = max(c.max_budget, c.draft_len) if isinstance(c.draft_len, int) else c.max_budget
        check_ngram(c.max_ngram, c.min_ngram, c.draft_len, self.max_draft)
        self.accepted: dict = {}  # Sequence -> Acceptance

    @classmethod
    def round_tokens(cls, budget, topk, block_size, draft_len) -> int | None:
        return draft_len + 1  # the root and the longest chain copied

    def configure(self, block_size, budget, topk, options) -> DraftShape:
        c = self.limits
        mx, mn = options.get("max_ngram", c.max_ngram), options.get("min_ngram", c.min_ngram)
        dl = options.get("draft_len", c.draft_len)
        check_ngram(mx, mn, dl, self.max_draft, error=lambda m: RequestError(m, "speculative"))
        return DraftShape(block_size=dl + 1, budget=dl, options={"max_ngram": mx, "min_ngram": mn})

    def draft(self, seqs, depths) -> list:
        conts = [ngram_match(s.prompt_ids + s.output_ids, s.options["max_ngram"], s.options["min_ngram"], depth)
                 for s, depth in zip(seqs, depths)]
        found = [(s, c) for s, c in zip(seqs, conts) if c]
        if not found:
            return [None] * len(seqs)
        curves = [chain_curve(self.accepted.get(s, Acceptance(at=s.metrics.rounds)).rate(s.metrics.rounds), len(c))
                  for s, c in found]
        width = choose_tokens(curves, self.adaptive.costs, len(seqs), 0.0, fixed=len(seqs) - len(found))
        return [c[:width - 1] or None for c in conts]

    def _acceptance(self, seq) -> Acceptance:
        if seq not in self.accepted:
            self.accepted[seq] = Acceptance(at=seq.metrics.rounds)
        return self.accepted[seq]

    def tree(self, seq, draft: list[int], depth: int) -> DraftTree:
        return chain_tree(seq.bonus, draft[:depth])

    def on_commit(self, seq, tree, path) -> None:
        if tree.size > 1:
            self._acceptance(seq).update(seq.metrics.rounds, tree.size - 1, len(path) - 1)

    def release(self, seq) -> None:
        self.accepted.pop(seq, None)
