"""`ddtree`: the best-first tree of the drafter's per-depth marginals (`tree.build_ddtree`),
`budget` nodes (budget="auto": up to the engine's auto budget, of which each round verifies the
prefix `speculative/adaptive.py` chooses), at most `topk` children per node. Shares DFlash's
drafter pass."""
from __future__ import annotations

from .constrained import drafted_nodes
from .dflash import DFlash
from .limits import AUTO
from .proposer import DraftShape
from .tree import DraftOutput, DraftTree, build_ddtree


class DDTree(DFlash):
    name = "ddtree"
    options = ("budget", "topk", "block_size")

    def configure(self, block_size, budget, topk, options) -> DraftShape:
        lim = self.limits
        bs = lim.block_size_of(block_size)
        bud = lim.budget_of(budget)
        nodes = lim.nodes_of(bud)
        # the engine's default cap never exceeds this request's budget; a request's own is checked
        cap = lim.check_topk(topk, nodes) if topk is not None else \
            (min(lim.default_topk, nodes) if lim.default_topk is not None else None)
        return DraftShape(block_size=bs, budget=nodes, topk=cap, auto=bud == "auto")

    @classmethod
    def round_tokens(cls, budget, topk, block_size, draft_len) -> int | None:
        """A capped tree of depth block_size - 1 holds at most topk + topk^2 + ... nodes."""
        if budget == AUTO:
            return None
        nodes = budget or 0
        if topk is not None:
            nodes = min(nodes, sum(topk ** d for d in range(1, block_size)))
        return nodes + 1

    def ranks(self, seq) -> int:
        return drafted_nodes(seq)

    def tree(self, seq, draft: DraftOutput, depth: int) -> DraftTree:
        nodes = drafted_nodes(seq)  # (a grammar's pruning cuts it back to the budget)
        k = min(nodes, draft.ids.shape[1])
        return build_ddtree(seq.bonus, draft.logprobs[:depth, :k], draft.ids[:depth, :k], nodes, seq.topk)
