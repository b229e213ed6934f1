"""Draft trees: the DDTree best-first builder (hybrid's too: a copied branch merged in), the DFlash chain, and their flat encoding.

A drafting method proposes a `DraftOutput` (per-depth top-K drafts); a tree is nodes in pop order, root (the bonus token, index 0) first, so parents precede
children and siblings come in descending draft probability. `DraftTree` holds one sequence's
tree on the host; packing many trees into one target forward lives in `engine/round.py`.
This module never sees the target model or samples anything.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class DraftOutput:
    """A drafter's (or n-gram lookup's) proposal for one sequence, before a tree is built from it."""
    logprobs: np.ndarray   # [L, K] per-depth top-K draft log-probs, descending
    ids: np.ndarray        # [L, K] their token ids


@dataclass(slots=True)
class DraftTree:
    tokens: list[int]          # [N+1] root first
    parents: list[int]         # [N+1] root = -1
    depths: list[int]          # [N+1] root = 0; position of node i = start + depths[i]
    logprobs: list[float]      # [N+1] draft log-prob of each node's own token (root 0.0)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def visibility(self) -> np.ndarray:
        """[N+1, N+1] bool: row i is True at i's ancestors and i itself (ancestor-only mask)."""
        n = self.size
        vis = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                vis[i] = vis[p]
            vis[i, i] = True
        return vis


def prefix(tree: DraftTree, nodes: int) -> DraftTree:
    """The tree's root and its first `nodes` nodes: in best-first pop order that is the tree a
    budget of `nodes` would have built (parents precede children, so it is a tree)."""
    if nodes + 1 >= tree.size:
        return tree
    n = nodes + 1
    return DraftTree(tree.tokens[:n], tree.parents[:n], tree.depths[:n], tree.logprobs[:n])


def root_only(root: int) -> DraftTree:
    """Plain decoding: the root alone (tau is always 1)."""
    return DraftTree([root], [-1], [0], [0.0])


def chain_tree(root: int, draft_ids: list[int], draft_logprobs: list[float] | None = None) -> DraftTree:
    """DFlash chain: node d (depth d) is the argmax draft of slot d, each the child of the last."""
    n = len(draft_ids)
    lps = list(draft_logprobs) if draft_logprobs is not None else [0.0] * n
    return DraftTree([root, *draft_ids], list(range(-1, n)), list(range(n + 1)), [0.0, *lps])


def build_ddtree(root: int, topk_logprobs: np.ndarray | None, topk_ids: np.ndarray | None, budget: int,
                 topk: int | None = None, branch: list[int] = (), branch_logp: float = -math.inf) -> DraftTree:
    """Best-first DDTree over per-depth top-K drafts, with an optional copied branch merged in.

    topk_logprobs, topk_ids: [L, K], rows in descending order (row d-1 is depth d); None: no drafts.
    Score of a prefix = sum of its per-depth log-probs. Pop the best of a max-heap `budget`
    times; each pop pushes its next sibling (rank+1) and its first child (depth+1, rank 0).
    Ties go to the lexicographically smaller rank tuple, so trees are deterministic.
    topk caps the branching (SGLang's --speculative-eagle-topk): only the top-`topk` ranks of
    each depth are candidates, so no node has more than topk children; topk=1 is the chain of
    per-depth argmaxes. None = no cap (all K ranks).
    `branch` (hybrid's n-gram chain, token j at depth j+1) competes in the same heap: its node at
    depth j scores its parent's score + max(the drafts' log-prob of that token at depth j,
    branch_logp), before a drafter candidate of equal score; a prefix both propose is one node.
    """
    lp = topk_logprobs.tolist() if topk_logprobs is not None else []
    ids = topk_ids.tolist() if topk_ids is not None else []
    L, K = len(ids), (len(ids[0]) if ids else 0)
    if topk is not None:
        if topk < 1:
            raise ValueError(f"topk must be >= 1 (or None for no cap), got {topk}")
        K = min(K, topk)
    tree = DraftTree([root], [-1], [0], [0.0])
    if budget <= 0:
        return tree
    known = [dict(zip(ids[d], lp[d])) for d in range(L)] if branch else []  # depth-1 -> {token: log-prob}

    def copied(depth: int) -> float:   # the branch node's own log-score at this depth
        tok = branch[depth - 1]
        return max(known[depth - 1].get(tok, -math.inf) if depth <= L else -math.inf, branch_logp)

    child: dict[tuple[int, int], int] = {}   # (parent node, token) -> node: merges shared prefixes
    # heap item: (-score, kind (0 = the branch, before a drafter tie), ranks or depth, parent node, depth)
    heap = []
    if L and K:
        heap.append((-lp[0][0], 1, (0,), 0, 1))
    if branch:
        heap.append((-copied(1), 0, (1,), 0, 1))
    heapq.heapify(heap)
    while heap and tree.size - 1 < budget:
        neg, kind, key, parent, depth = heapq.heappop(heap)
        if kind == 1:
            rank = key[-1]
            tok, own = ids[depth - 1][rank], lp[depth - 1][rank]
        else:
            tok, own = branch[depth - 1], copied(depth)
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
        elif depth < len(branch):
            heapq.heappush(heap, (neg - copied(depth + 1), 0, (depth + 1,), node, depth + 1))
    return tree
    lp = topk_logprobs.tolist()
    ids = topk_ids.tolist()
    # heap item: (-score, ranks, parent index, depth)
    heap = [(-lp[0][0], (0,), 0, 1)]
    while heap and tree.size - 1 < budget:
        neg, ranks, parent, depth = heapq.heappop(heap)
        node = tree.size
        rank = ranks[-1]
        tree.tokens.append(ids[depth - 1][rank])
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.logprobs.append(lp[depth - 1][rank])
        if rank + 1 < K:
            sib = -neg - lp[depth - 1][rank] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-sib, ranks[:-1] + (rank + 1,), parent, depth))
        if depth < L:
            heapq.heappush(heap, (neg - lp[depth][0], ranks + (0,), node, depth + 1))
    return tree
