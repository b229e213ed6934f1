"""The paged K/V tensors of one model (the target, or the drafter's context cache), and the
target's drafter features on the same rows (`FeatureCache`).

Layout: K and V are each one tensor [layers, num_pages * page_size, kv_heads, head_dim] — a pool
of physical rows. Which rows belong to which sequence, and which logical row (== position) each
is, is the block manager's business (`engine/block_manager.py`): everything here takes physical
rows. A forward reads rows through the page table and writes its new K/V (and features) at their
rows itself (`write_rows`, `write_features`: a compiled graph does the copies, mutating the cache
tensors it is handed in place); `move` copies accepted tree nodes down to their final rows.

On the CPU the pool is anonymous memory that the OS commits page by page when a row is first
written (`lazy_zeros`): the process's memory follows the rows in use, not the pool's size (the
block manager hands out the lowest free pages first, so they stay together).
"""
from __future__ import annotations

import mmap

import torch


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero tensor whose memory is committed when first written: on the CPU an anonymous
    mapping (zero pages until touched; `torch.zeros` writes, and so commits, every byte at once),
    elsewhere `torch.zeros`."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    # (the tensor keeps the mapping alive; the mapping is freed with the last view of it)
    return torch.frombuffer(mmap.mmap(-1, n), dtype=torch.uint8).view(dtype).view(shape)


def write_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> None:
    """Every layer's new rows at once. caches [L, num_rows, Hkv, D]; rows [B, T] physical; k, v [L, B, T, Hkv, D]."""
    idx = rows.reshape(-1)
    k_cache.index_copy_(1, idx, k.flatten(1, 2).to(k_cache.dtype))  # (23 vs 32 us for a setitem's index_put, eager)
    v_cache.index_copy_(1, idx, v.flatten(1, 2).to(v_cache.dtype))


def write_features(store: torch.Tensor, rows: torch.Tensor, feats: torch.Tensor) -> None:
    """store [num_rows, F]; rows [B, T] physical; feats [B, T, F]."""
    store.index_copy_(0, rows.reshape(-1), feats.reshape(-1, store.shape[1]).to(store.dtype))


class KVCache:
    def __init__(self, num_layers: int, num_rows: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str):
        shape = (num_layers, num_rows, num_kv_heads, head_dim)
        self.k = lazy_zeros(shape, dtype, device)
        self.v = lazy_zeros(shape, dtype, device)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """rows [B, T] physical; k, v [L, B, T, Hkv, D] (see write_rows)."""
        write_rows(self.k, self.v, rows, k, v)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical rows src -> dst [M] in every layer (a round's accepted nodes)."""
        self.k.index_copy_(1, dst, self.k.index_select(1, src))  # all of src read before any dst written
        self.v.index_copy_(1, dst, self.v.index_select(1, src))


class FeatureCache:
    """The target's drafter features [num_rows, F] on the same physical rows as its K/V: every
    target forward writes its tokens' rows (`write_features`, beside their K/V), `move` follows the
    accepted nodes like the K/V, and a drafter pass reads the committed rows its context cache does
    not hold yet. So a sequence that decodes plainly for a while keeps them at no extra call."""

    def __init__(self, num_rows: int, width: int, dtype: torch.dtype, device: torch.device | str):
        self.data = lazy_zeros((num_rows, width), dtype, device)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical rows src -> dst [M] (all of src read before any dst written)."""
        self.data.index_copy_(0, dst, self.data.index_select(0, src))

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """The features of physical rows [...]: [..., F]."""
        return self.data.index_select(0, rows.reshape(-1)).view(*rows.shape, self.data.shape[1])
