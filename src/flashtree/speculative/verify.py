"""Verification: one rule for chains and trees, as a pure tensor function.

Rule (target-only, lossless for any draft that does not depend on the verify draws): at every
node the target draws y_i from the sampling pipeline applied to that node's logits (argmax when
greedy). Walk from the root: if a child of the current node carries the current node's draw,
move to it; otherwise stop — the draw becomes the bonus token. Siblings are distinct, so the
accepted nodes form one root-to-node path. Draft probabilities never enter the rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class VerifyOutput:
    accepted: torch.Tensor   # [B, T] bool: node is on the accepted path (root always)
    last: torch.Tensor       # [B] index of the deepest accepted node
    bonus: torch.Tensor      # [B] the target's draw at `last`: the next root


def verify_tree(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                valid: torch.Tensor, draws: torch.Tensor, vis: torch.Tensor) -> VerifyOutput:
    """tokens, parents, depths, valid, draws: [B, T] (node 0 = root; parents[:, 0] = 0;
    padding nodes have valid = False). draws[b, i] = the target's token drawn at node i.
    vis [B, T, T] bool: vis[b, i, j] when node j is node i or one of its ancestors. A fixed
    number of tensor ops, whatever the depth: no loop, no host sync."""
    is_root = torch.zeros_like(valid)
    is_root[:, 0] = True
    # a node matches when its token equals its parent's draw
    match = valid & (tokens == draws.gather(1, parents)) & ~is_root        # [B, T]
    ok = match | is_root
    # accepted = valid and every node on its root path (itself included) matched
    accepted = valid & ~(vis & ~ok[:, None, :]).any(dim=-1)                # [B, T]
    last = torch.where(accepted, depths, -1).argmax(dim=1)                 # [B]
    bonus = draws.gather(1, last[:, None]).squeeze(1)
    return VerifyOutput(accepted, last, bonus)
