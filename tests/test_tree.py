"""Property tests of the DDTree builder and the verify walk."""
import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtree.speculative.tree import DraftTree, build_ddtree, chain_tree
from flashtree.speculative.verify import verify_tree


def topk(rows: np.ndarray, K: int):
    order = np.argsort(-rows, axis=1, kind="stable")[:, :K]
    return np.take_along_axis(rows, order, 1), order


@st.composite
def drafts(draw):
    L = draw(st.integers(1, 4))
    V = draw(st.integers(2, 5))
    # distinct log-probs per depth (ties are handled but make "the top-N set" ambiguous)
    vals = draw(st.lists(st.integers(-40, 0), min_size=L * V, max_size=L * V, unique=True))
    lp = np.array(vals, dtype=np.float64).reshape(L, V) / 7.0
    budget = draw(st.integers(1, 30))
    return lp, budget


@settings(max_examples=200, deadline=None)
@given(drafts())
def test_tree_is_the_top_budget_prefixes(case):
    lp, budget = case
    L, V = lp.shape
    K = min(budget, V)
    top_lp, top_ids = topk(lp, K)
    tree = build_ddtree(99, top_lp, top_ids, budget)
    possible = sum(K ** d for d in range(1, L + 1))
    assert tree.size - 1 == min(budget, possible)
    assert tree.tokens[0] == 99 and tree.parents[0] == -1
    for i in range(1, tree.size):
        p = tree.parents[i]
        assert 0 <= p < i and tree.depths[i] == tree.depths[p] + 1
    # siblings distinct, in descending draft probability
    for p in range(tree.size):
        kids = [i for i in range(tree.size) if tree.parents[i] == p]
        toks = [tree.tokens[i] for i in kids]
        assert len(set(toks)) == len(toks)
        probs = [tree.logprobs[i] for i in kids]
        assert probs == sorted(probs, reverse=True)

    # brute force: all prefixes over the top-K tokens, scored by summed log-probs
    def path(i):
        out = []
        while i > 0:
            out.insert(0, tree.tokens[i])
            i = tree.parents[i]
        return tuple(out)

    scores = {}
    for d in range(1, L + 1):
        for ranks in itertools.product(range(K), repeat=d):
            scores[tuple(int(top_ids[j, r]) for j, r in enumerate(ranks))] = sum(top_lp[j, r] for j, r in enumerate(ranks))
    best = sorted(scores.values(), reverse=True)[: tree.size - 1]
    got = sorted((scores[path(i)] for i in range(1, tree.size)), reverse=True)
    assert np.allclose(got, best)


def test_ties_break_to_the_lexicographically_smaller_rank_tuple():
    lp = np.zeros((3, 3))
    ids = np.arange(3)[None].repeat(3, 0)
    t1 = build_ddtree(0, lp, ids, 5)
    t2 = build_ddtree(0, lp, ids, 5)
    assert (t1.tokens, t1.parents) == (t2.tokens, t2.parents)
    # with all scores equal, a prefix beats its extension, then rank order: (0), (0,0), (0,0,0), (0,0,1), (0,0,2)
    assert t1.depths == [0, 1, 2, 3, 3, 3]


def test_verify_walk_follows_matching_children_and_stops_at_first_miss():
    # tree: 0 -> 1 (tok 5), 0 -> 2 (tok 6), 1 -> 3 (tok 7), 3 -> 4 (tok 8)
    tokens = np.array([[4, 5, 6, 7, 8]])
    parents = np.array([[0, 0, 0, 1, 3]])
    depths = np.array([[0, 1, 1, 2, 3]])
    valid = np.ones((1, 5), dtype=bool)
    draws = np.array([[5, 7, 0, 9, 0]])   # root drew 5 -> node 1; node 1 drew 7 -> node 3; node 3 drew 9: miss
    vis = DraftTree([4, 5, 6, 7, 8], [-1, 0, 0, 1, 3], [0, 1, 1, 2, 3], [0.0] * 5).visibility()
    out = verify_tree(tokens, parents, depths, valid, draws, vis[None])
    assert out.accepted[0].tolist() == [True, True, False, True, False]
    assert out.last.item() == 3 and out.bonus.item() == 9


