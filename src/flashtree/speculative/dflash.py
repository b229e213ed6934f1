"""`dflash`: one DFlash drafter pass per round, its argmax drafts verified as a chain.

`DFlashDrafts` owns what every drafter-based method shares: how many of each sequence's
committed rows are in the drafter's context cache. The rows past them are pending: their target
features wait in the model runner's `features` (written by the target's forwards, moved with
the accepted nodes), and the next pass reads and caches them first. One pass runs
[bonus, MASK x (K-1)] for its sequences and returns per-depth top-k drafts on the host.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from ..models import cpu_dense
from .proposer import DraftShape, Proposer, ProposerContext
from .tree import DraftOutput, DraftTree, chain_tree

if TYPE_CHECKING:
    from ..engine.sequence import Sequence


# Padding rows (batch x longest pending context - the rows pending) above which a pass first writes
# the pending context flat (`DFlashDrafts._write_flat`): a request joining a batch of 8 with a
# 76-row prompt padded every sequence to 76 rows (608 for 104 real; ~5 us a row here); a flat write
# costs ~0.2 ms of eager calls besides its rows.
FLAT_CONTEXT_WASTE = 64


class DrafterRunner(Protocol):
    """What the pass needs of the model runner (`engine/model_runner.py`)."""

    def features_of(self, slots: list[int], past: np.ndarray, rows: int) -> torch.Tensor: ...

    def run_drafter(self, block, block_pos, ctx, ctx_pos, slots, past, ctx_len, block_len) -> torch.Tensor: ...

    def write_drafter_context(self, slots: np.ndarray, rows: np.ndarray) -> None: ...


class DFlashDrafts:
    """The drafter pass. `source(seqs) -> {seq: DraftOutput}` is where drafts come from: this
    pass (`run`) by default, or a test's oracle with the same signature. Each method says, as it
    asks for its sequences' drafts (`want`), how many ranks per depth it reads (`ranks`)."""

    def __init__(self, runner: DrafterRunner, mask_token_id: int, device: torch.device):
        self.runner, self.mask_token_id, self.device = runner, mask_token_id, device
        self.ranks: dict[Sequence, int] = {}   # top-k width per depth each sequence's method reads
        self.cached: dict[Sequence, int] = {}  # rows in the drafter cache (those below s.length past them: pending)
        self.fed: dict[Sequence, int] = {}     # pending rows this round's pass wrote to the cache
        self.source = self.run
        self.flat_context_waste = FLAT_CONTEXT_WASTE  # padding rows above which pending context goes flat first
        self._wanted: list[Sequence] = []   # this round's sequences of every drafter-based method
        self._out: dict | None = None       # their drafts, once the round's one pass ran

    def want(self, seqs: list[Sequence], ranks: list[int]) -> None:
        """seqs' drafts are wanted this round, each read to its `ranks` per depth."""
        if self._out is not None:   # the first `want` of a new round
            self._wanted, self._out = [], None
        self._wanted += seqs
        self.read_to(seqs, ranks)

    def read_to(self, seqs: list[Sequence], ranks: list[int]) -> None:
        """A pass returns each of seqs' drafts to its `ranks` per depth (until it is released)."""
        self.ranks.update(zip(seqs, ranks))

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
        dev, B = self.device, len(seqs)
        K = max(s.block_size for s in seqs)
        slots = [s.slot for s in seqs]
        lengths = np.array([s.length for s in seqs])
        past_np = np.array([self.cached.get(s, s.length) for s in seqs])     # rows already in the drafter cache
        n_ctx = lengths - past_np                                            # pending rows: this pass writes them all
        fed = n_ctx.tolist()
        if B * int(n_ctx.max()) - sum(fed) > self.flat_context_waste:       # padding would dominate: flat first
            self._write_flat(slots, past_np, n_ctx)
            past_np, n_ctx = lengths, np.zeros(B, dtype=n_ctx.dtype)
        C = int(n_ctx.max())
        # [B, C, F]: each sequence's pending rows (past n_ctx[b]: rows the drafter masks out)
        ctx = self.runner.features_of(slots, past_np, C)
        block_np = np.full((B, K), self.mask_token_id, dtype=np.int64)
        block_np[:, 0] = [s.bonus for s in seqs]

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev)
        ctx_len = tensor(n_ctx)
        ctx_pos = tensor(past_np[:, None] + np.arange(C))                    # [B, C]
        block, block_pos = tensor(block_np), tensor(lengths[:, None] + np.arange(K))   # [B, K]
        block_len = tensor(np.array([s.block_size for s in seqs]))
        logprobs = self.runner.run_drafter(block, block_pos, ctx, ctx_pos, slots, past_np, ctx_len,
                                           block_len)                        # [B, K-1, Vd]
        k = min(max(self.ranks.get(s, 1) for s in seqs), logprobs.shape[-1])
        top_lp, top_ids = cpu_dense.topk(logprobs, k)                        # [B, K-1, k] each
        if top_lp.device.type == "cpu":  # on the host already: nothing to copy
            top_lp, top_ids = top_lp.numpy(), top_ids.numpy()
        else:  # the pass's one copy to the host (a round's other: the draws), values and ids together
            both = torch.stack([top_lp.double(), top_ids.double()]).cpu().numpy()  # (exact in float64)
            top_lp, top_ids = both[0].astype(np.float32), both[1].astype(np.int64)
        if self.runner.draft_ids is not None:  # draft-vocabulary indices -> token ids
            top_ids = self.runner.draft_ids[top_ids]
        self.fed.update(zip(seqs, fed))
        return {s: DraftOutput(top_lp[b, :s.block_size - 1], top_ids[b, :s.block_size - 1])
                for b, s in enumerate(seqs)}

    def _write_flat(self, slots: list[int], past: np.ndarray, n_ctx: np.ndarray) -> None:
        """Every sequence's pending context rows to the drafter cache as one flat batch: rows
        past[b] .. past[b] + n_ctx[b] - 1 of slot b, no padding."""
        self.runner.write_drafter_context(np.repeat(slots, n_ctx), np.concatenate(
            [np.arange(a, a + n) for a, n in zip(past, n_ctx)]))

    def on_prefill(self, seq: Sequence, rows: int) -> None:
        """A prefill chunk of `rows` rows is in the target cache: its rows are pending (a prompt
        prefilled in chunks arrives in order; tokens before the first chunk came from the prefix
        cache, whose drafter rows are written)."""
        self.cached.setdefault(seq, seq.length - rows)
        self.fed.pop(seq, None)

    def written(self, seq: Sequence, rows: int) -> None:
        """seq's context rows [0, rows) are in the drafter cache (the engine wrote them flat)."""
        if seq in self.cached:
            self.cached[seq] = max(self.cached[seq], rows)

    def pending_rows(self, seq: Sequence) -> int:
        """Context rows of seq a pass would feed first (0: none, or not a drafter sequence)."""
        c = self.cached.get(seq)
        return 0 if c is None else seq.length - c

    def cached_rows(self, seq: Sequence) -> int | None:
        """Rows of seq's drafter context cache that are written (None: not a drafter sequence)."""
        return self.cached.get(seq)

    def on_commit(self, seq: Sequence) -> None:
        """Count the rows the round's pass put in the cache (the committed tokens' rows, not yet
        appended to seq, are pending from now on)."""
        self.cached[seq] = self.cached.get(seq, seq.length) + self.fed.pop(seq, 0)

    def release(self, seq: Sequence) -> None:
        self.cached.pop(seq, None)
        self.fed.pop(seq, None)
        self.ranks.pop(seq, None)


