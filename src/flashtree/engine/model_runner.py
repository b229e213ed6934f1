"""The model runner: the target's and the drafter's forward passes and their KV caches.

The engine hands it one forward's tensors — a prefill, a verify batch of packed trees, a
drafter block — and gets logits back. Inside, each forward is one function of tensors: it reads
the cache rows a sequence may see and writes its new K/V (the target's also its drafter features,
`FeatureCache`) at the physical rows it is handed — its only side effect, so a compiled graph
does the copies itself, with no op of its own run after it. That function runs eager or compiled:

- `compile=False`: eager PyTorch (always available, the reference mode).
- `compile=True`: on the CPU, an AOTInductor package per shape bucket (`aot_graphs.py`: exported
  once, cached on disk, called with no dynamo frame — ~0.4 ms less per one-token step here than
  `torch.compile`'s guards and wrapper); on CUDA, `torch.compile` (inductor). Either way batch,
  tokens per sequence and context lengths are dynamic and sizes 1 are specialised, so the graphs
  are the buckets (batch 1 | >1) x (tokens 1 | >1) for the target and (batch 1 | >1) for the
  drafter; the runner pads every other dynamic size to >= 2 so it never specialises on them.
  `warmup()` compiles (or loads) all buckets up front; `defer()` leaves some to a helper process,
  and runs them eager until their packages are on disk.
- `compile="auto"`: on where it pays — CUDA, or a CPU with a C++ compiler for inductor — unless
  `FLASHTREE_COMPILE=0` is set in the environment (operators and the test suite use it to skip
  the warm-up).

Which pages each sequence's rows live in is the block manager's (`block_manager.py`): the runner
hands a forward the page table of its sequences and writes new K/V at the physical rows it names.
It does not choose tokens, build trees, sample or decide which pages a sequence gets (the engine's
scheduler does).

Tensor parallel: on rank 0 the runner hands each target forward's inputs and each KV move to a
`Broadcaster` (`attach`) before running them itself; a rank > 0 builds its runner from the page
layout alone (`layout=`, no block manager) and runs `execute_target` / `move_rows` on what
arrives. How the inputs travel is the broadcaster's (rank 0's `Channel`, `wire.py` of the
tensor-parallel package): the runner calls its methods, knows no op code, and imports nothing
from that package.
"""
from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from .. import switches
from ..errors import UserError
from ..models import cpu_dense
from ..models.drafter import DFlashDrafter
from ..models.layers import Linear, pack_projections
from ..models.quant import QuantLinear
from ..models.target import TargetModel
from . import aot_graphs
from .aot_graphs import AOTGraphs, NotCached
from .block_manager import BlockManager
from .kv_cache import FeatureCache, KVCache, write_features, write_rows

log = logging.getLogger("flashtree.engine")

COMPILE_CHOICES = ("auto", True, False)


class RankLost(RuntimeError):
    """A tensor-parallel rank died or stopped answering: the engine cannot continue."""


class Broadcaster(Protocol):
    """Tensor parallel, rank 0: what the runner tells the other ranks. Each call raises when a
    rank stopped answering (the runner turns that into RankLost)."""

    def init(self, num_pages: int, page_size: int) -> None:
        """The KV cache layout every rank allocates (once, first)."""

    def target(self, tokens: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
               vis: torch.Tensor, rows: torch.Tensor) -> None:
        """One target forward: tokens, positions [B, T]; table [B, pages]; lengths [B];
        vis [B, T, T]; rows [B, T] the physical rows its new K/V go to."""

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical cache rows src [M] -> dst [M]."""

    def ping(self) -> None:
        """Nothing to run: only whether every rank still answers."""


def resolve_compile(compile: bool | str, device: torch.device) -> bool:
    """What compile="auto" | True | False means on this machine."""
    if compile not in COMPILE_CHOICES:
        raise UserError(f"compile must be 'auto', True or False, got {compile!r}")
    if compile != "auto":
        return bool(compile)
    if switches.is_off("FLASHTREE_COMPILE"):
        return False
    return device.type == "cuda" or aot_graphs.available()


def _dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """Mark dims of size >= 2 dynamic (sizes 0/1 are specialised by dynamo: they are the buckets)."""
    for d in dims:
        if t.shape[d] >= 2:
            torch._dynamo.mark_dynamic(t, d)
    return t


def draft_vocabulary(drafter: DFlashDrafter | None) -> np.ndarray | None:
    """The drafter's draft vocabulary as target ids [Vd] int64, or None: the whole vocabulary (no
    draft vocabulary, or FLASHTREE_DRAFT_VOCAB=0, which measures what it saves)."""
    if drafter is None or drafter.config.draft_vocab is None or switches.is_off("FLASHTREE_DRAFT_VOCAB"):
        return None
    return np.asarray(drafter.config.draft_vocab, dtype=np.int64)


def head_rows(head: torch.nn.Module, ids: torch.Tensor) -> Linear | QuantLinear:
    """A bias-free LM head holding rows `ids` of `head`'s weight (a copy: the target keeps its own)."""
    if isinstance(head, QuantLinear):
        return QuantLinear(head.form.rows(ids))
    W = head.weight.detach()
    sub = Linear(W.shape[1], ids.shape[0], bias=False, device=W.device, dtype=W.dtype)
    with torch.no_grad():
        sub.weight.copy_(W.index_select(0, ids))
    return sub.requires_grad_(False)


