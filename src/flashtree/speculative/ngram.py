"""`ngram`: prompt-lookup drafting (SPEC §2, "N-gram drafts"); no drafter model.

Find the longest suffix n-gram of the committed tokens (prompt + output), n from `max_ngram` down
to `min_ngram`, that occurred earlier in them; propose the tokens that followed its most recent
earlier occurrence as one chain (at most `draft_len`, the depth limit permitting). Occurrences may
overlap the suffix itself (in "a a a" the suffix "a a" occurred at 0, continued by "a"). The draft
depends on committed tokens only, so the verify rule keeps the target's distribution exactly.
"""
from __future__ import annotations

import numpy as np

from ..errors import UserError
from .proposer import Proposer
from .tree import DraftTree, chain_tree

MAX_NGRAM = 64


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
    options = ("max_ngram", "min_ngram", "draft_len")
    drafts = "copies one chain from the context (set its length with draft_len)"
    summary = "prompt lookup needs only the target"

    def __init__(self, engine):
        super().__init__(engine)
        c = engine.config
        self.max_draft = max(c.max_budget, c.draft_len) if isinstance(c.draft_len, int) else c.max_budget
        check_ngram(c.max_ngram, c.min_ngram, c.draft_len, self.max_draft)

    def configure(self, block_size, budget, topk, options) -> dict:
        from ..engine.engine import RequestError
        c = self.engine.config
        mx, mn = options.get("max_ngram", c.max_ngram), options.get("min_ngram", c.min_ngram)
        dl = options.get("draft_len", c.draft_len)
        check_ngram(mx, mn, dl, self.max_draft, error=lambda m: RequestError(m, "speculative"))
        return {"block_size": dl + 1, "budget": dl, "topk": None, "options": {"max_ngram": mx, "min_ngram": mn}}

    def draft(self, seqs, depths) -> list:
        out = []
        for s, depth in zip(seqs, depths):
            o = s.options
            cont = ngram_match(s.prompt_ids + s.output_ids, o["max_ngram"], o["min_ngram"], depth)
            out.append(cont or None)
        return out

    def tree(self, seq, draft: list[int], depth: int) -> DraftTree:
        return chain_tree(seq.bonus, draft[:depth])
