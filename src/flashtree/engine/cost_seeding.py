"""Seeding budget="auto"'s cost table with timed real forwards, a forward at a time.

Auto chooses a tree size from measured costs (`speculative/adaptive.py`'s `CostTable`): the
target forward at several batch sizes and widths, and the drafter pass. Before the first auto
sequence runs, `CostSeeder` times them on free cache slots over a short dummy context. While
other sequences decode it runs one forward per engine step, in steps that prefill nothing, so
no stream waits on the seeding longer than on a prefill chunk; on an idle engine it runs them
all at once. An auto sequence decides from what is measured so far meanwhile (unmeasured costs:
it trusts the drafter). Sequences, counters and the free-slot order are left as they were. A
measurement that fails ends the seeding, logged (rounds then measure the costs). It decides
nothing.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..sampling_params import SamplingParams
from ..speculative.costs import CostTable
from ..speculative.proposer import Proposer
from ..speculative.tree import chain_tree
from .model_runner import RankLost
from .round import pack_trees
from .sequence import Sequence

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("flashtree.engine")

SEED_TOKENS = (1, 2, 4, 8, 16, 32)  # verify-forward widths timed
REPEATS = 2                         # timed calls per measurement, after one untimed (warm, compile) call


@dataclass
class Probe:
    """One measurement: the target forward of `batch` sequences x `tokens` (kind "verify"), or the
    drafter pass and its trees for `batch` sequences (kind "draft")."""
    kind: str
    batch: int
    tokens: int = 0
    times: list[float] = field(default_factory=list)  # calls so far (the first untimed)


def seeding_plan(engine: Engine, free: int, tokens=SEED_TOKENS) -> list[Probe]:
    """Batch 1 and the engine's batch size (as slots allow) at the widths `tokens` (up to auto's
    widest round), then the drafter pass at both batch sizes where a drafter builds trees. Batch 1
    alone while the batch graphs are not compiled yet (`LLM(precompile="single")`): timing them
    would compile them in the first request (86 s of the first chat on 2 cores); a batch's costs are estimated from
    batch 1's at the same total tokens until its own rounds measure them."""
    batches = sorted({1, min(free, engine.config.max_batch_size)}) if engine.batch_graphs_built else [1]
    widest = min(max(tokens), engine.limits.auto_budget + 1, engine.max_model_len - 1)
    widths = sorted({t for t in tokens if t <= widest} | {widest})
    plan = [Probe("verify", B, T) for B in batches for T in widths]
    if tree_builder(engine) is not None:
        plan += [Probe("draft", B) for B in batches]
    return plan


def verify_call(engine: Engine, slots: list[int], tokens: int, context: int):
    """A call of the target forward a round verifying a chain of `tokens` tokens runs, on cache
    `slots` after `context` rows (the bench times the same call)."""
    vin = pack_trees([chain_tree(0, [0] * (tokens - 1)) for _ in slots], [context] * len(slots), engine.device)
    return lambda: engine.runner.run_target(vin.ids, vin.positions, slots, vin.lengths, vin.mask, vin.nodes)


