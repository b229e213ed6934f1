"""`dflash`: one DFlash drafter pass per round, its argmax drafts verified as a chain.

`DFlashDrafts` owns what every drafter-based method shares: each sequence's pending target
features (those of committed tokens not yet in the drafter's context cache, which the model
runner holds). One
pass runs [bonus, MASK x (K-1)] for its sequences and returns per-depth top-k drafts on the host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..engine.round import DraftOutput
from ..models import cpu_dense
from .proposer import Proposer
from .tree import DraftTree, chain_tree

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..engine.sequence import Sequence


@dataclass(slots=True)
class Pending:
    """One sequence's target features not yet in the drafter's context cache, in the chunks they
    arrived in: joined only when a pass reads them, so a sequence that plain-decodes for many
    rounds (budget="auto") appends each round's rows without copying the earlier ones."""
    chunks: list[torch.Tensor] = field(default_factory=list)   # [[n_i, F], ...] in token order
    rows: int = 0

    def add(self, feats: torch.Tensor) -> None:
        self.chunks.append(feats)
        self.rows += feats.shape[0]

    def joined(self) -> torch.Tensor | None:
        """All rows as one [rows, F] tensor (None: none)."""
        if len(self.chunks) > 1:
            self.chunks = [torch.cat(self.chunks)]
        return self.chunks[0] if self.chunks else None

    def drop(self, n: int) -> None:
        """Forget the first n rows (a pass wrote them to the cache)."""
        joined = self.joined() if n else None
        if joined is not None:
            rest = joined[n:]
            self.chunks, self.rows = ([rest] if rest.shape[0] else []), rest.shape[0]


# Padding rows (batch x longest pending context - the rows pending) above which a pass first writes
# the pending context flat (`DFlashDrafts._write_flat`): a request joining a batch of 8 with a
# 76-row prompt padded every sequence to 76 rows (608 for 104 real; ~5 us a row here); a flat write
# costs ~0.2 ms of eager calls besides its rows.
FLAT_CONTEXT_WASTE = 64


