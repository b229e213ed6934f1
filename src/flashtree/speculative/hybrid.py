"""`hybrid`: the DDTree of the drafter's marginals with the n-gram continuation merged in as a
branch (SPEC §2, "Hybrid tree"): one best-first pass over both, `budget` nodes, shared prefixes
merged, siblings distinct; the same verify rule.

Scoring. A drafter candidate scores as in DDTree: the sum of its per-depth draft log-probs. The
n-gram node at depth j scores its parent's score + log max(q_j(c_j), a), where q_j(c_j) is the
drafter's probability of the copied token at that depth (0 outside its top-k) and `a` is this
sequence's calibrated n-gram acceptance rate: (hits + 1) / (trials + 2) over its past rounds, a
trial being an n-gram node whose parent was accepted and a hit one that was accepted too (so the
prior is 1/2). The branch thus costs budget only while copying is expected to pay as much as the
drafter's own guesses, and where the drafter agrees with the copy the node keeps its higher
score. The rate uses committed rounds only, never the current round's draws, so it stays lossless.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import RequestError
from .constrained import drafted_nodes
from .ddtree import DDTree
from .ngram import check_ngram, ngram_match
from .proposer import DraftShape
from .tree import DraftOutput, DraftTree, build_ddtree


def build_hybrid(root: int, topk_logprobs: np.ndarray | None, topk_ids: np.ndarray | None,
                 ngram: list[int], budget: int, ngram_logp: float) -> DraftTree:
    """The DDTree of the drafter's per-depth top-K (None: no drafts) with the n-gram chain `ngram`
    (token j at depth j+1) merged in as a branch scored as above: `tree.build_ddtree`'s one
    best-first pass. Without an n-gram chain it is exactly `build_ddtree(root, lp, ids, budget)`."""
    return build_ddtree(root, topk_logprobs, topk_ids, budget, branch=ngram, branch_logp=ngram_logp)


class Hybrid(DDTree):
    name = "hybrid"
    options = ("budget", "block_size", "max_ngram", "min_ngram")
    drafts = "merges the drafter's tree with one chain copied from the context"

    def __init__(self, given):
        super().__init__(given)
        check_ngram(self.limits.max_ngram, self.limits.min_ngram, 1, 1)
        self.rate: dict = {}   # seq -> [hits, trials] of its n-gram nodes
        self.copies: dict = {}  # seq -> its n-gram chain of this round (what on_commit calibrates on)

    def configure(self, block_size, budget, topk, options) -> DraftShape:
        lim = self.limits
        bs = lim.block_size_of(block_size)
        bud = lim.budget_of(budget)
        mx, mn = options.get("max_ngram", lim.max_ngram), options.get("min_ngram", lim.min_ngram)
        check_ngram(mx, mn, 1, 1, error=lambda m: RequestError(m, "speculative"))
        return DraftShape(block_size=bs, budget=lim.nodes_of(bud), auto=bud == "auto",
                          options={"max_ngram": mx, "min_ngram": mn})

    def _copy(self, seq, depth: int) -> list[int]:
        o = seq.options
        return ngram_match(seq.prompt_ids + seq.output_ids, o["max_ngram"], o["min_ngram"], depth)

    def draft(self, seqs, depths) -> list:
        drafts = []
        for s, d, depth in zip(seqs, self.drafter_pass.take(seqs), depths):
            copy = self.copies[s] = self._copy(s, depth)
            drafts.append((d, copy) if d is not None or copy else None)
        return drafts

    def tree(self, seq, draft: tuple[DraftOutput | None, list[int]], depth: int) -> DraftTree:
        d, copy = draft
        hits, trials = self.rate.get(seq, (0, 0))
        logp = math.log((hits + 1) / (trials + 2))
        nodes = drafted_nodes(seq)  # (a grammar's pruning cuts it back to the budget)
        if d is None:
            return build_hybrid(seq.bonus, None, None, copy[:depth], nodes, logp)
        k = min(nodes, d.ids.shape[1])
        return build_hybrid(seq.bonus, d.logprobs[:depth, :k], d.ids[:depth, :k], copy[:depth], nodes, logp)

    def on_commit(self, seq, tree, path) -> None:
        """Calibrate: walk the round's n-gram branch (the chain `draft` copied from the tokens
        committed before this round) and count its trials and hits on the accepted path."""
        super().on_commit(seq, tree, path)
        copy = self.copies.pop(seq, [])
        if tree.size == 1:
            return
        children = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens)) if i}
        on_path = set(path)
        hits, trials = self.rate.get(seq, (0, 0))
        node = 0
        for tok in copy:  # (past the tree's depth the walk stops: no such child)
            node = children.get((node, tok))
            if node is None:
                break
            trials += 1
            if node not in on_path:
                break
            hits += 1
        self.rate[seq] = (hits, trials)

    def release(self, seq) -> None:
        super().release(seq)
        self.rate.pop(seq, None)
        self.copies.pop(seq, None)