def timed(call, device: torch.device) -> float:
    """Seconds of one call, its device work included (the seeding's and the bench's one timer)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def tree_builder(engine: Engine) -> Proposer | None:
    """The method whose drafter pass and trees the seeding times: the first that builds trees of
    a node budget from the drafter (auto's trees), where the engine has one."""
    return next((p for p in engine.proposers.values() if p.needs_drafter and p.sized_by_budget), None)


class CostSeeder:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.started = False                   # a sequence that uses the costs came in
        self.plan: deque[Probe] | None = None  # built at the first step (it sizes batches by free slots)

    @property
    def costs(self) -> CostTable:
        """The table it seeds: auto's."""
        return self.engine.adaptive.costs

    @property
    def done(self) -> bool:
        return self.plan is not None and not self.plan

    def uses_costs(self, s: Sequence) -> bool:
        """Whether s decides from auto's measured costs: budget="auto", or a method that sizes its
        drafts by them (ngram). Until they are measured, a wider forward is priced as that many
        one-token steps, so such a sequence would never draft."""
        return s.auto or self.engine.proposers[s.method].sized_by_costs

    def turn(self, running: list[Sequence], waiting, prefilling: bool) -> None:
        """The seeding's turn in an engine step. Once the first sequence that uses costs is in:
        time real forwards on free slots — all at once on an otherwise idle engine, else one
        forward a step in steps that prefill nothing, so the streams decoding never wait long on
        it. Also after fixed-budget rounds filled some of the table: a seed never replaces what a
        round measured, and the widths no round ran get one. A waiting sequence counts: an idle
        engine seeds before it admits one (`running`, `waiting`: the engine's sequences)."""
        if not self.started:
            # (the queue is read only while nothing runs: it may be long, and this runs every step)
            if not self.costs.learn or not any(self.uses_costs(s) for s in running or waiting):
                return
            self.started = True
        if self.done:
            return
        others_decoding = any(s.decoding and not self.uses_costs(s) for s in running)
        if prefilling and others_decoding:
            return
        with self.engine.clock("seed_costs"):
            self.step(not others_decoding)

    def step(self, all_at_once: bool) -> None:
        """One timed call of the next measurement (all of them with `all_at_once`)."""
        eng = self.engine
        if self.plan is None:
            self.plan = deque(seeding_plan(eng, eng.blocks.free_slots)) if eng.blocks.free_slots else None
        while self.plan:
            probe = self.plan[0]
            if probe.batch > eng.blocks.free_slots:  # slots went to requests: drop it (rounds measure that)
                self.plan.popleft()
                continue
            try:
                probe.times.append(self._call(probe))
                if len(probe.times) > REPEATS:
                    self._record(self.plan.popleft())
            except RankLost:
                raise
            except Exception:
                log.exception("timing forwards for budget auto's cost table failed; its costs come from rounds")
                self.plan.clear()
                return
            if not all_at_once:
                return

    def _record(self, probe: Probe) -> None:
        secs = statistics.median(probe.times[1:])  # (np.median's first call imports modules: 15 ms mid-stream)
        if probe.kind == "verify":
            self.costs.seed_verify(probe.batch, probe.tokens, secs)
        else:
            self.costs.seed_draft(probe.batch, secs)

    def _call(self, probe: Probe) -> float:
        """Seconds of one call of `probe` on `probe.batch` free slots (given back after)."""
        eng = self.engine
        slots = [eng.blocks.allocate() for _ in range(probe.batch)]
        ctx = max(1, min(16, eng.max_model_len - max(probe.tokens, 1)))  # a short dummy context
        seqs: list[Sequence] = []
        try:
            with torch.inference_mode():
                if probe.kind == "verify":
                    call = verify_call(eng, slots, probe.tokens, ctx)
                else:
                    builder = tree_builder(eng)
                    seqs = [Sequence(req_id=-1, prompt_ids=[0] * ctx, params=SamplingParams(max_tokens=2),
                                     method=builder.name, block_size=eng.limits.default_block_size, budget=eng.limits.auto_budget,
                                     uniforms=None, stop_ids=frozenset(), output_ids=[0], slot=slot, length=ctx)
                            for slot in slots]
                    for s in seqs:  # a few fresh context rows, within the dummy context
                        eng.drafts.on_prefill(s, min(3, ctx))
                    eng.drafts.read_to(seqs, [builder.ranks(s) for s in seqs])

                    def call():  # the drafter pass and the trees built from it, as a round does
                        out = eng.drafts.run(seqs)
                        for s in seqs:
                            builder.tree(s, out[s], s.block_size - 1)
                return timed(call, eng.device)
        finally:
            for s in seqs:
                eng.drafts.release(s)
            for slot in reversed(slots):  # the free list ends up in its original order
                eng.blocks.free(slot)
