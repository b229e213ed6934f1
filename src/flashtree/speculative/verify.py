"""Verification: one rule for chains and trees, as a pure function of host arrays.

Rule (target-only, lossless for any draft that does not depend on the verify draws): at every
node the target draws y_i from the sampling pipeline applied to that node's logits (argmax when
greedy). Walk from the root: if a child of the current node carries the current node's draw,
move to it; otherwise stop — the draw becomes the bonus token. Siblings are distinct, so the
accepted nodes form one root-to-node path. Draft probabilities never enter the rule.

The walk runs on the host (numpy): the trees were built there, and the draws come over once per
round (`VerifyInput.scatter`) — a few microseconds of array work instead of a dozen device ops on
tensors of a few dozen elements.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class VerifyOutput:
    accepted: np.ndarray   # [B, T] bool: node is on the accepted path (root always)
    last: np.ndarray       # [B] index of the deepest accepted node
    bonus: np.ndarray      # [B] the target's draw at `last`: the next root


def verify_tree(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray,
                valid: np.ndarray, draws: np.ndarray, vis: np.ndarray) -> VerifyOutput:
    """tokens, parents, depths, valid, draws: [B, T] (node 0 = root; parents[:, 0] = 0;
    padding nodes have valid = False). draws[b, i] = the target's token drawn at node i.
    vis [B, T, T] bool: vis[b, i, j] when node j is node i or one of its ancestors. A fixed
    number of array ops, whatever the depth: no loop over nodes."""
    if tokens.shape[1] == 1:  # roots only (a plain round): the root is accepted, its draw is the bonus
        return VerifyOutput(valid.copy(), np.zeros(len(tokens), dtype=np.int64), draws[:, 0].copy())
    is_root = np.zeros_like(valid)
    is_root[:, 0] = True
    # a node matches when its token equals its parent's draw
    rows = np.arange(draws.shape[0])[:, None]
    match = valid & (tokens == draws[rows, parents]) & ~is_root                      # [B, T]
    ok = match | is_root
    # accepted = valid and every node on its root path (itself included) matched
    accepted = valid & ~(vis & ~ok[:, None, :]).any(axis=-1)                          # [B, T]
    last = np.where(accepted, depths, -1).argmax(axis=1)                               # [B]
    bonus = draws[rows[:, 0], last]
    return VerifyOutput(accepted, last, bonus)
