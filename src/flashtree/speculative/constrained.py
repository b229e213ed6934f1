"""Draft trees under a grammar: the nodes it forbids pruned before the verify, the tokens it forces
added for free.

The target's draw at a node follows the request's grammar (`engine/sampler.py` masks each node's
row after its own path), so a drafted child the grammar forbids at its parent can never be
accepted: `prune` drops it and its subtree, and a size cut after it (budget auto) keeps nodes that
can be accepted. Where the grammar allows exactly one token after a node, the masked draw there is
that token with probability one: `force` adds it as the node's child (right after it, ahead of the
drafted nodes a size cut drops first), accepted whenever its parent is, without the drafter
proposing it. Where the grammar forces a string (a JSON key, say) that several token sequences
could spell, after the root or after one of the tree's likeliest leaves, `force` drafts its
longest-match tokens as a chain below that node (merged with drafted nodes that match): a draft
like any other, verified as usual, that costs no drafter work. All of it depends only on the grammar, never on the draws, so verification stays
exact.
Nothing here samples or runs a model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..grammar import GrammarState, allows, forced
from .tree import DraftTree, prefix

if TYPE_CHECKING:
    from ..engine.sequence import Sequence


# A constrained sequence's tree is built from this many times its budget of drafted nodes (its
# method's `tree`); pruning then keeps its best `budget` nodes the grammar allows: the rows a
# forbidden node would have taken go to the next best drafts instead of to nothing.
OVERDRAFT = 2
# The forced string after a leaf is looked up for this many of the tree's leaves, likeliest path
# first (each costs the grammar a walk down the leaf's path and back).
LEAF_JUMPS = 2


def prune_all(seqs: list[Sequence], trees: list[DraftTree], pruning: bool = True) -> list[DraftTree]:
    """Each constrained sequence's tree pruned (`prune`; not with pruning=False, masks only), then
    cut to its budget (in best-first order a prefix is the best tree of its size); the others' as
    they are."""
    return [t if s.grammar is None else prefix(prune(t, s.grammar) if pruning else t, s.budget)
            for s, t in zip(seqs, trees)]


def drafted_nodes(seq: Sequence) -> int:
    """How many nodes seq's method drafts this round: its budget, OVERDRAFT times it under a grammar
    whose drafts are pruned."""
    return seq.budget * (OVERDRAFT if seq.grammar is not None and seq.grammar.drafts else 1)


def force_all(seqs: list[Sequence], trees: list[DraftTree], rows: list[int], depths: list[int]) -> list[DraftTree]:
    """Each constrained sequence's tree with its forced tokens (`force`), in rows[i] nodes to depth depths[i]."""
    return [t if s.grammar is None else force(t, s.grammar, n, d) for s, t, n, d in zip(seqs, trees, rows, depths)]


def prune(tree: DraftTree, state: GrammarState) -> DraftTree:
    """`tree` (nodes parents first) without the nodes `state`'s grammar forbids, nor their subtrees."""
    if tree.size == 1:
        return tree
    masks = state.tree_masks(tree.tokens, tree.parents)
    out = _pass(tree, masks, state.vocab_size, tree.size, 0)
    if out is None:
        return tree
    state.remember(out.tokens, out.parents, masks[_kept(tree, out)])  # a kept node's path is unchanged
    return out


def _kept(tree: DraftTree, pruned: DraftTree) -> list[int]:
    """The nodes of `tree` that `pruned` (a pruning of it, nodes in the same order) kept."""
    out, j = [], 0
    for i in range(tree.size):
        if j < pruned.size and tree.tokens[i] == pruned.tokens[j] and \
                (j == 0 or out[pruned.parents[j]] == tree.parents[i]):
            out.append(i)
            j += 1
    return out


def force(tree: DraftTree, state: GrammarState, rows: int, depth: int) -> DraftTree:
    """`tree` pruned, with each token the grammar forces added below its node, in at most `rows`
    nodes and to depth `depth`. First the string the grammar forces after the root goes in as a
    chain, then the forced tokens level by level (`_settle`), then the strings forced after the
    LEAF_JUMPS likeliest leaves, and the forced tokens below those."""
    tree = _settle(_graft(tree, 0, state.jump_forward()[:depth]), state, rows, depth)
    grafted = False
    leaves = _likeliest_leaves(tree, LEAF_JUMPS)
    for n, leaf in enumerate(leaves):
        room = min(depth - tree.depths[leaf], rows - tree.size)
        chain = state.jump_forward_after(_path(tree, leaf))[:room] if room > 0 else []
        if chain:  # in right after the leaf (it has no children): the nodes after it move down
            tree, grafted = _graft(tree, leaf, chain), True
            leaves[n + 1:] = [j + len(chain) if j > leaf else j for j in leaves[n + 1:]]
    return _settle(tree, state, rows, depth) if grafted else tree


