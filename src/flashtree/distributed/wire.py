"""The tensor-parallel wire: what rank 0 broadcasts to the other ranks, and how it is packed.

One message is an op code (`INIT`, `TARGET`, `MOVE`, `PING`, `STOP`), a few ints and up to
`MAX_TENSORS` tensors (each <= 3-D). It travels as one int64 header broadcast, then one flat
buffer per wire dtype (int64 for integers, uint8 for bools, floats as themselves): three
collectives for a target forward whatever its tensors. `Channel` is both ends: rank 0 sends with
its named methods (`init`, `target`, `move`, `ping`, `stop` — the runner's `Broadcaster`
interface, `engine/model_runner.py`, matched by shape, not imported), every other rank `recv`s.

This module packs and broadcasts; it does not join or leave the process group, launch ranks, run
forwards or turn a failing collective into an engine error (`tp.py` and the model runner do). It
imports nothing from `flashtree.engine`.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

INIT, TARGET, MOVE, STOP, PING = 1, 2, 3, 4, 5
_DTYPES = [torch.int64, torch.bool, torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32]
HEADER = 64  # int64 slots: op, n tensors, then (dtype code, ndim, 3 dims) per tensor, then op ints
MAX_TENSORS = 10
_INTS = 2 + 5 * MAX_TENSORS  # the header slot the op's ints start at


class Channel:
    """Rank 0 -> all: one op, a few ints and up to MAX_TENSORS tensors per message, on `device`
    (where the collectives run: CUDA for NCCL, the CPU for gloo)."""

    def __init__(self, device: torch.device):
        self.device = device

    # ------------------------------------------------------------------ rank 0: what it sends
    def init(self, num_pages: int, page_size: int) -> None:
        """The KV cache layout every rank allocates (sent once, first)."""
        self.send(INIT, ints=(num_pages, page_size))

    def target(self, tokens: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
               vis: torch.Tensor, rows: torch.Tensor) -> None:
        """One target forward's inputs: tokens, positions [B, T]; table [B, pages]; lengths [B];
        vis [B, T, T]; rows [B, T] the physical rows its new K/V go to."""
        self.send(TARGET, tensors=(tokens, positions, table, lengths, vis, rows))

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical cache rows src [M] -> dst [M]."""
        self.send(MOVE, tensors=(src, dst))

    def ping(self) -> None:
        """Nothing to run: fails when a rank stopped answering."""
        self.send(PING)

    def stop(self) -> None:
        """The other ranks leave their loop."""
        self.send(STOP)

    # ------------------------------------------------------------------ both ends: the packing
    def send(self, op: int, ints: tuple[int, ...] = (), tensors: tuple[torch.Tensor, ...] = ()) -> None:
        head = torch.zeros(HEADER, dtype=torch.int64)
        head[0], head[1] = op, len(tensors)
        for i, t in enumerate(tensors):
            head[2 + 5 * i: 4 + 5 * i] = torch.tensor([_DTYPES.index(t.dtype), t.dim()])
            head[4 + 5 * i: 4 + 5 * i + t.dim()] = torch.tensor(t.shape)
        head[_INTS: _INTS + len(ints)] = torch.tensor(ints, dtype=torch.int64)
        dist.broadcast(head.to(self.device), 0)
        for wire, group in _groups([t.dtype for t in tensors]).items():
            flat = torch.cat([tensors[i].to(self.device, wire).flatten() for i in group])
            dist.broadcast(flat, 0)

    def recv(self) -> tuple[int, list[int], list[torch.Tensor]]:
        """A rank > 0: the next message as (op, its ints, its tensors in the order sent). The ints
        are every header slot after the tensors' (zeros past those sent)."""
        head = torch.zeros(HEADER, dtype=torch.int64, device=self.device)
        dist.broadcast(head, 0)
        head = head.cpu()
        op, n = int(head[0]), int(head[1])
        dtypes, shapes = [], []
        for i in range(n):
            dtypes.append(_DTYPES[int(head[2 + 5 * i])])
            shapes.append(head[4 + 5 * i: 4 + 5 * i + int(head[3 + 5 * i])].tolist())
        out: list[torch.Tensor | None] = [None] * n
        for wire, group in _groups(dtypes).items():
            sizes = [math.prod(shapes[i]) for i in group]
            flat = torch.empty(sum(sizes), dtype=wire, device=self.device)
            dist.broadcast(flat, 0)
            for i, part in zip(group, flat.split(sizes)):
                out[i] = part.view(shapes[i]).to(dtypes[i])
        return op, head[_INTS:].tolist(), out


def _groups(dtypes: list[torch.dtype]) -> dict[torch.dtype, list[int]]:
    """Tensor indices by the dtype they travel as: bools as uint8, other integers as int64,
    floats as themselves."""
    out: dict[torch.dtype, list[int]] = {}
    for i, d in enumerate(dtypes):
        wire = torch.uint8 if d == torch.bool else (d if d.is_floating_point else torch.int64)
        out.setdefault(wire, []).append(i)
    return out