def test_verify_walk_matches_a_host_walk_on_random_trees():
    """The loop-free walk (no unmatched node on the root path) == walking child by child."""
    import random

    from flashtree.engine.round import pack_trees
    rng = random.Random(0)
    for _ in range(300):
        trees, walks, draws_rows = [], [], []
        for _b in range(3):
            n = rng.randint(1, 12)
            parents = [-1] + [rng.randrange(i) for i in range(1, n)]
            tokens, depths = [rng.randrange(4)], [0]
            for i in range(1, n):
                depths.append(depths[parents[i]] + 1)
                used = {tokens[j] for j in range(1, i) if parents[j] == parents[i]}
                tokens.append(next(t for t in rng.sample(range(8), 8) if t not in used))  # siblings distinct
            draws = [rng.randrange(4) for _ in range(n)]
            node, path = 0, [0]
            while True:  # host reference: move to the child carrying the current node's draw
                kids = [i for i in range(1, n) if parents[i] == node and tokens[i] == draws[node]]
                if not kids:
                    break
                node = kids[0]
                path.append(node)
            trees.append(DraftTree(tokens, parents, depths, [0.0] * n))
            walks.append((path, draws[node]))
            draws_rows.append(draws)
        vin = pack_trees(trees, [5, 6, 7], "cpu")
        T = vin.tokens.shape[1]
        draws_t = np.array([d + [0] * (T - len(d)) for d in draws_rows])
        out = verify_tree(vin.tokens, vin.parents, vin.depths, vin.valid, draws_t, vin.vis)
        for b, (path, bonus) in enumerate(walks):
            assert [i for i, ok in enumerate(out.accepted[b].tolist()) if ok] == path
            assert out.bonus[b].item() == bonus
    chain = chain_tree(4, [5, 7, 8])
    assert chain.parents == [-1, 0, 1, 2] and chain.depths == [0, 1, 2, 3]


def test_a_plain_round_packs_and_verifies_as_the_general_rule_does():
    """Root-only trees (plain rounds) take a shortcut in pack_trees, scatter and verify_tree: the
    same arrays and the same walk as the general path, which a wider tree in the batch forces."""
    import torch

    from flashtree.engine.round import pack_trees
    roots = [DraftTree([t], [-1], [0], [0.0]) for t in (3, 9, 4)]
    lengths = [5, 11, 7]
    plain = pack_trees(roots, lengths, "cpu")
    wide = pack_trees(roots + [chain_tree(2, [6])], lengths + [8], "cpu")  # T = 2: the general path
    for name in ("tokens", "parents", "depths", "valid"):
        assert getattr(plain, name).tolist() == getattr(wide, name)[:3, :1].tolist(), name
    assert plain.vis.tolist() == wide.vis[:3, :1, :1].tolist()
    assert plain.positions.tolist() == wide.positions[:3, :1].tolist()
    assert plain.flat.tolist() == [0, 1, 2] and plain.nodes.tolist() == [0, 1, 2]
    assert plain.lengths.tolist() == lengths and plain.mask.dtype == torch.bool
    assert (plain.sizes, plain.deepest, plain.spans) == ([1, 1, 1], [0, 0, 0], [(0, 1), (1, 2), (2, 3)])
    assert plain.row_depths.tolist() == [0, 0, 0]
    draws = plain.scatter(torch.tensor([7, 1, 5]))
    assert draws.dtype == np.int64 and draws.tolist() == [[7], [1], [5]]
    out = verify_tree(plain.tokens, plain.parents, plain.depths, plain.valid, draws, plain.vis)
    pad = lambda a: np.concatenate([a, np.zeros_like(a)], axis=1)
    vis2 = np.zeros((3, 2, 2), dtype=bool)
    vis2[:, 0, 0] = vis2[:, 1, 1] = True
    ref = verify_tree(pad(plain.tokens), pad(plain.parents), pad(plain.depths), pad(plain.valid), pad(draws), vis2)
    assert out.accepted.tolist() == ref.accepted[:, :1].tolist() == [[True]] * 3
    assert out.last.tolist() == ref.last.tolist() == [0, 0, 0]
    assert out.bonus.tolist() == ref.bonus.tolist() == [7, 1, 5]