SLOW_GRAPH_S = 2.0  # a warmup bucket slower than this compiled (a cached package loads in well under)


def _at_least_2(n: int) -> int:
    return max(n, 2)


class ModelRunner:
    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, blocks: BlockManager | None,
                 feature_layers: list[int] | None, compile: bool | str = False, *,
                 layout: tuple[int, int] | None = None):
        """blocks: the block manager whose pages the forwards read and write. A tensor-parallel
        rank > 0 has none: it passes layout=(num_pages, page_size) and runs only `execute_target`
        and `move_rows`, on physical rows rank 0 chose."""
        self.target, self.drafter, self.blocks = target, drafter, blocks
        if blocks is not None:
            layout = blocks.num_pages, blocks.page_size
        elif layout is None:
            raise ValueError("a model runner needs a block manager, or (a rank > 0) the page layout")
        self.num_pages, self.page_size = layout
        p = next(target.parameters())
        self.device, self.dtype = p.device, target.compute_dtype
        # float32 or bfloat16 on a CPU with AVX2: projections through the CPU kernel (models/cpu_dense.py)
        self.cpu_kernel = pack_projections(target)
        if drafter is not None and self.cpu_kernel:
            pack_projections(drafter)
        # the drafter's LM head: the target's, or the target's rows of the drafter's draft vocabulary
        # (draft_ids [Vd] maps a draft index to its target id); the head is most of a drafter pass's
        # bytes (SmolLM2 bf16: 57 MB over 49,152 rows)
        self.draft_ids = draft_vocabulary(drafter)
        self.draft_head = target.lm_head if self.draft_ids is None else \
            head_rows(target.lm_head, torch.from_numpy(self.draft_ids).to(self.device))
        if self.draft_ids is not None and self.cpu_kernel:
            pack_projections(self.draft_head)
        if self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16):
            log.info("projections: %s", "the CPU kernel (models/cpu_dense.cpp)" if self.cpu_kernel
                     else f"F.linear ({cpu_dense.why_unavailable()})")
        tc = target.config
        rows = self.num_pages * self.page_size
        # the cache is in the model's storage dtype (the CPU attention kernel reads bf16 rows as they
        # are), as are the drafter and the features it reads
        self.kv_dtype = kv_dtype = target.kv_dtype
        self.cache = KVCache(tc.num_hidden_layers, rows, tc.num_key_value_heads, tc.head_dim, kv_dtype, self.device)
        self.draft_cache = self.features = None
        if drafter is not None:
            lc = drafter.config.layers
            self.draft_cache = KVCache(lc.num_hidden_layers, rows, lc.num_key_value_heads, lc.head_dim, kv_dtype,
                                       self.device)
        self.feature_layers = tuple(feature_layers or ())
        if self.feature_layers:  # what the drafter reads: every target forward keeps its tokens' features
            self.features = FeatureCache(rows, len(self.feature_layers) * tc.hidden_size, kv_dtype, self.device)
        self.broadcaster: Broadcaster | None = None  # tensor parallel, rank 0: the other ranks (attach)
        self.deferred = None  # a compile_helper.Helper writing packages this runner runs eager meanwhile (defer)
        self.shapes: Counter = Counter()  # forwards run, by (model, batch, tokens per sequence)
        self._arange = torch.arange(rows, device=self.device)  # cols of every forward are a prefix of it
        self.compiled = resolve_compile(compile, self.device)
        self.warm = False  # every bucket traced (warmup): inputs no longer need dynamic marks
        # the forwards by mode: False = eager, True = compiled (only when built compiled)
        self._fns: dict[bool, tuple[Callable, Callable]] = {False: (self._target_step, self._draft_step)}
        self.aot = self.compiled and self.device.type == "cpu"  # compiled = AOTInductor packages (aot_graphs.py)
        if self.compiled:
            import torch.fx.experimental._config as fx_config
            fx_config.use_duck_shape = False  # equal sizes (batch == tokens) must not share a symbol
        if self.aot:
            # each graph holds the weights it reads (a package's key names them: a drafter change
            # leaves the target's package valid)
            parts = {"target": target}
            drafting = {"target": target, "drafter": drafter,
                        **({"draft_head": self.draft_head} if self.draft_ids is not None else {})}
            settings = {"page_size": self.page_size, "feature_layers": self.feature_layers,
                        "cpu_kernel": self.cpu_kernel, "dtype": str(self.dtype),
                        "kv_dtype": str(kv_dtype)}
            cache = (None, "rows", None, None)
            kept = (("rows", None),) if self.features is not None else ()
            self._fns[True] = (
                AOTGraphs("target", self._target_step, parts, (("B", "T"), ("B", "T"), ("B", "P"), ("B",),
                          ("B", "T", "T"), ("S",), ("R",), ("B", "T"), cache, cache, *kept), settings),
                AOTGraphs("drafter", self._draft_step, drafting, (("B", "K"), ("B", "K"), ("B", "C", None), ("B", "C"),
                          ("B", "P"), ("B",), ("B",), ("B",), ("S",), ("B", "C"), cache, cache), settings,
                          mins={"K": 3})
                if drafter is not None else None)
        elif self.compiled:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
            self._fns[True] = (torch.compile(self._target_step, dynamic=False, fullgraph=True),
                               torch.compile(self._draft_step, dynamic=False, fullgraph=True))

    def built_graphs(self) -> list[tuple[str, dict[str, int]]]:
        """The AOT packages this runner holds now: (model, the sizes static in that bucket) each,
        e.g. ("target", {"B": 1, "T": 1}); none when eager or on CUDA."""
        if not self.aot:
            return []
        return [(g.name, dict(bucket)) for g in self._fns[True] if g is not None for bucket in g.packages]

    def use_compiled(self, on: bool) -> None:
        """Switch a compiled runner between its compiled and eager forwards (bench compares them)."""
        if on not in self._fns:
            raise UserError("this model runner was built without compile: load with compile=True")
        self.compiled = on

    def _inputs(self, *specs) -> tuple:
        """specs: (tensor, *dims). The tensors, with those dims marked dynamic while a compiled
        graph may still be traced (marking costs ~8 us a tensor: skipped when eager or warm)."""
        if self.compiled and not self.aot and not self.warm:
            return tuple(_dynamic(t, *dims) for t, *dims in specs)
        return tuple(spec[0] for spec in specs)

    # ------------------------------------------------------------------ the forwards
    def _target_step(self, tokens, positions, table, lengths, vis, cols, nodes, rows, k_cache, v_cache, features=None):
        # tokens, positions [B, T]; table [B, pages]; lengths [B]; vis [B, T, T]; cols [S]; nodes [R] flat b*T+t;
        # rows [B, T] the new tokens' physical rows; k_cache, v_cache [L, num_rows, Hkv, D]; features [num_rows, F]
        hidden, feats, k, v = self.target.forward_cached(tokens, positions, k_cache, v_cache, table,
                                                         self.page_size, lengths, vis, cols, self.feature_layers)
        write_rows(k_cache, v_cache, rows, k, v)  # after every read of the cache (program order)
        if features is not None:
            write_features(features, rows, feats)
        return self.target.logits(hidden.flatten(0, 1).index_select(0, nodes))     # [R, V]

    def _draft_step(self, block, block_pos, ctx, ctx_pos, table, past_len, ctx_len, block_len, cols, rows, k_cache,
                    v_cache):
        # block, block_pos [B, K]; ctx [B, C, F]; ctx_pos [B, C]; table [B, pages]; past_len, ctx_len,
        # block_len [B]; cols [S]; rows [B, C] the context rows' physical rows (their K/V written there)
        embeds = self.target.model.embed_tokens(block).to(self.kv_dtype)  # the drafter's dtype
        hidden, k, v = self.drafter.forward_cached(embeds, block_pos, ctx, ctx_pos, k_cache, v_cache, table,
                                                   self.page_size, past_len, ctx_len, block_len, cols)
        write_rows(k_cache, v_cache, rows, k, v)
        # slot k > 0 drafts position start+k: one 2-D GEMM through the drafter's head (see draft_head)
        H = hidden.shape[-1]
        logits = self.draft_head(hidden[:, 1:].reshape(-1, H)).float()                 # [B*(K-1), Vd]
        return logits.log_softmax(-1).view(block.shape[0], block.shape[1] - 1, -1)

    # ------------------------------------------------------------------ what the engine calls
    def run_target(self, tokens: torch.Tensor, positions: torch.Tensor, slots: list[int], lengths: np.ndarray,
                   vis: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
        """One target forward over new tokens [B, T] of the sequences in cache `slots`: each sees
        its cached rows < lengths[b] (on the host: page rows and sizes come from them, and the
        device gets a copy — no read back) and the new tokens `vis` [B, T, T] allows; the new K/V (and
        the drafter features, where the runner keeps them: `features_of`) are written at rows
        lengths[b] + t. Returns the logits [R, V] of the flat indices `nodes`."""
        B, T = tokens.shape
        self.shapes["target", B, T] += 1
        R = nodes.shape[0]
        if B * T > 1 and R < 2:  # keep the dynamic row count off dynamo's 0/1 specialisation
            nodes = torch.cat([nodes, nodes[:1].expand(2 - R)])
        start = np.asarray(lengths, dtype=np.int64)
        lengths = torch.from_numpy(start).to(self.device)
        table, rows = self._table(slots, int(start.max())), self._rows(slots, start, T)
        if self.broadcaster is not None:  # tensor parallel: the other ranks run the same forward on their shards
            self._broadcast(self.broadcaster.target, tokens, positions, table, lengths, vis, rows)
        cols = self._cols(_at_least_2(int(start.max())))
        return self.execute_target(tokens, positions, table, lengths, vis, rows, nodes, cols)[:R]

    def execute_target(self, tokens, positions, table, lengths, vis, rows, nodes=None, cols=None):
        """The target forward on physical pages `table` [B, pages], writing the new K/V at physical
        `rows` [B, T]; logits of the flat indices `nodes` (None: a rank > 0, which needs none);
        cols = arange(max(2, max length)) (None: derived from lengths)."""
        if nodes is None:
            nodes = torch.zeros(2, dtype=torch.long, device=self.device)
        if cols is None:
            cols = torch.arange(_at_least_2(int(lengths.max())), device=self.device)
        args = self._inputs((tokens, 0, 1), (positions, 0, 1), (table, 0, 1), (lengths, 0),
                            (vis, 0, 1, 2), (cols, 0), (nodes, 0), (rows, 0, 1))
        kept = (self.features.data,) if self.features is not None else ()
        return self._forward(0, *args, self.cache.k, self.cache.v, *kept)

    def run_drafter(self, block: torch.Tensor, block_pos: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
                    slots: list[int], past_len: np.ndarray, ctx_len: torch.Tensor, block_len: torch.Tensor
                    ) -> torch.Tensor:
        """One drafter pass: blocks [B, K] see cached context rows < past_len[b], the fresh context
        features ctx [B, C, F] (rows < ctx_len[b]; their K/V are written at past_len[b] + c) and
        their own first block_len[b] tokens. Returns draft log-probs [B, K-1, Vd] (float32) over the
        draft vocabulary (`draft_ids` maps its indices to token ids; None: Vd = V, the identity)."""
        B, C = ctx.shape[:2]
        self.shapes["drafter", B, block.shape[1]] += 1
        if C < 2:  # pad the context to >= 2 rows (masked out by ctx_len)
            ctx = torch.cat([ctx, ctx.new_zeros(B, 2 - C, ctx.shape[2])], 1)
            ctx_pos = torch.cat([ctx_pos, ctx_pos[:, -1:].expand(B, 2 - C) if C else ctx_pos.new_zeros(B, 2)], 1)
        start = np.asarray(past_len, dtype=np.int64)  # [B] on the host, as run_target's lengths
        past_len = torch.from_numpy(start).to(self.device)
        S = _at_least_2(int(start.max()))
        cols = self._cols(S)
        args = self._inputs((block, 0, 1), (block_pos, 0, 1), (ctx, 0, 1), (ctx_pos, 0, 1),
                            (self._table(slots, S), 0, 1), (past_len, 0), (ctx_len, 0), (block_len, 0), (cols, 0),
                            (self._rows(slots, start, ctx.shape[1]), 0, 1))
        return self._forward(1, *args, self.draft_cache.k, self.draft_cache.v)

    def _forward(self, which: int, *args) -> torch.Tensor:
        """The target's (0) or the drafter's (1) forward in the runner's mode. While a helper
        compiles deferred graphs, a bucket whose package is not on disk yet runs eager (the
        package loads at the first call after the helper wrote it); once the helper has exited,
        a package it left unwritten compiles at its first call, as any graph not warmed up."""
        fn, helper = self._fns[self.compiled][which], self.deferred  # (close() may end it from another thread)
        if helper is not None and helper.done():  # (a poll: microseconds, only while deferred)
            self._end_deferral()
            helper = None
            log.info("the background compile helper has finished: batches run compiled from now on")
        if helper is None:
            return fn(*args)
        try:
            return fn(*args)
        except NotCached:
            return self._fns[False][which](*args)

    def compiling(self) -> bool:
        """Whether a helper is still compiling deferred graphs (safe to ask from another thread)."""
        helper = self.deferred
        return helper is not None and not helper.done()

    def defer(self, helper) -> None:
        """Run the buckets `helper` (compile_helper.Helper) compiles eager until it writes them:
        meanwhile a call of a bucket not on disk raises NotCached inside, answered eager."""
        self.deferred = helper
        for g in self._fns[True]:
            if g is not None:
                g.compile_missing = False

    def _end_deferral(self) -> None:
        self.deferred = None
        for g in self._fns[True]:
            if g is not None:
                g.compile_missing = True

    def stop_deferred(self) -> None:
        """End a deferral now, stopping its helper (the process is closing)."""
        if self.deferred is not None:
            self.deferred.stop()
            self._end_deferral()

    def features_of(self, slots: list[int], start: np.ndarray, n: int) -> torch.Tensor:
        """The kept drafter features of logical rows start[b] .. start[b]+n-1 of cache `slots` [B]:
        [B, n, F] (a row past a slot's pages reads the null page: callers mask it)."""
        return self.features.read(self._rows(slots, start, n))

    def write_drafter_context(self, slots: np.ndarray, positions: np.ndarray) -> None:
        """Write context rows of many sequences to the drafter cache as one flat batch (eager):
        the kept features of logical rows positions [N] of cache slots [N]. A later `run_drafter`
        then sees them as cached rows (its past_len past them)."""
        N = positions.shape[0]
        self.shapes["drafter_context", 1, N] += 1
        rows = self._rows(slots, positions, 1).view(1, N)                            # physical, [1, N]
        pos = torch.from_numpy(positions).to(self.device)[None]                      # [1, N]
        k, v = self.drafter.context_kv(self.features.read(rows), pos)                # [L, 1, N, Hkv, D]
        self.draft_cache.write(rows, k, v)

    def _cols(self, n: int) -> torch.Tensor:
        """arange(n) on the device, n <= the cache's rows (a view of one kept buffer: an arange per
        forward costs more)."""
        return self._arange[:n]

    def _table(self, slots: list[int], rows: int) -> torch.Tensor:
        """The page table of `slots` covering logical rows < rows: [B, >= 2] (null page past theirs)."""
        n = _at_least_2(self.blocks.pages_for(rows))
        return torch.from_numpy(self.blocks.table[slots, :n]).to(self.device)

    def _rows(self, slots: list[int], start: np.ndarray, n: int) -> torch.Tensor:
        """Physical rows [B, n] of logical rows start[b] .. start[b]+n-1 (past a slot's pages: the null page)."""
        logical = start[:, None] + np.arange(n)
        return torch.from_numpy(self.blocks.rows(slots, logical)).to(self.device)

    def move(self, slots: list[int], src: list[int], dst: list[int]) -> None:
        """Copy logical rows src -> dst (same slot) in the target cache and the kept features: a
        round's accepted nodes to their final rows; entries with src == dst are skipped."""
        moves = [(s, a, b) for s, a, b in zip(slots, src, dst) if a != b]
        if not moves:
            return
        s, a, b = (np.array(x) for x in zip(*moves))
        rows = self.blocks.rows(s, np.stack([a, b], 1))                                   # [M, 2]
        idx = torch.from_numpy(rows).to(self.device)
        if self.broadcaster is not None:
            self._broadcast(self.broadcaster.move, idx[:, 0], idx[:, 1])
        self.move_rows(idx[:, 0], idx[:, 1])

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy physical rows src [M] -> dst [M] in the target cache and the kept features."""
        self.cache.move(src, dst)
        if self.features is not None:
            self.features.move(src, dst)

    def attach(self, broadcaster: Broadcaster) -> None:
        """Tensor parallel (rank 0): broadcast every target forward and KV move to the other ranks,
        starting with the cache layout they allocate."""
        self.broadcaster = broadcaster
        self._broadcast(broadcaster.init, self.num_pages, self.page_size)

    def heartbeat(self) -> None:
        """Tensor parallel: check every rank still answers (raises RankLost if not); else nothing."""
        if self.broadcaster is not None:
            self._broadcast(self.broadcaster.ping)

    @staticmethod
    def _broadcast(send: Callable[..., None], *args) -> None:
        """One broadcaster call; its failure is RankLost."""
        try:
            send(*args)
        except Exception as e:  # a peer's socket closed, or the collective timed out
            raise RankLost(f"a tensor-parallel rank stopped answering: {e}") from e

    # ------------------------------------------------------------------ compile up front
    def buckets(self, max_batch_size: int, max_tokens: int, block_size: int) -> list[tuple[str, int, int]]:
        """The graphs a run can need: (model, batch, tokens per sequence) — one per specialisation."""
        batches = [1] + ([min(3, max_batch_size)] if max_batch_size > 1 else [])
        tokens = [1] + ([max(max_tokens, 2)] if max_tokens > 1 else [])
        out = [("target", b, t) for b in batches for t in tokens]
        if self.drafter is not None:
            out += [("drafter", b, block_size) for b in batches]
        return out

    def uncached(self, buckets: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        """The buckets whose AOT packages are not on disk yet; the others are loaded now (as
        `warmup` would). Compiles nothing."""
        graphs = [g for g in self._fns[True] if g is not None] if self.aot else []
        if not graphs:
            return []
        missing = []
        for g in graphs:
            g.compile_missing = False
        try:
            for bucket in buckets:
                try:
                    self.warmup([bucket])
                except NotCached:
                    missing.append(bucket)
        finally:
            for g in graphs:
                g.compile_missing = self.deferred is None
        return missing

    @torch.inference_mode()
    def warmup(self, buckets: list[tuple[str, int, int]], progress: bool = False) -> float:
        """Run every bucket once through `run_target` / `run_drafter` on dummy inputs (compiling
        it when compiled). Call it while every slot is free: it writes rows past a 5-token dummy
        context of slots 0..B-1, which no sequence sees. Returns the seconds it took. `progress`:
        a bar on a terminal, else a line on stderr for each graph that compiled (what, how many,
        how long) — a first load compiles for minutes and says so."""
        t0 = time.perf_counter()
        bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm
            bar = tqdm(total=len(buckets), desc="compiling", unit="graph")
        dev = self.device
        for i, (model, B, T) in enumerate(buckets):
            what = f"{model} graph, batch {'1' if B == 1 else '>1'} x {'1' if T == 1 else '>1'} tokens"
            if bar is not None:
                bar.set_description(f"compiling {what}")
            t1 = time.perf_counter()
            lengths = np.full(B, 5)
            pos = (5 + torch.arange(T, device=dev)).expand(B, T).contiguous()
            ids = torch.zeros(B, T, dtype=torch.long, device=dev)
            if model == "target":
                vis = torch.ones(T, T, dtype=torch.bool, device=dev).tril().expand(B, T, T).contiguous()
                self.run_target(ids, pos, list(range(B)), lengths, vis, torch.arange(B * T, device=dev))
            else:
                C = 3
                ctx = torch.zeros(B, C, self.drafter.fc.in_features, dtype=self.kv_dtype, device=dev)
                ctx_pos = (5 + torch.arange(C, device=dev)).expand(B, C).contiguous()
                self.run_drafter(ids, pos, ctx, ctx_pos, list(range(B)), lengths,
                                 torch.full((B,), C, device=dev), torch.full((B,), T, device=dev))
            if bar is not None:
                bar.update()
            elif progress and time.perf_counter() - t1 > SLOW_GRAPH_S:
                print(f"compiled the {what} ({i + 1}/{len(buckets)}) in {time.perf_counter() - t1:.0f} s, "
                      f"{time.perf_counter() - t0:.0f} s so far (first load only: cached in {aot_graphs.cache_dir()})",
                      file=sys.stderr, flush=True)
        if bar is not None:
            bar.close()
        self.warm = self.compiled
        return time.perf_counter() - t0
