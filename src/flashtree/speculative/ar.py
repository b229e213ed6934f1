"""`ar`: plain decoding — the tree is the root alone, so every round commits exactly one token."""
from __future__ import annotations

from .proposer import Proposer
from .tree import DraftTree, root_only


class AR(Proposer):
    name = "ar"
    summary = "plain decoding needs only the target"

    def tree(self, seq, draft, depth: int) -> DraftTree:
        return root_only(seq.bonus)
