"""Tensor parallelism of the target, Megatron-style: which slice of each weight a rank holds, and
the one all-reduce after each row-parallel projection.

Rank r of N holds query heads [r*H/N, (r+1)*H/N) and KV heads [r*Hkv/N, (r+1)*Hkv/N) — q/k/v are
column-parallel, o_proj is row-parallel over the same heads — and rows [r*F/N, (r+1)*F/N) of
gate/up (column-parallel) with the same columns of down_proj (row-parallel). The embedding, the
norms and the LM head are replicated (the vocabularies served here are small; every rank then
holds the full hidden state after each all-reduce, so the drafter's features need no gather). A
row-parallel projection's bias is added once: rank 0 holds it, the others hold zeros. Each
rank's model is built from `local_config` (its share of heads and intermediate size), so its
KV cache holds only its heads.

This module moves no data between processes other than the all-reduce (`distributed/` launches
ranks and broadcasts each forward's inputs) and runs eager: TP>1 does not compile.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..errors import UserError


@dataclass(frozen=True, slots=True)
class TPGroup:
    rank: int
    world: int


def check_shardable(cfg: ModelConfig, world: int) -> None:
    """Heads, KV heads and the intermediate size must split evenly over the ranks."""
    for name, n in (("num_attention_heads", cfg.num_attention_heads), ("num_key_value_heads", cfg.num_key_value_heads),
                    ("intermediate_size", cfg.intermediate_size)):
        if n % world:
            extra = (" (fewer KV heads than ranks would need replicated KV heads, which flashtree does not do)"
                     if name == "num_key_value_heads" and n < world else "")
            raise UserError(f"tensor_parallel_size={world} must divide the target's {name} ({n}){extra}; "
                            f"use a tensor_parallel_size that divides {n}")


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """One rank's share of the target: H/N heads, Hkv/N KV heads, F/N intermediate."""
    check_shardable(cfg, world)
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // world,
                               num_key_value_heads=cfg.num_key_value_heads // world,
                               intermediate_size=cfg.intermediate_size // world)


ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")          # input dim split, output all-reduced
COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")


def shard_index(name: str, shape: tuple[int, ...], tp: TPGroup) -> tuple | str | None:
    """What rank tp.rank reads of checkpoint tensor `name` of `shape`: an index tuple (its slice),
    None (the whole tensor: replicated) or "zeros" (a row-parallel bias on ranks > 0)."""
    module, _, kind = name.rpartition(".")
    if module.endswith(COLUMN_PARALLEL):  # weight [out, in] and bias [out]: split out
        n = shape[0] // tp.world
        return (slice(tp.rank * n, (tp.rank + 1) * n),)
    if module.endswith(ROW_PARALLEL):
        if kind == "bias":
            return None if tp.rank == 0 else "zeros"
        n = shape[1] // tp.world                                   # weight [out, in]: split in
        return (slice(None), slice(tp.rank * n, (tp.rank + 1) * n))
    return None


def make_all_reduce(group=None):
    """The sum over ranks, in place (each layer's partial o_proj / down_proj outputs)."""
    import torch.distributed as dist

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=group)
        return t
    return all_reduce
