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

import heapq
import math

import numpy as np

from ..errors import RequestError
from .constrained import drafted_nodes
from .ddtree import DDTree
from .ngram import check_ngram, ngram_match
from .proposer import DraftShape
from .tree import DraftOutput, DraftTree


def build_hybrid(root: int, topk_logprobs: np.ndarray | None, topk_ids: np.ndarray | None,
                 ngram: list[int], budget: int, ngram_logp: float) -> DraftTree:
    """Best-first over the drafter's per-depth top-K (rows = depths, as `build_ddtree`) and the
    n-gram chain `ngram` (token j at depth j+1), merged into one tree of at most `budget` nodes.
    Without an n-gram chain it is exactly `build_ddtree(root, lp, ids, budget)`."""
    lp = topk_logprobs.tolist() if topk_logprobs is not None else []
    ids = topk_ids.tolist() if topk_ids is not None else []
    L, K = len(ids), (len(ids[0]) if ids else 0)
    known = [dict(zip(ids[d], lp[d])) for d in range(L)]   # depth-1 -> {token: draft log-prob}

    def copied(depth: int) -> float:   # the n-gram node's own log-score at this depth
        tok = ngram[depth - 1]
        return max(known[depth - 1].get(tok, -math.inf) if depth <= L else -math.inf, ngram_logp)

    tree = DraftTree([root], [-1], [0], [0.0])
    child: dict[tuple[int, int], int] = {}   # (parent node, token) -> node: merges shared prefixes
    # heap item: (-score, kind (0 = n-gram before a drafter tie), key, parent node, depth)
    heap = []
    if L and K:
        heap.append((-lp[0][0], 1, (0,), 0, 1))
    if ngram:
        heap.append((-copied(1), 0, (1,), 0, 1))
    heapq.heapify(heap)
    while heap and tree.size - 1 < budget:
        neg, kind, key, parent, depth = heapq.heappop(heap)
        if kind == 1:
            rank = key[-1]
            tok, own = ids[depth - 1][rank], lp[depth - 1][rank]
        else:
            tok, own = ngram[depth - 1], copied(depth)
        node = child.get((parent, tok))
        if node is None:   # a new node; otherwise the other source already placed this prefix
            node = child[parent, tok] = tree.size
            tree.tokens.append(tok)
            tree.parents.append(parent)
            tree.depths.append(depth)
            tree.logprobs.append(own)
        if kind == 1:
            if rank + 1 < K:
                heapq.heappush(heap, (neg + own - lp[depth - 1][rank + 1], 1, key[:-1] + (rank + 1,), parent, depth))
            if depth < L:
                heapq.heappush(heap, (neg - lp[depth][0], 1, key + (0,), node, depth + 1))
        elif depth < len(ngram):
            heapq.heappush(heap, (neg - copied(depth + 1), 0, (depth + 1,), node, depth + 1))
    return tree


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