def _settle(tree: DraftTree, state: GrammarState, rows: int, depth: int) -> DraftTree:
    """`tree` pruned and grown by `_pass` until a pass changes nothing (a pass adds one level of
    forced tokens)."""
    while True:
        new = _pass(tree, state.tree_masks(tree.tokens, tree.parents), state.vocab_size, rows, depth)
        if new is None:
            return tree
        tree = new


def _path(tree: DraftTree, node: int) -> list[int]:
    """The tokens from below the root down to `node`."""
    out = []
    while node > 0:
        out.append(tree.tokens[node])
        node = tree.parents[node]
    return out[::-1]


def _likeliest_leaves(tree: DraftTree, k: int) -> list[int]:
    """The `k` leaves (nodes without children, the root excluded) of highest path log-probability."""
    has_child = set(tree.parents[1:])
    path_lp = [0.0] * tree.size
    for i in range(1, tree.size):
        path_lp[i] = path_lp[tree.parents[i]] + tree.logprobs[i]
    leaves = [i for i in range(1, tree.size) if i not in has_child]
    return sorted(leaves, key=lambda i: (-path_lp[i], i))[:k]


def _pass(tree: DraftTree, masks, vocab: int, rows: int, depth: int) -> DraftTree | None:
    """One pass (masks [n, W]: the tokens allowed after each node): None when it changes nothing."""
    out = DraftTree([tree.tokens[0]], [-1], [0], [0.0])
    where = {0: 0}  # old node -> new node
    children: dict[int, set[int]] = {}
    for i in range(1, tree.size):
        children.setdefault(tree.parents[i], set()).add(tree.tokens[i])
    for i in range(tree.size):
        if i:
            p = tree.parents[i]
            if p not in where or not allows(masks[p], tree.tokens[i]):
                continue
            where[i] = out.size
            _add(out, tree.tokens[i], where[p], tree.depths[i], tree.logprobs[i])
        d = tree.depths[i]
        t = forced(masks[i], vocab) if d < depth else None
        if t is not None and t not in children.get(i, ()):  # the one token allowed, not drafted
            _add(out, t, where[i], d + 1, 0.0)
    if out.size > rows:  # (a prefix of a parents-first tree is a tree)
        out = DraftTree(out.tokens[:rows], out.parents[:rows], out.depths[:rows], out.logprobs[:rows])
    return None if (out.tokens, out.parents) == (tree.tokens, tree.parents) else out


def _graft(tree: DraftTree, start: int, chain: list[int]) -> DraftTree:
    """`tree` with the token `chain` below node `start`: drafted nodes that carry it are followed, the
    rest is added as a chain right after the deepest of them (later nodes move down)."""
    children = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens)) if i}
    node, i = start, 0
    while i < len(chain) and (node, chain[i]) in children:
        node, i = children[node, chain[i]], i + 1
    k = len(chain) - i
    if k == 0:
        return tree
    at = node + 1                                    # the chain's first index

    def shift(j: int) -> int:                        # an old index's new one
        return j if j < at else j + k
    out = DraftTree(tree.tokens[:at], [p if p < 0 else shift(p) for p in tree.parents[:at]], tree.depths[:at],
                    tree.logprobs[:at])
    for n, t in enumerate(chain[i:]):
        _add(out, t, node if n == 0 else at + n - 1, tree.depths[node] + n + 1, 0.0)
    for j in range(at, tree.size):
        _add(out, tree.tokens[j], shift(tree.parents[j]), tree.depths[j], tree.logprobs[j])
    return out


def _add(tree: DraftTree, token: int, parent: int, depth: int, logprob: float) -> None:
    tree.tokens.append(token)
    tree.parents.append(parent)
    tree.depths.append(depth)
    tree.logprobs.append(logprob)
