"""The engine: continuous batching of requests through draft -> tree -> verify -> commit rounds.

Each `step()` asks the scheduler what runs (`scheduler.py`: admission against free KV pages,
chunked prefill, preemption), prefills those prompt chunks (a finished prefill samples the first
token), then runs one round for every running sequence in a single target forward: each
sequence's method (`speculative/`, one `Proposer` per method) proposes a draft tree — plain decoding the root alone — the trees are
packed into one forward, verified with one rule, the KV cache is compacted to the accepted path,
the method is told what was committed (`on_commit`), full pages are named for the prefix cache and
stops are applied. The engine knows no method by name. Tokenisation and HTTP live elsewhere.
"""
from __future__ import annotations

import logging
import random
import time
from collections import deque

import numpy as np
import torch

from .. import cpu
from ..errors import EngineFailure, QueueFullError, RequestError, UserError
from ..grammar import Grammars
from ..models.drafter import DFlashDrafter
from ..models.target import TargetModel
from ..sampling import Uniforms
from ..sampling_params import SamplingParams
from ..speculative.adaptive import AdaptiveBudget, Choice
from ..speculative.constrained import force_all, prune_all
from ..speculative.dflash import DFlashDrafts
from ..speculative.limits import RequestLimits
from ..speculative.proposer import (
    METHODS,
    OPTION_MEANING,
    Proposer,
    ProposerContext,
    check_method,
    default_method,
    proposer_class,
    refuse_options,
)
from ..speculative.tree import DraftTree, root_only
from . import compile_helper
from .block_manager import BlockManager
from .cost_seeding import CostSeeder
from .engine_config import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    EngineConfig,
    available_memory,
    kv_bytes_per_token,
    kv_cache_plan,
)
from .model_runner import ModelRunner, RankLost
from .prefill_pacing import PrefillPacer, break_even_context
from .round import (
    EngineStats,
    PhaseClock,
    RoundOutput,
    RoundRecord,
    RoundTimes,
    StepEvent,
    Verifier,
    VerifyInput,
    beyond_blocks,
    pack_prefill,
    pack_trees,
    verify_round,
)
from .sampler import Sampler
from .scheduler import Schedule, Scheduler
from .sequence import Sequence, check_request

log = logging.getLogger("flashtree.engine")

