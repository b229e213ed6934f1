"""The data passed between the phases of a round, and packing trees into one target forward.

draft -> `DraftOutput` (per-depth top-K drafts on the host) -> trees (`speculative/tree.py`) ->
`VerifyInput` (flat padded tensors + ancestor visibility) -> target forward -> `VerifyOutput`
(`speculative/verify.py`) -> commit. Nothing here runs a model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..speculative.tree import DraftTree


@dataclass(slots=True)
class DraftOutput:
    logprobs: np.ndarray   # [L, K] per-depth top-K draft log-probs, descending
    ids: np.ndarray        # [L, K] their token ids


@dataclass(slots=True)
class VerifyInput:
    tokens: torch.Tensor     # [B, T] node tokens (root first), pad 0
    parents: torch.Tensor    # [B, T] parent index (root and pad: 0)
    depths: torch.Tensor     # [B, T]
    valid: torch.Tensor      # [B, T] bool
    positions: torch.Tensor  # [B, T] RoPE position = length + depth (cache row = length + node index)
    lengths: torch.Tensor    # [B] committed rows each sequence's nodes see
    vis: torch.Tensor        # [B, T, T] bool: node t sees node j (ancestors and itself)
    nodes: torch.Tensor      # [R] flat indices (b * T + t) of the valid nodes, sequence-major
    sizes: list[int]         # nodes per sequence (root included)
    deepest: list[int]       # each sequence's largest node depth

    @property
    def row_depths(self) -> torch.Tensor:
        """[R] the depth of each valid node, in row (sequence-major) order."""
        return self.depths.flatten()[self.nodes]

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Row range of each sequence among the R valid nodes."""
        ends = np.cumsum(self.sizes).tolist()
        return [(e - n, e) for e, n in zip(ends, self.sizes)]

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """Per-valid-node values [R] -> padded [B, T] (no host sync)."""
        return torch.zeros_like(self.tokens).flatten().index_copy(0, self.nodes, values).view_as(self.tokens)


def pack_trees(trees: list[DraftTree], lengths: list[int], device) -> VerifyInput:
    B, T = len(trees), max(t.size for t in trees)
    tokens = np.zeros((B, T), dtype=np.int64)
    parents = np.zeros((B, T), dtype=np.int64)
    depths = np.zeros((B, T), dtype=np.int64)
    valid = np.zeros((B, T), dtype=bool)
    vis = np.zeros((B, T, T), dtype=bool)
    vis[:, np.arange(T), np.arange(T)] = True  # padding sees itself only: no all-masked attention row
    for b, t in enumerate(trees):
        n = t.size
        tokens[b, :n] = t.tokens
        parents[b, 1:n] = t.parents[1:]
        depths[b, :n] = t.depths
        valid[b, :n] = True
        vis[b, :n, :n] = t.visibility()
    length = torch.tensor(lengths, dtype=torch.long, device=device)
    depths_t = torch.from_numpy(depths).to(device)
    return VerifyInput(tokens=torch.from_numpy(tokens).to(device), parents=torch.from_numpy(parents).to(device),
                       depths=depths_t, valid=torch.from_numpy(valid).to(device),
                       positions=length[:, None] + depths_t, lengths=length, vis=torch.from_numpy(vis).to(device),
                       nodes=torch.from_numpy(np.flatnonzero(valid)).to(device),
                       sizes=[t.size for t in trees], deepest=[max(t.depths) for t in trees])