class DFlash(Proposer):
    """The drafter's argmax at each depth, as one chain."""
    name = "dflash"
    needs_drafter = True
    options = ("block_size",)
    drafts = "verifies one chain of block_size-1 drafts (set its length with block_size)"
    summary = "drafter found and matches the target"

    def __init__(self, given: ProposerContext):
        super().__init__(given)
        if given.drafts is None:
            raise ValueError(f"method '{self.name}' needs the drafter pass")

    def configure(self, block_size, budget, topk, options) -> DraftShape:
        bs = self.limits.block_size_of(block_size)
        return DraftShape(block_size=bs, budget=bs - 1)  # a chain uses every slot

    @classmethod
    def round_tokens(cls, budget, topk, block_size, draft_len) -> int | None:
        return block_size  # the root and a chain of block_size - 1

    def ranks(self, seq: Sequence) -> int:
        """Top-k width of the draft this method needs per depth."""
        return 1

    def prepare(self, seqs) -> None:
        self.drafter_pass.want(seqs, [self.ranks(s) for s in seqs])

    def draft(self, seqs, depths) -> list:
        return self.drafter_pass.take(seqs)

    def tree(self, seq, draft: DraftOutput, depth: int) -> DraftTree:
        return chain_tree(seq.bonus, draft.ids[:depth, 0].tolist(), draft.logprobs[:depth, 0].tolist())

    def on_prefill(self, seq, rows) -> None:
        self.drafter_pass.on_prefill(seq, rows)

    def on_commit(self, seq, tree, path) -> None:
        self.drafter_pass.on_commit(seq)

    def release(self, seq) -> None:
        self.drafter_pass.release(seq)