class DFlashDrafts:
    """The drafter pass. `source(seqs) -> {seq: DraftOutput}` is where drafts come from: this
    pass (`run`) by default, or a test's oracle with the same signature."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.mask_token_id = engine.drafter.config.mask_token_id
        self.pending: dict[Sequence, Pending] = {}  # features not yet in the drafter cache
        self.fed: dict[Sequence, int] = {}               # pending rows this round's pass wrote to the cache
        self.source = self.run
        self.flat_context_waste = FLAT_CONTEXT_WASTE  # padding rows above which pending context goes flat first
        self._wanted: list[Sequence] = []   # this round's sequences of every drafter-based method
        self._out: dict | None = None       # their drafts, once the round's one pass ran

    def want(self, seqs: list[Sequence]) -> None:
        if self._out is not None:   # the first `want` of a new round
            self._wanted, self._out = [], None
        self._wanted += seqs

    def take(self, seqs: list[Sequence]) -> list[DraftOutput | None]:
        """The drafts of `seqs` from one pass over every sequence wanted this round."""
        if self._out is None:
            wanted, self._wanted = self._wanted or list(seqs), []
            self._out = {}
            self._out = self.source(wanted)
        return [self._out.get(s) for s in seqs]

    def run(self, seqs: list[Sequence]) -> dict[Sequence, DraftOutput]:
        """One drafter pass over [bonus, MASK x (K-1)] for every sequence; writes the pending
        context rows to the drafter cache (rerunning rewrites the same rows)."""
        eng = self.engine
        dev, B = eng.device, len(seqs)
        K = max(s.block_size for s in seqs)
        pend = [self.pending[s].joined() if s in self.pending else None for s in seqs]
        n_ctx = np.array([p.shape[0] if p is not None else 0 for p in pend])
        lengths, fed = np.array([s.length for s in seqs]), n_ctx.tolist()  # this pass writes every pending row
        if B * int(n_ctx.max()) - sum(fed) > self.flat_context_waste:       # padding would dominate: flat first
            self._write_flat([s.slot for s in seqs], lengths - n_ctx, pend, n_ctx)
            pend, n_ctx = [None] * B, np.zeros(B, dtype=n_ctx.dtype)
        C, F = int(n_ctx.max()), eng.drafter.fc.in_features
        if B == 1 and C:
            ctx = pend[0][None]                                              # [1, C, F] as it is
        else:
            ctx = torch.zeros(B, C, F, dtype=eng.dtype, device=dev)
            for b, p in enumerate(pend):
                if n_ctx[b]:
                    ctx[b, :n_ctx[b]] = p
        past_np = lengths - n_ctx                                            # rows already in the drafter cache
        block_np = np.full((B, K), self.mask_token_id, dtype=np.int64)
        block_np[:, 0] = [s.bonus for s in seqs]

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev)
        past, ctx_len = tensor(past_np), tensor(n_ctx)
        ctx_pos = tensor(past_np[:, None] + np.arange(C))                    # [B, C]
        block, block_pos = tensor(block_np), tensor(lengths[:, None] + np.arange(K))   # [B, K]
        block_len = tensor(np.array([s.block_size for s in seqs]))
        logprobs = eng.runner.run_drafter(block, block_pos, ctx, ctx_pos, [s.slot for s in seqs], past, ctx_len,
                                          block_len)                         # [B, K-1, V]
        k = min(max(eng.proposers[s.method].ranks(s) for s in seqs), logprobs.shape[-1])
        top_lp, top_ids = cpu_dense.topk(logprobs, k)                        # [B, K-1, k] each
        top_lp, top_ids = top_lp.cpu().numpy(), top_ids.cpu().numpy()  # host copy 1 of 2 (2: the draws)
        self.fed.update(zip(seqs, fed))
        return {s: DraftOutput(top_lp[b, :s.block_size - 1], top_ids[b, :s.block_size - 1])
                for b, s in enumerate(seqs)}

    def _write_flat(self, slots: list[int], past: np.ndarray, pend: list, n_ctx: np.ndarray) -> None:
        """Every sequence's pending context rows to the drafter cache as one flat batch: rows
        past[b] .. past[b] + n_ctx[b] - 1 of slot b, no padding."""
        rows = [p for p in pend if p is not None and p.shape[0]]
        self.engine.runner.write_drafter_context(torch.cat(rows) if len(rows) > 1 else rows[0],
                                                 np.repeat(slots, n_ctx), np.concatenate(
                                                     [np.arange(a, a + n) for a, n in zip(past, n_ctx)]))

    def on_prefill(self, seq: Sequence, feats: torch.Tensor) -> None:
        """A prefill chunk is in the target cache: queue its tokens' features (a prompt prefilled
        in chunks arrives in order; tokens before the first chunk came from the prefix cache,
        whose drafter rows are written)."""
        self.pending.setdefault(seq, Pending()).add(feats)
        self.fed.pop(seq, None)

    def pending_rows(self, seq: Sequence) -> int:
        """Context rows of seq a pass would feed first (0: none, or not a drafter sequence)."""
        p = self.pending.get(seq)
        return 0 if p is None else p.rows

    def cached_rows(self, seq: Sequence) -> int | None:
        """Rows of seq's drafter context cache that are written (None: not a drafter sequence)."""
        p = self.pending.get(seq)
        return None if p is None else seq.length - p.rows

    def on_commit(self, seq: Sequence, feats: torch.Tensor) -> None:
        """Drop the rows the round's pass put in the cache; queue the committed tokens' features."""
        p = self.pending.get(seq)
        if p is None:
            p = self.pending[seq] = Pending()
        p.drop(self.fed.pop(seq, 0))
        p.add(feats)

    def release(self, seq: Sequence) -> None:
        self.pending.pop(seq, None)
        self.fed.pop(seq, None)


def drafts_of(engine: Engine) -> DFlashDrafts:
    """The engine's one drafter pass, shared by every drafter-based method (built on first use)."""
    if engine.drafts is None:
        engine.drafts = DFlashDrafts(engine)
    return engine.drafts


class DFlash(Proposer):
    """The drafter's argmax at each depth, as one chain."""
    name = "dflash"
    needs_drafter = True
    options = ("block_size",)
    drafts = "verifies one chain of block_size-1 drafts (set its length with block_size)"
    summary = "drafter found and matches the target"

    def __init__(self, engine: Engine):
        super().__init__(engine)
        drafts_of(engine)

    def configure(self, block_size, budget, topk, options) -> dict:
        bs = self.engine.block_size_of(block_size)
        return {"block_size": bs, "budget": bs - 1, "topk": None, "options": {}}  # a chain uses every slot

    def ranks(self, seq: Sequence) -> int:
        """Top-k width of the draft this method needs per depth."""
        return 1

    def prepare(self, seqs) -> None:
        self.engine.drafts.want(seqs)

    def draft(self, seqs, depths) -> list:
        return self.engine.drafts.take(seqs)

    def tree(self, seq, draft: DraftOutput, depth: int) -> DraftTree:
        return chain_tree(seq.bonus, draft.ids[:depth, 0].tolist(), draft.logprobs[:depth, 0].tolist())

    def on_prefill(self, seq, feats) -> None:
        self.engine.drafts.on_prefill(seq, feats)

    def on_commit(self, seq, tree, path, feats) -> None:
        self.engine.drafts.on_commit(seq, feats)

    def release(self, seq) -> None:
        self.engine.drafts.release(seq)
