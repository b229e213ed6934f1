"""Static KV cache for a batch of sequences, with tree-shaped writes and compaction.

Layout: K and V are each one tensor [layers, slots, capacity, kv_heads, head_dim]. A sequence
owns one slot; its committed tokens sit at cache rows 0..len-1 (row == position). The model
runner reads rows inside a forward and writes a forward's new tokens afterwards at explicit rows (tree node j of a round goes to row len+j); `compact`
then moves the accepted nodes down to contiguous rows. The cache does not track lengths —
the engine's sequences do — and it never decides what is visible: the caller's mask does.
"""
from __future__ import annotations

import torch


class CacheFullError(RuntimeError):
    """No free slot is left."""


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, capacity: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_slots, capacity, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    # slot ownership -------------------------------------------------------------------------
    def allocate(self) -> int:
        if not self._free:
            raise CacheFullError(f"all {self.num_slots} KV cache slots are in use")
        return self._free.pop()

    def free(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not allocated")
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    # data movement --------------------------------------------------------------------------
    def write(self, slots: torch.Tensor, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Every layer's new rows at once. slots [B]; rows [B, T]; k, v [L, B, T, Hkv, D]."""
        self.k[:, slots[:, None], rows] = k
        self.v[:, slots[:, None], rows] = v

    def compact(self, slots: list[int], src_rows: list[int], dst_rows: list[int]) -> None:
        """Copy rows src -> dst (same slot) in every layer; entries with src == dst are skipped."""
        moves = [(s, a, b) for s, a, b in zip(slots, src_rows, dst_rows) if a != b]
        if not moves:
            return
        idx = torch.tensor(moves, dtype=torch.long, device=self.k.device)  # [M, 3]
        s, src, dst = idx[:, 0], idx[:, 1], idx[:, 2]
        self.k[:, s, dst] = self.k[:, s, src]
        self.v[:, s, dst] = self.v[:, s, src]