class Engine:
    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, config: EngineConfig,
                 eos_token_ids: list[int] = (), decode=None, grammars: Grammars | None = None):
        self.target, self.drafter, self.config = target, drafter, config
        self.eos_token_ids = list(eos_token_ids)
        self.decode = decode  # ids -> text, needed for stop strings
        self.grammars = grammars  # compiles params.structured (None: no tokenizer to compile against)
        tc = target.config
        p = next(target.parameters())
        # activations; the KV cache, the drafter and its features in kv_dtype (the same but for a
        # blocks target computing in float32 beside bf16 storage: loader.resolve_dtypes)
        self.device, self.dtype, self.kv_dtype = p.device, target.compute_dtype, target.kv_dtype
        self.max_model_len = config.max_model_len or tc.max_position_embeddings
        if self.max_model_len < 2:
            raise UserError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if drafter is not None:
            dc = drafter.config
            dc.check_pair(tc)
            self.feature_layers = list(dc.target_layer_ids)  # the target features the drafter reads
            self.drafter_block_size = dc.block_size
        else:
            self.feature_layers, self.drafter_block_size = None, 0
        self.method = config.method or default_method(drafter is not None)  # a request's when it names none
        method = check_method(self.method, drafter is not None)
        refuse_options(self.method, budget=config.budget, topk=config.topk)
        self.limits = RequestLimits.build(
            drafter_block_size=self.drafter_block_size, block_size=config.block_size, max_budget=config.max_budget,
            auto_budget=min(config.auto_max_budget, config.max_budget),  # an auto tree's most nodes
            budget=config.budget if config.budget is not None else DEFAULT_BUDGET, topk=config.topk,
            check_default_budget=method.sized_by_budget or config.budget is not None,
            max_ngram=config.max_ngram, min_ngram=config.min_ngram, draft_len=config.draft_len)
        row = kv_bytes_per_token(self.kv_dtype.itemsize, tc.num_hidden_layers, tc.num_key_value_heads, tc.head_dim, *(
            (dc.layers.num_hidden_layers, dc.layers.num_key_value_heads, dc.layers.head_dim,
             len(dc.target_layer_ids) * tc.hidden_size) if drafter is not None else ()))
        self.capacity, kv_tokens = kv_cache_plan(config, self.max_model_len, self.drafter_block_size, row,
                                                 available_memory(self.device))
        P = config.page_size
        if kv_tokens < self.capacity:
            raise UserError(f"kv_cache_tokens={kv_tokens} cannot hold one sequence at the context limit: "
                            f"max_model_len {self.max_model_len} + {self.capacity - self.max_model_len} rows for "
                            f"one round's draft tree = {self.capacity} tokens; raise kv_cache_tokens or lower "
                            f"max_model_len")
        # pages (plus the null page); a slot's table is wide enough for a batch padded past its end
        self.blocks = BlockManager(-(-kv_tokens // P) + 1, P, config.max_batch_size, -(-2 * self.capacity // P) + 1,
                                   config.enable_prefix_caching)
        # compute threads: config.threads at most, following the cores other processes leave free
        follow = self.device.type == "cpu" and cpu.thread_policy() == "follow"
        self.threads = cpu.ThreadGovernor.for_this_machine(config.threads or cpu.threads(), torch.set_num_threads,
                                                           follow)
        self.runner = ModelRunner(target, drafter, self.blocks, self.feature_layers, config.compile)
        self.scheduler = Scheduler(self.blocks, config.max_batch_size,
                                   config.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                   match_drafted=drafter is not None)
        self.pacer = PrefillPacer(break_even_context(tc.hidden_size, tc.intermediate_size, tc.num_attention_heads,
                                                     tc.num_key_value_heads, tc.head_dim),
                                  config.prefill_stall) if config.prefill_stall is not None else None
        self.adaptive = AdaptiveBudget()  # budget="auto": calibration per sequence, measured costs
        # the drafter pass, shared by the drafter-based methods (speculative/dflash.py)
        self.drafts = DFlashDrafts(self.runner, drafter.config.mask_token_id,
                                   self.device) if drafter is not None else None
        # one proposer per method this pair can run (a drafter-based one only with a drafter)
        given = ProposerContext(self.limits, self.adaptive, self.drafts)
        self.proposers: dict[str, Proposer] = {
            m: proposer_class(m)(given) for m in METHODS if drafter is not None or not proposer_class(m).needs_drafter}
        self._next_id = 0
        self.sampler = Sampler(self.device)
        self.verifier: Verifier = verify_round  # the round's verify (a test's wrong one must be caught)
        self.clock = PhaseClock()        # seconds per phase: the latest step's, and summed
        self.round_log: list[RoundRecord] | None = None  # set to [] to record every round (trace)
        self.stats = EngineStats()
        self.consecutive_failures = 0  # sequences failed since the last commit
        self.seeder = CostSeeder(self)  # times forwards for auto's costs once one is used
        self.batch_graphs_built = True  # False: a batch's compiled graphs are built when a batch first runs

    def warmup(self, progress: bool = False, batched: bool = True, helper=None, background=None) -> None:
        """Compile the runner's graphs now (no-op when eager), for this engine's shapes: all of them,
        or (batched=False) the ones a single sequence runs; a graph not compiled here compiles the
        first time a step needs it. `helper` (compile_helper.start): the graphs found on disk load
        now, and a helper process compiles about half of the others (compile_helper.split)
        meanwhile; they load from the cache after. `background` (a starter too, batched=False):
        the batch graphs not on disk compile in a helper started now, and batches run eager until
        it has written them (ModelRunner.defer); with no helper to start they compile now."""
        self.batch_graphs_built = compile_helper.warm(self.runner, self.limits, self.config, progress, batched,
                                                      helper, background)

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    # ---------------------------------------------------------------- requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams, method: str | None = None,
                    budget: int | str | None = None, block_size: int | None = None,
                    topk: int | None = None, **options) -> Sequence:
        """options: method-specific settings (e.g. ngram's max_ngram, min_ngram, draft_len)."""
        method = method or self.method
        check_method(method, self.drafter is not None)
        unknown = sorted(set(options) - set(OPTION_MEANING))
        if unknown:
            raise RequestError(f"unknown speculative option(s) {', '.join(unknown)}", "speculative")
        refuse_options(method, budget=budget, topk=topk, block_size=block_size, **options)
        check_request(prompt_ids, params, self.target.config.vocab_size, self.max_model_len)
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFullError(f"the request queue is full ({self.config.max_queue} waiting)")
        shape = self.proposers[method].configure(block_size, budget, topk, options)
        uniforms = None
        if not params.greedy:
            uniforms = Uniforms(params.seed if params.seed is not None else random.getrandbits(63), self.device)
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids.update(self.eos_token_ids)
        if params.stop and self.decode is None:
            raise RequestError("stop strings need a tokenizer", "stop")
        if params.structured is not None and self.grammars is None:
            raise RequestError("structured output needs the model's tokenizer", params.structured.kind)
        grammar = None if params.structured is None else self.grammars.start(params.structured,
                                                                              self.config.grammar_drafts)
        seq = Sequence(req_id=self._next_id, prompt_ids=list(prompt_ids), params=params, method=method,
                       uniforms=uniforms, stop_ids=frozenset(stop_ids), block_size=shape.block_size,
                       budget=shape.budget, topk=shape.topk, auto=shape.auto, options=dict(shape.options))
        seq.metrics.prompt_tokens = len(prompt_ids)
        seq.logprobs, seq.grammar = None if params.logprobs is None else [], grammar
        seq.prompt_logprobs = None if params.prompt_logprobs is None else [None]  # the first token has none
        self._next_id += 1
        self.waiting.append(seq)
        return seq

    @property
    def timings(self) -> RoundTimes:
        """Seconds per phase, summed over every step (`clear()` restarts them)."""
        return self.clock.total

    @property
    def round_times(self) -> RoundTimes:
        """Seconds per phase in the latest step."""
        return self.clock.step

    def abort(self, seq: Sequence) -> None:
        """Stop a request now (client gone); its cache slot is freed at once."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if not seq.finished:
            seq.finish_reason = "abort"
        if seq in self.running:
            self._release(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def limit_batch(self, n: int) -> None:
        """Run at most n sequences per step from now on (1 <= n <= the max_batch_size the engine
        was built for: its cache slots). `bench` measures each concurrency this way."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.blocks.num_slots:
            raise UserError(f"batch limit must be an integer in [1, {self.blocks.num_slots}] (the engine's "
                            f"max_batch_size), got {n!r}")
        self.scheduler.max_batch_size = n

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (its pages become free), e.g. so a benchmark's passes all start
        cold. Only while no request holds pages: False, and nothing changed, otherwise."""
        return self.blocks.reset_prefix_cache()

    # ---------------------------------------------------------------- the round
    @torch.inference_mode()
    def step(self) -> list[StepEvent]:
        """Admit and prefill newcomers, then one draft -> tree -> verify -> commit round.

        A failure while preparing, prefilling or sampling fails only the sequences it belongs to
        (finish_reason "error"); an `EngineFailure` means the engine itself is broken."""
        self.clock.new_step()
        self.threads()  # as many as the cores free now
        plan = self._schedule()                        # admissions, prefill chunks, preemptions
        if plan.prefills:
            self._prefill_chunks(plan.prefills)         # prompt rows -> cache; a finished prompt's first token
        batch = self.scheduler.decoding()
        if batch:
            depths = self._depths(batch)                # auto's verdict: each sequence drafts, or steps plainly
            rounds = self._isolated(self._round, batch, depths)   # propose -> pack -> run -> verify
            for part, out in rounds:
                with self.clock("commit"):
                    self._commit(part, out)             # accepted paths -> cache rows, tokens, stops
            self._observe(batch, rounds, prefilled=bool(plan.prefills))
        events, finished = self.scheduler.postprocess()
        for s in finished:
            self._release(s)
        return events

    def _schedule(self) -> Schedule:
        """The scheduler's plan for this step (what the pacer lets a prefill cost the streams
        decoding); preempted sequences forgotten by their method and auto; auto's cost seeding
        given its turn — on an idle engine before admitting (with one slot none is free after)."""
        decoding = any(s.decoding and not s.finished for s in self.running)
        if not self.running:
            self.seeder.turn(self.running, self.waiting, prefilling=False)
        plan = self.scheduler.schedule(self.pacer.fits(decoding) if self.pacer is not None else None)
        self.stats.prefix_hit_tokens += plan.prefix_hit_tokens
        self.stats.preemptions += len(plan.preempted)
        for s in plan.preempted:  # recomputed from its tokens when readmitted
            self.proposers[s.method].release(s)
            self.adaptive.release(s)
        self.seeder.turn(self.running, self.waiting, prefilling=bool(plan.prefills))
        return plan

    def _prefill_chunks(self, seqs: list[Sequence]) -> None:
        """This step's prompt chunks in one forward (per sequence if it fails), then committed."""
        with self.clock("prefill"):
            for part, done in self._isolated(self._prefill, seqs):
                self._commit_prefill(part, done)
        if self.pacer is not None:
            self.pacer.observe_prefill(seqs, self.clock.step.prefill)

    def _observe(self, batch: list[Sequence], rounds: list[tuple[list[Sequence], RoundOutput]],
                 prefilled: bool) -> None:
        """A round run whole is its shape's measurement: auto's cost table learns its phase times
        and wall time (the step's, less seeding and prefill), the pacer a stream's undisturbed
        round. A round rerun per sequence (see _isolated) measures nothing."""
        if len(rounds) != 1 or len(rounds[0][0]) != len(batch):
            return
        out, times = rounds[0][1], self.clock.step
        spent = self.clock.elapsed() - times.seed_costs - times.prefill
        if self.pacer is not None and not prefilled:
            self.pacer.observe_round(spent)
        self.adaptive.costs.observe(len(batch), out.vin.tokens.shape[1], out.passed, times, spent, out.caught_up)

    def _round(self, batch: list[Sequence], depths: list[int]) -> RoundOutput:
        """Everything of a round before the commit, each sequence drafting to its depth (0: a plain
        step); touches no sequence state, so it can be rerun."""
        clock = self.clock
        with clock("draft"):
            drafts = self._draft(batch, depths)
        with clock("tree"):
            trees = self._trees(batch, drafts, depths)
        with clock("grammar"):  # drafts a grammar forbids go before auto's cut
            trees = prune_all(batch, trees, self.config.grammar_drafts)
        drafted = sum(d is not None for d in drafts)
        # an n-gram chain is no drafter pass: counted as one, its microseconds became the pass's cost
        passed = sum(d is not None and self.proposers[s.method].needs_drafter for s, d in zip(batch, drafts))
        fed = self.drafts.fed if self.drafts is not None else {}  # (this round's pass only: a commit pops them)
        caught_up = beyond_blocks(batch, lambda s: fed.get(s, 0))
        with clock("budget"):  # auto: each tree cut to the round's chosen size
            trees, choices = self.adaptive.fit(batch, trees, passed, caught_up, self._held())
        if self.config.grammar_drafts:
            with clock("grammar"):  # a grammar's forced tokens: free nodes
                trees = force_all(batch, trees, [s.round_rows for s in batch],
                                  [s.room(self.max_model_len) for s in batch])
        for s, t in zip(batch, trees):  # the scheduler reserved pages for this many rows past s.length
            if t.size > s.round_rows:
                raise RuntimeError(f"request {s.req_id}: a {t.size}-node tree exceeds the {s.round_rows} "
                                   f"cache rows reserved for its round")
        with clock("pack"):
            vin = pack_trees(trees, [s.length for s in batch], self.device)
        with clock("verify_forward"):
            logits = self._forward(batch, vin)
        with clock("verify_walk"):
            vout = self.verifier(batch, vin, logits, self.sampler.draws)
            lps = self.sampler.path_logprobs(batch, trees, vin, vout, logits) \
                if any(s.logprobs is not None for s in batch) else None
        return RoundOutput(trees, vin, vout, choices, drafted, passed, caught_up, lps)

    def _depths(self, batch: list[Sequence]) -> list[int]:
        """Each sequence's draft depth this round: its limit, or 0 where auto's verdict says plain
        steps pay. The verdict only sizes drafts, and any depth decodes exactly, so a verdict that
        raises is logged and the limits stand: no request fails for it."""
        limits = [s.depth_limit(self.max_model_len) for s in batch]
        try:
            drafting = [s for s, d in zip(batch, limits) if s.auto and d > 0]
            return self.adaptive.depths(batch, limits, self._catch_up_rows(drafting), self._held())
        except RankLost as e:
            raise EngineFailure(str(e)) from e
        except Exception:
            log.exception("budget auto's plain-or-draft verdict failed; this round drafts to each limit")
            return limits

    def _held(self) -> int:
        """The batch the engine has work for: its sequences, prefilling and waiting ones included,
        up to its batch limit (auto's regime; see speculative.adaptive.regime)."""
        return min(len(self.running) + len(self.waiting), self.scheduler.max_batch_size)

    def _catch_up_rows(self, seqs: list[Sequence]) -> int:
        """Context rows a drafter pass for `seqs` would catch up on (see `beyond_blocks`)."""
        return 0 if self.drafts is None else beyond_blocks(seqs, self.drafts.pending_rows)

    def _isolated(self, fn, seqs: list[Sequence], *per_seq: list) -> list[tuple[list[Sequence], object]]:
        """fn(seqs, *per_seq), or, if that raises, fn([s], *its own items of per_seq) for each s
        alone: a sequence that fails alone is finished with "error" and the others go on. Returns
        [(the seqs, fn's result)]."""
        try:
            return [(seqs, fn(seqs, *per_seq))]
        except RankLost as e:  # not a request's fault: the engine cannot go on
            raise EngineFailure(str(e)) from e
        except Exception as e:
            if len(seqs) == 1:
                self._fail(seqs[0], e)
                return []
        out = []
        for b, s in enumerate(seqs):
            try:
                out.append(([s], fn([s], *([col[b]] for col in per_seq))))
            except RankLost as e:
                raise EngineFailure(str(e)) from e
            except Exception as e:
                self._fail(s, e)
        return out

    def _fail(self, s: Sequence, e: BaseException | str) -> None:
        """Finish one sequence with "error"; too many in a row without a commit = a broken engine."""
        s.error = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
        s.finish_reason = "error"
        log.error("request %d failed: %s", s.req_id, s.error)
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.config.max_consecutive_failures:
            raise EngineFailure(f"{self.consecutive_failures} requests failed in a row; last: {s.error}")

    def _drew_token(self, s: Sequence, tok: int) -> bool:
        """False (and s failed) when tok is the sampler's "no valid token" sentinel (V)."""
        if 0 <= tok < self.target.config.vocab_size:
            return True
        self._fail(s, "the sampling distribution had no valid token (NaN or zero mass)")
        return False

    def _prefill(self, seqs: list[Sequence]) -> list[tuple[tuple[int, list | None] | None, list | None]]:
        """The next `chunk` tokens of each sequence's `cache_ids`, after its `prefilled` ones, in one
        forward; a sequence whose prefill completes draws its first token (unless it is a preempted
        one coming back: its last token is already drawn). Returns per sequence its drawn token (and
        its logprobs where asked) or None, and where it asks for prompt logprobs those of its
        chunk's prompt tokens (the row before each). Touches no sequence state (the forward's K/V
        rows are the same on a rerun), so it can be rerun per sequence (see _isolated)."""
        chunks = [s.cache_ids[s.prefilled:s.prefilled + s.chunk] for s in seqs]
        ids, pos, start, vis, last = pack_prefill(chunks, [s.prefilled for s in seqs], self.device)
        T, whole = ids.shape[1], [s.wants_prompt_rows for s in seqs]  # whole: every row's logits kept
        kept = [list(range(b * T, b * T + len(c))) if w else [b * T + len(c) - 1]
                for b, (c, w) in enumerate(zip(chunks, whole))]
        if any(whole):
            last = torch.tensor([i for k in kept for i in k], device=self.device)
        logits = self.runner.run_target(ids, pos, [s.slot for s in seqs], start, vis, last)
        ends = np.cumsum([len(k) for k in kept])
        lasts = logits[torch.as_tensor(ends - 1, device=logits.device)] if any(whole) else logits   # [B, V]
        fresh = [b for b, s in enumerate(seqs) if s.prefilled + s.chunk == len(s.cache_ids) and not s.output_ids]
        out: list[tuple[tuple[int, list | None] | None, list | None]] = [(None, None)] * len(seqs)
        for b, tok in zip(fresh, self.sampler.first([seqs[b] for b in fresh], lasts[fresh]) if fresh else []):
            asked = seqs[b].params.logprobs
            out[b] = (tok, None if asked is None else self.sampler.logprobs(lasts[b:b + 1], [tok], asked)), None
        for b, s in enumerate(seqs):  # row j (position prefilled + j) predicts prompt token prefilled + j + 1
            lo = max(len(s.prompt_logprobs or ()), s.prefilled + 1)  # its first prompt token without an entry
            hi = min(s.prefilled + s.chunk + 1, len(s.prompt_ids))
            if whole[b] and hi > lo:
                row = ends[b] - len(kept[b]) - s.prefilled - 1        # + token index = its row
                out[b] = out[b][0], self.sampler.logprobs(logits[row + lo:row + hi], s.prompt_ids[lo:hi],
                                                          s.params.prompt_logprobs)
        return out

    def _commit_prefill(self, seqs: list[Sequence], done: list[tuple[tuple[int, list | None] | None, list | None]]
                        ) -> None:
        """Advance each prefilled sequence past its chunk, name its full pages, write its drafter
        context and emit its first token. Each sequence stands alone: one that fails here is
        finished with "error" while the forward stands for the others (rerunning it would
        prefill them twice)."""
        kept = []
        for s in seqs:
            try:
                s.prefilled += s.chunk
                s.length, s.decoding = s.prefilled, s.prefilled == len(s.cache_ids)
                self.proposers[s.method].on_prefill(s, s.chunk)
                self.blocks.commit(s.slot, s.cache_ids, s.length)  # name its full pages (prefix cache)
                kept.append(s)
            except Exception as e:
                self._fail(s, e)
        if self.drafts is not None:  # the drafter's rows of this chunk [length - chunk, length)
            writes = [s for s in kept if self._keeps_drafter_context(s)]
            self._isolated(self._write_drafter_context, writes, [(s.length - s.chunk, s.length) for s in writes])
        for s, (first, prompt) in zip(seqs, done):
            if prompt is not None:
                s.prompt_logprobs.extend(prompt)
            if first is None or s.finished or not self._drew_token(s, first[0]):
                continue
            s.metrics.ttft_s = time.perf_counter() - s.t_start
            try:
                self._emit(s, [first[0]], first[1])
            except Exception as e:
                self._fail(s, e)

    def _keeps_drafter_context(self, s: Sequence) -> bool:
        """Whether s's rows go to the drafter cache as they are prefilled: a drafter sequence's
        always (its first pass reads them), any other's for the prefix cache's sake."""
        return self.drafts.cached_rows(s) is not None or self.blocks.prefix_caching

    def _write_drafter_context(self, seqs: list[Sequence], spans: list[tuple[int, int]]) -> None:
        """Write the drafter's context rows [lo, hi) of each sequence (`spans`) now, in one flat
        call, whatever the sequence's method: its pages then serve drafter-based requests from the
        prefix cache (a hit pays for every method), and a drafter pass has no prompt to catch up
        on. Rows [0, lo) are written already (an earlier chunk, or adopted drafted pages). A row
        costs the drafter's fc and K/V projections: ~1 % of the target's for the same row."""
        spans = [(s, lo, hi) for s, (lo, hi) in zip(seqs, spans) if hi > lo]
        if not spans:
            return
        self.runner.write_drafter_context(np.repeat([s.slot for s, _, _ in spans], [hi - lo for _, lo, hi in spans]),
                                          np.concatenate([np.arange(lo, hi) for _, lo, hi in spans]))
        for s, _, hi in spans:
            self.drafts.written(s, hi)
            self.blocks.drafted(s.slot, hi)

    def _draft(self, batch: list[Sequence], depths: list[int]) -> list:
        """Each method drafts its sequences that may still draft (depth >= 1) in one call."""
        drafts = [None] * len(batch)
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(batch):
            if depths[i] > 0:
                groups.setdefault(s.method, []).append(i)
        for method, idx in groups.items():
            self.proposers[method].prepare([batch[i] for i in idx])
        for method, idx in groups.items():
            out = self.proposers[method].draft([batch[i] for i in idx], [depths[i] for i in idx])
            for i, d in zip(idx, out):
                drafts[i] = d
        return drafts

    def _trees(self, batch: list[Sequence], drafts: list, depths: list[int]) -> list[DraftTree]:
        return [root_only(s.bonus) if d is None else self.proposers[s.method].tree(s, d, depths[b])
                for b, (s, d) in enumerate(zip(batch, drafts))]

    def _forward(self, batch: list[Sequence], vin: VerifyInput) -> torch.Tensor:
        logits = self.runner.run_target(vin.ids, vin.positions, [s.slot for s in batch], vin.lengths,
                                        vin.mask, vin.nodes)  # [R, V]: valid nodes only
        self.stats.forwards += 1
        self.stats.seqs_in_forwards += len(batch)
        return logits

    def _commit(self, batch, out: RoundOutput) -> None:
        """Commit the round: each sequence's accepted path (`_commit_path`), one verdict for auto's
        drafting, the accepted K/V rows moved onto their final positions, the pages settled. A
        sequence whose commit raises (its stop strings' decode, say) fails alone: its rows are
        neither moved nor named, and the others commit."""
        accepted, bonus = out.vout.accepted, out.vout.bonus.tolist()              # on the host already
        plain = accepted.shape[1] == 1  # roots only: every path is [0], its rows stay where they are
        moves: tuple[list, list, list] = ([], [], [])  # slots, from rows, to rows of accepted K/V
        probed = []                                    # auto sequences that drafted: (seq, tree, path, choice)
        committed = []
        for b, s in enumerate(batch):
            if not self._drew_token(s, bonus[b]):  # commit nothing
                continue
            path = [0] if plain else np.flatnonzero(accepted[b]).tolist()  # node order == depth order
            start, choice = s.length, out.choices[b]
            try:
                judged = self._commit_path(s, out.trees[b], path, bonus[b], choice, drafted=out.drafted > 0,
                                            logprobs=out.logprobs[b] if out.logprobs else None)
            except Exception as e:
                self._fail(s, e)
                continue
            self.consecutive_failures = 0
            committed.append(s)
            for j, i in enumerate(path[1:], 1):
                moves[0].append(s.slot), moves[1].append(start + i), moves[2].append(start + j)
            if judged:  # an auto sequence that drafted: the round's verdict covers it
                probed.append((s, out.trees[b], path, choice))
        self.adaptive.observe(probed)
        self.runner.move(*moves)
        self._settle_pages(committed, drafter_wrote=out.passed > 0)
        self.stats.rounds += 1

    def _commit_path(self, s: Sequence, tree: DraftTree, path: list[int], bonus: int, choice: Choice | None,
                     drafted: bool, logprobs: list | None = None) -> bool:
        """One sequence's accepted `path` (node indices, root first) and bonus token: its proposer
        told (when any sequence drafted), its metrics updated, its tokens emitted. True when it is
        an auto sequence that drafted (auto observes it with the round's others)."""
        if drafted:
            self.proposers[s.method].on_commit(s, tree, path)
        tau = len(path)
        s.length += tau
        s.metrics.rounds += 1
        s.metrics.accept_lengths.append(tau)
        self.stats.request_round(s.method, tau)
        if choice is not None:  # auto: what it chose and expected, for calibration checks
            s.metrics.budgets.append(choice.nodes)
            s.metrics.predicted_taus.append(choice.predicted_tau)
        if self.round_log is not None:
            # (its times: the step's, complete once the step is)
            self.round_log.append(RoundRecord(s.req_id, tree, path, bonus, choice and choice.predicted_tau,
                                              self.clock.step))
        self._emit(s, [tree.tokens[i] for i in path[1:]] + [bonus], logprobs)
        return choice is not None and choice.paths is not None

    def _settle_pages(self, batch: list[Sequence], drafter_wrote: bool) -> None:
        """After the commit: pages past what the next round reserves go back, full pages are named
        for the prefix cache, and pages whose drafter rows a pass wrote are marked drafted."""
        for s in batch:
            drafted = self.drafts.cached_rows(s) if drafter_wrote else None  # only a drafter pass writes them
            self.blocks.settle(s.slot, s.length, s.length + s.round_rows, lambda s=s: s.cache_ids, drafted)

    # ---------------------------------------------------------------- stops and retirement
    def _emit(self, s: Sequence, new: list[int], logprobs: list | None = None) -> None:
        self.stats.generated_tokens += s.append(new, self.max_model_len, self.decode, logprobs)

    def _release(self, s: Sequence) -> None:
        if self.drafts is not None and s.slot >= 0 and s.finish_reason != "error":
            # the pages it filled decoding (plainly, or past its last pass) serve drafters too
            lo, hi = self.blocks.undrafted_rows(s.slot)
            self._write_drafter_context([s], [(lo, min(hi, s.length))])
        self.scheduler.release(s)
        self.proposers[s.method].release(s)
        self.adaptive.release(s)
        s.metrics.elapsed_s = time.perf_counter() - s.t_start
