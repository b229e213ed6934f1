"""Measurement for `flashtree bench`: timed passes over a prompt set, the peers' passes (`peers.py`:
transformers, llama.cpp) on the same weights, the speculative bound from measured component
costs (the table and the plots: `bench_report.py`).

One *pass* runs every prompt of the set through one configuration (method, budget) at one
temperature and concurrency. Passes of all configurations are interleaved slice by slice: a repeat
runs the prompt set in slices of a few prompts (`slices`), every configuration on a slice before
the next, each slice starting one configuration later (`pass_order`), so machine noise and the run
before hit them alike — this VM's speed shifts by 20-40 % for tens of seconds at a time, and
whole passes back to back paired configurations up to a minute apart. A configuration's pass is
its slices summed (`joined`); tok/s is the median over repeats after warm-up, and every speedup
is a ratio of two medians measured in this process (or, `paired`, the median of per-repeat
ratios; `pooled`, every slice's tokens and seconds summed, with a bootstrap interval over the
paired slices: `pooled_ratio`). The bound for a speculative configuration is

    bound = tau * c(1) / (c_draft + c(N))

with tau its measured mean accept length and the costs timed in isolation, apart from the rounds
(`component_costs`): c(n) one target forward of n tokens per sequence (logits included) against a
context of typical length, c_draft one drafter pass (draft logits and top-k included), N the
tree size (root + draft nodes). It is the speedup rounds would reach with nothing but those two
model calls, so `share` = measured speedup / bound = (1 + o_ar) / (1 + o_spec), where o is a
step's remaining time (tree building, packing, sampling, the walk, commit, prefill, Python)
relative to its isolated model costs: below 1 when a speculative round's overhead weighs more
than a plain step's, above 1 when less (or when short generations leave rounds undrafted).

Every speculative cell also says whether its output is exact (`exactness`): at T=0 by greedy
identity — each prompt's tokens equal plain decoding's (`ar`) in the same group — and at T>0 by
the chi-square cell of `exactness.py`: the same method, budget, topk and filters at that
temperature on the tiny enumerable pair, its samples tested against the exact distribution. At
T>0 the cell also counts the seeded outputs equal to plain decoding's (each prompt keeps its seed
across configs), which holds up to float32 rounding (`with_seeded_identity`).

This module does no argument parsing (`commands/bench.py`) and no decoding of its own (`LLM`).
"""
from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..engine.sequence import tau_histogram
from ..errors import UserError
from ..sampling_params import SamplingParams
from ..speculative.proposer import METHODS, PLAIN, needs_drafter, proposer_class

if TYPE_CHECKING:  # peers.py builds on Pass: imported for the annotations only
    from .peers import Peer, PeerRun


@dataclass(slots=True, frozen=True)
class Config:
    """One decoding configuration of our engine."""
    method: str              # a name in speculative.proposer.METHODS
    budget: int | str | None = None  # tree nodes per round, or "auto" (chosen each round); None otherwise
    topk: int | None = None    # ddtree children per node at most; None = no cap
    compiled: bool | None = None  # the model runner's mode for this config; None = as loaded

    @property
    def label(self) -> str:
        mode = "" if self.compiled is None else (" [compiled]" if self.compiled else " [eager]")
        if self.budget is None:
            return self.method + mode
        return f"{self.method}@{self.budget}" + (f"/topk{self.topk}" if self.topk is not None else "") + mode

    @property
    def baseline(self) -> Config:
        """Plain decoding in the same mode: what this config's speedup and greedy identity refer to."""
        return Config(PLAIN, compiled=self.compiled)


@dataclass(slots=True)
class Pass:
    """One timed pass over the prompt set."""
    seconds: float
    tokens: int                                   # completion tokens over all prompts
    accept_lengths: list[int] = field(default_factory=list)  # tau of every round
    steps: int = 0                                # engine steps that ran a round (target forwards)
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds in this pass
    token_ids: list[list[int]] = field(default_factory=list)  # each prompt's output (greedy identity)
    budgets: list[int] = field(default_factory=list)         # budget="auto": nodes verified, every round
    predicted_taus: list[float] = field(default_factory=list)  # budget="auto": E[tau] of each round's choice
    slice_seconds: list[float] = field(default_factory=list)  # a joined pass: each slice's seconds ...
    slice_tokens: list[int] = field(default_factory=list)     # ... and tokens (in prompt order)

    @property
    def tok_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-12)

    @staticmethod
    def joined(parts: list[Pass]) -> Pass:
        """One pass from its slices (in prompt order): times, tokens and steps summed, per-round
        and per-prompt lists concatenated."""
        timings: dict[str, float] = {}
        for p in parts:
            for k, v in p.timings.items():
                timings[k] = timings.get(k, 0.0) + v
        return Pass(seconds=sum(p.seconds for p in parts), tokens=sum(p.tokens for p in parts),
                    accept_lengths=[t for p in parts for t in p.accept_lengths], steps=sum(p.steps for p in parts),
                    timings=timings, token_ids=[t for p in parts for t in p.token_ids],
                    budgets=[b for p in parts for b in p.budgets],
                    predicted_taus=[t for p in parts for t in p.predicted_taus],
                    slice_seconds=[p.seconds for p in parts], slice_tokens=[p.tokens for p in parts])

    def per_step(self, phases: tuple[str, ...]) -> float:
        """Seconds per engine step spent in `phases`."""
        return sum(self.timings.get(p, 0.0) for p in phases) / max(self.steps, 1)


@dataclass(slots=True)
class BenchPlan:
    methods: list[str]
    budgets: list[int | str]     # tree budgets: integers and/or "auto"
    temperatures: list[float]
    concurrency: list[int]
    repeats: int = 3
    warmup: int = 1
    topks: list[int | None] = field(default_factory=lambda: [None])  # ddtree branching caps (None: none)
    exact_samples: int = 20000   # samples of each T>0 chi-square cell; 0 = no exactness check
    compile_modes: list[bool] | None = None  # compare eager (False) and compiled (True) runs; None = as loaded
    slice_prompts: int = 2       # prompts per interleaved slice (at least the concurrency; see `slices`)

    def __post_init__(self):
        for name in ("methods", "temperatures", "concurrency"):
            if not getattr(self, name):
                raise UserError(f"bench: --{name} must list at least one value")
        trees = [m for m in self.methods if m in METHODS and proposer_class(m).sized_by_budget]
        if trees and not self.budgets:
            raise UserError(f"bench: {' and '.join(trees)} need{'s' if len(trees) == 1 else ''} at least one budget "
                            f"(--budgets)")
        if min(self.concurrency) < 1:
            raise UserError(f"bench: concurrency must be >= 1, got {self.concurrency}")
        if any(t < 0 for t in self.temperatures):
            raise UserError(f"bench: temperatures must be >= 0, got {self.temperatures}")
        if self.repeats < 1 or self.warmup < 0:
            raise UserError(f"bench: need --repeats >= 1 and --warmup >= 0, got {self.repeats}, {self.warmup}")
        if not self.topks or any(k is not None and k < 1 for k in self.topks):
            raise UserError(f"bench: --topks must list caps >= 1 (or none), got {self.topks}")
        bad = [b for b in self.budgets if b != "auto" and (isinstance(b, bool) or not isinstance(b, int) or b < 1)]
        if bad:
            raise UserError(f"bench: budgets must be integers >= 1 or 'auto', got {bad}")
        if trees and self.budgets:
            unused = [k for k in self.topks if k is not None and k > max(nodes(b) for b in self.budgets)]
            if unused:
                raise UserError(f"bench: topk {unused} exceeds every budget ({self.budgets}); a tree of budget N "
                                "has at most N children per node")
        if self.slice_prompts < 1:
            raise UserError(f"bench: --slice-prompts must be >= 1, got {self.slice_prompts}")
        if self.exact_samples and self.exact_samples < 100:
            raise UserError(f"bench: --exact-samples must be 0 (no check) or >= 100, got {self.exact_samples}")

    def configs(self) -> list[Config]:
        """`ar` first (the baseline is always measured), then the requested speculative configs;
        with compile modes, that list once per mode."""
        out = [Config(PLAIN)]
        caps = sorted(set(self.topks), key=lambda k: (k is not None, k or 0))
        for m in METHODS:  # registry order
            if m == PLAIN or m not in self.methods:
                continue
            if proposer_class(m).sized_by_budget:  # each budget with each cap that fits it (topk <= budget)
                budgets = sorted(set(self.budgets), key=lambda b: (b == "auto", nodes(b)))  # auto last
                out += [Config(m, b, k) for b in budgets for k in caps if k is None or k <= nodes(b)]
            else:
                out.append(Config(m))
        if self.compile_modes:
            out = [replace(c, compiled=mode) for mode in self.compile_modes for c in out]
        return out

    def passes(self, peer_runs: int = 0) -> int:
        """Total timed passes, for the progress bar (`peer_runs`: the peers' configurations)."""
        ours = len(self.temperatures) * len(self.concurrency) * len(self.configs())
        return (ours + len(self.temperatures) * peer_runs) * (self.warmup + self.repeats)


def nodes(budget: int | str) -> int:
    """The most draft nodes a tree of this budget holds ("auto": the largest it may choose)."""
    from ..engine.engine_config import AUTO_MAX_BUDGET
    return AUTO_MAX_BUDGET if budget == "auto" else budget


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def portable_path(path: str | Path) -> str:
    """A path fit for a shared report: the package's own files as flashtree/..., files under the
    working directory relative to it, anything else as .../parent/name (never a machine path)."""
    p = Path(path).resolve()
    pkg = Path(__file__).resolve().parents[1]  # the flashtree package
    if p.is_relative_to(pkg):
        return str(Path("flashtree") / p.relative_to(pkg))
    cwd = Path.cwd().resolve()
    if p.is_relative_to(cwd):
        return str(p.relative_to(cwd)) or "."
    return str(Path("...", *p.parts[-2:]))


def machine_load() -> dict:
    """1-minute load average and CPU count, written next to the numbers (None where unknown)."""
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {"load_1m": load, "cpus": os.cpu_count()}


# ---------------------------------------------------------------------------- passes
def our_pass(llm, prompt_ids: list[list[int]], params: list[SamplingParams], cfg: Config,
             concurrency: int) -> Pass:
    """Run the prompt set through `llm` with at most `concurrency` sequences per step."""
    eng = llm.engine
    eng.limit_batch(concurrency)  # the KV cache was sized for the largest concurrency
    if cfg.compiled is not None:
        eng.runner.use_compiled(cfg.compiled)
    # every pass prefills its prompts: pages cached by an earlier pass would favour the configs
    # that can reuse them (a drafter-based request needs its drafter rows written too)
    if not eng.reset_prefix_cache():
        raise RuntimeError("bench: a pass started while requests were still running")
    eng.timings.clear()
    before = eng.stats.snapshot()
    t0 = time.perf_counter()
    outs = llm.generate(prompt_ids, params, use_tqdm=False, method=cfg.method, budget=cfg.budget, topk=cfg.topk)
    seconds = time.perf_counter() - t0
    return Pass(seconds=seconds, tokens=sum(o.metrics.completion_tokens for o in outs),
                accept_lengths=[t for o in outs for t in o.metrics.accept_lengths],
                steps=eng.stats.since(before).forwards, timings=eng.timings.as_dict(),
                token_ids=[o.token_ids for o in outs], budgets=[b for o in outs for b in o.metrics.budgets],
                predicted_taus=[t for o in outs for t in o.metrics.predicted_taus])


# ---------------------------------------------------------------------------- isolated costs
COMPONENT_REPEATS = 10  # timed calls per component (after one warm-up); the median is kept


@dataclass(slots=True)
class ComponentCosts:
    """Seconds of one isolated target forward / drafter pass at one concurrency, timed apart
    from the rounds on synthetic sequences of `context` committed tokens."""
    forward: dict[int, float]       # tokens per sequence (tree size) -> one target forward
    draft: dict[Config, float]      # one drafter pass for that configuration (none: no drafter)
    context: int
    draft_len: int = 10             # the engine's ngram chain length (its tree size - 1)

    def bound(self, cfg: Config, tau: float, block_size: int) -> float | None:
        """None for budget="auto": one fixed tree per round, which the bound assumes, is not what it runs."""
        if cfg.method == PLAIN:
            return 1.0
        n = tree_size(cfg, block_size, self.draft_len)
        if n is None:
            return None
        return tau * self.forward[1] / max(self.draft.get(cfg, 0.0) + self.forward[n], 1e-12)


def tree_size(cfg: Config, block_size: int, draft_len: int = 10) -> int | None:
    """Tokens per sequence in one verify forward: the root plus the draft nodes, as the method
    says (`Proposer.round_tokens`). None for budget="auto": its size changes every round."""
    return proposer_class(cfg.method).round_tokens(cfg.budget, cfg.topk, block_size, draft_len)


def component_costs(llm, taus: dict[Config, float], concurrency: int, context: int,
                    repeats: int = COMPONENT_REPEATS) -> ComponentCosts:
    """Time the two model calls of a round on their own, for `concurrency` sequences of `context`
    committed tokens: the target forward for every tree size of the configs in `taus` (and for
    plain decoding), and each speculative config's drafter pass over round(tau) new context
    features. Uses the engine's model runner and drafter pass (`engine.drafts`) on temporary cache slots; the engine's
    state and counters are left as they were."""
    from ..engine.cost_seeding import timed, verify_call
    from ..engine.sequence import Sequence

    eng = llm.engine
    block_size = eng.limits.default_block_size
    sizes = sorted({tree_size(c, block_size, eng.config.draft_len) for c in taus} - {None} | {1})
    context = max(1, min(context, eng.max_model_len - max(sizes) - 1))
    slots = [eng.blocks.allocate() for _ in range(concurrency)]
    made = []  # temporary sequences given drafter context

    def seqs(cfg: Config) -> list[Sequence]:
        shape = eng.proposers[cfg.method].configure(None, cfg.budget, cfg.topk, {})  # as a request of cfg's
        return [Sequence(req_id=-1, prompt_ids=[0] * context, params=SamplingParams(max_tokens=block_size + 1),
                         method=cfg.method, block_size=shape.block_size, budget=shape.budget, uniforms=None,
                         stop_ids=frozenset(), topk=shape.topk, auto=shape.auto, options=dict(shape.options),
                         output_ids=[0], slot=slot, length=context) for slot in slots]

    def forward_call(n: int):
        return verify_call(eng, slots, n, context)

    def draft_call(cfg: Config):
        batch = seqs(cfg)
        rows = max(1, min(round(taus[cfg]), sizes[-1]))  # one round's accepted tokens, pending
        for s in batch:
            eng.drafts.on_prefill(s, rows)
        made.extend(batch)
        return lambda: eng.drafts.source(batch)

    try:
        with torch.inference_mode():
            calls = {("forward", n): forward_call(n) for n in sizes}
            if eng.drafter is not None:
                calls.update({("draft", cfg): draft_call(cfg) for cfg in taus if needs_drafter(cfg.method)})
            times = {key: [] for key in calls}
            for r in range(repeats + 1):  # interleaved, so machine noise hits every component alike
                for key, call in calls.items():
                    secs = timed(call, eng.device)
                    if r:  # round 0 warms up
                        times[key].append(secs)
    finally:
        for slot in reversed(slots):  # the free list ends up in its original order
            eng.blocks.free(slot)
        for s in made:
            eng.drafts.release(s)
    forward = {n: median(ts) for (kind, n), ts in times.items() if kind == "forward"}
    draft = {cfg: median(ts) for (kind, cfg), ts in times.items() if kind == "draft"}
    return ComponentCosts(forward=forward, draft=draft, context=context, draft_len=eng.config.draft_len)


# ---------------------------------------------------------------------------- the sweep
def pass_order(configs: list, r: int) -> list:
    """The configurations' runs of slice r (counted over repeats): rotated by r, so no
    configuration always runs first or always after the same one (a run after a heavier one, or
    after the peers, can run on a colder cache)."""
    k = r % len(configs) if configs else 0
    return configs[k:] + configs[:k]


def slices(n: int, concurrency: int, size: int) -> list[range]:
    """The prompt set's indices 0..n-1 in consecutive slices of max(size, concurrency) prompts (a
    slice narrower than the concurrency would not fill the batch it measures); a last short slice
    joins the one before unless it fills a batch of its own."""
    step = max(size, concurrency)
    starts = list(range(0, n, step))
    if len(starts) > 1 and n - starts[-1] < min(step, concurrency):
        starts.pop()
    return [range(a, b) for a, b in zip(starts, starts[1:] + [n])]


def run_bench(llm, prompt_ids: list[list[int]], base: SamplingParams, plan: BenchPlan,
              peers: Sequence[Peer] = (), progress=None, patch=None) -> dict:
    """Measure every (temperature, concurrency, config) cell and the peers' configurations (at
    the lowest concurrency, after our slices of each repeat, every prompt); return the report.
    `patch(engine)` runs on every engine measured or checked (tests: a wrong verifier)."""
    if patch is not None:
        patch(llm.engine)
    tick = progress.update if progress is not None else (lambda n=1: None)
    block_size = llm.engine.limits.default_block_size
    loaded_compiled = llm.engine.runner.compiled  # the mode of configs without one
    context = int(median([len(p) for p in prompt_ids])) + base.max_tokens // 2  # mid-generation
    cells, peer_rows, chi_square, auto_costs = [], [], {}, []
    for temp in plan.temperatures:
        params = [replace(base, temperature=temp, seed=(base.seed or 0) + i) for i in range(len(prompt_ids))]
        for conc in plan.concurrency:
            with_peers = conc == min(plan.concurrency)
            runs = {cfg: [] for cfg in plan.configs()}
            peer_runs = {(peer, run): [] for peer in peers for run in peer.runs} if with_peers else {}
            parts = slices(len(prompt_ids), conc, plan.slice_prompts)
            for r in range(plan.warmup + plan.repeats):
                keep = r >= plan.warmup
                done: dict[Config, list[Pass]] = {cfg: [] for cfg in runs}
                for k, sl in enumerate(parts):  # every config on a slice before the next slice
                    for cfg in pass_order(list(runs), r * len(parts) + k):
                        done[cfg].append(our_pass(llm, [prompt_ids[i] for i in sl], [params[i] for i in sl],
                                                  cfg, conc))
                for cfg, passes in runs.items():
                    if keep:
                        passes.append(Pass.joined(done[cfg]))
                    tick()
                for (peer, run), passes in peer_runs.items():
                    p = peer.run(run, prompt_ids, params)
                    if keep:
                        passes.append(p)
                    tick()
            group_peers = [peer_summary(run, temp, ps) for (_, run), ps in peer_runs.items()]
            peer_rows += group_peers
            costs = {}  # per compile mode (None: as loaded), timed in that mode
            for mode in dict.fromkeys(cfg.compiled for cfg in runs):
                if mode is not None:
                    llm.engine.runner.use_compiled(mode)
                costs[mode] = component_costs(llm, {cfg: mean_tau(ps) for cfg, ps in runs.items()
                                                    if cfg.compiled == mode}, conc, context)
            group = summarize_group(runs, temp, conc, block_size, group_peers, costs)
            auto_costs.append({"temperature": temp, "concurrency": conc, **cost_table_snapshot(llm.engine.adaptive.costs)})
            if plan.exact_samples:
                for cell, cfg in zip(group, runs):
                    if temp == 0:
                        cell["exact"] = token_identity(runs, cfg)
                    else:  # one cell per (config, temperature), whatever the concurrency
                        if (cfg, temp) not in chi_square:
                            chi_square[cfg, temp] = chi_square_cell(
                                cfg, replace(base, temperature=temp), plan.exact_samples, patch=patch,
                                compiled=loaded_compiled if cfg.compiled is None else cfg.compiled)
                        cell["exact"] = with_seeded_identity(chi_square[cfg, temp],
                                                             token_identity(runs, cfg, "seeded identity"))
            cells += group
    return {"cells": cells, "peers": peer_rows, "auto_costs": auto_costs}


def cost_table_snapshot(costs) -> dict:
    """Auto's cost table as the group left it (JSON): verify ms by "batch x tokens", its drift
    against the seeds by batch, the drafter pass ms by batch, how drafting rounds ran against
    their price by batch (`error`) and a caught-up context row's ms — to read beside the isolated
    component costs the report times after the group."""
    row = costs.context_row_s
    return {"verify_ms": {f"{b}x{t}": round(s * 1e3, 3) for (b, t), s in sorted(costs.verify_s.items())},
            "drift": {str(b): round(d, 3) for b, d in sorted(costs.drift.items())},
            "draft_ms": {str(b): round(s * 1e3, 3) for b, s in sorted(costs.draft_s.items())},
            "error": {str(b): round(e, 3) for b, e in sorted(costs.wide_error.items())},
            "context_row_ms": None if row is None else round(row * 1e3, 4)}


# ---------------------------------------------------------------------------- exactness
def token_identity(runs: dict[Config, list[Pass]], cfg: Config, check: str = "greedy identity") -> dict:
    """Every prompt's tokens in every timed pass of `cfg` equal plain decoding's (the group's first
    `ar` pass); `ar` itself is the reference (its own passes must agree with it too). At T=0 that is
    greedy identity; at T>0 "seeded identity": each prompt has its own seed in every config, and a
    seeded request commits plain decoding's seeded tokens (`sampling.Uniforms`)."""
    ref = runs[cfg.baseline][0].token_ids
    outs = [ids for p in runs[cfg] for ids in p.token_ids]
    same = sum(ids == ref[i % len(ref)] for i, ids in enumerate(outs))
    return {"check": "reference" if cfg.method == PLAIN else check, "passed": same == len(outs),
            "identical": same, "outputs": len(outs)}


def chi_square_cell(cfg: Config, params: SamplingParams, n: int, patch=None, compiled: bool = False) -> dict:
    """T>0: `exactness.check_cell` for this config at these sampling parameters — the engine's samples
    on the tiny V=8 pair (drafts = the target's own greedy chain, so deep paths are verified) against
    its exactly enumerated distribution; pass = chi-square p > 1e-3, TV within sampling noise, mean
    tau > 1. `ar` is the reference. `patch(engine)` runs on the cell's engine (tests: a wrong verifier)."""
    if cfg.method == PLAIN:
        return {"check": "reference", "passed": True}
    from .exactness import Cell, check_cell
    pair = _tiny_pair()
    V = pair[0].config.vocab_size
    cell_params = SamplingParams(temperature=params.temperature, top_p=params.top_p, min_p=params.min_p,
                                 top_k=params.top_k if params.top_k < V else 0)  # top_k >= V filters nothing
    drafts = "target" if needs_drafter(cfg.method) else "model"  # ngram: its own drafts from the context
    cell = check_cell(*pair, [1, 2, 3], Cell(cfg.method, cfg.budget, cell_params, n, drafts=drafts, compile=compiled,
                                             topk=cfg.topk), patch=patch)
    return {"check": "chi-square cell", "passed": cell.passed, "p_value": cell.p_value, "tv": cell.tv,
            "tv_limit": cell.tv_limit, "samples": n, "categories": cell.categories,
            "mean_accept_length": cell.mean_accept_length, "n_tokens": cell.n_tokens,
            "pair": "exactness.tiny_pair (V=8, block 3), drafts = the target's greedy chain"}


def with_seeded_identity(chi: dict, identity: dict) -> dict:
    """A T>0 cell's evidence: the chi-square cell on the tiny pair (the verdict) and, on this run's
    pair, how many seeded outputs equal plain decoding's. The identity is exact in float64 (tested);
    in float32 a draw whose uniform falls within rounding of a CDF boundary can flip between two
    forward shapes (seen about once in 7,000 sampled tokens on the bundled pair), so it informs
    rather than decides."""
    if chi["check"] == "reference":
        return chi
    return {**chi, "identical": identity["identical"], "outputs": identity["outputs"]}


@functools.cache
def _tiny_pair():
    from .exactness import tiny_pair
    return tiny_pair()


def exact_label(exact: dict | None) -> str:
    """The table's `exact` column: yes / NO with its evidence, ref for plain decoding."""
    if not exact:
        return "-"
    if exact["check"] == "reference":
        return "ref"
    verdict = "yes" if exact["passed"] else "NO"
    if exact["check"] == "greedy identity":
        return f"{verdict} {exact['identical']}/{exact['outputs']}"
    same = f" {exact['identical']}/{exact['outputs']}" if "identical" in exact else ""
    return f"{verdict} p={exact['p_value']:.2g}{same}"


def inexact(report: dict) -> list[dict]:
    """Cells whose output was not shown exact."""
    return [c for c in report["cells"] if c.get("exact") and c["exact"]["passed"] is False]


def peer_summary(run: PeerRun, temp: float, passes: list[Pass]) -> dict:
    return {"name": run.name, "engine": run.engine, "weights": run.weights, "temperature": temp, "batch_size": 1,
            "prompt_lookup_num_tokens": run.lookup_tokens, "max_matching_ngram_size": run.max_ngram,
            "tok_s": median([p.tok_s for p in passes]), "tok_s_runs": [p.tok_s for p in passes],
            "completion_tokens": sum(p.tokens for p in passes)}


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def mean_tau(passes: list[Pass]) -> float:
    taus = [t for p in passes for t in p.accept_lengths]
    return sum(taus) / len(taus) if taus else 0.0


def paired_ratios(passes: list[Pass], baseline: list[Pass]) -> list[float]:
    """Each repeat's tok/s over the baseline's pass of the same repeat. The passes of one repeat
    run interleaved slice by slice, so a drift of the machine's speed over seconds to minutes
    cancels in each ratio, which a ratio of the two medians keeps."""
    return [p.tok_s / b.tok_s for p, b in zip(passes, baseline) if b.tok_s]


def pooled_ratio(passes: list[Pass], baseline: list[Pass], draws: int = 4000,
                 seed: int = 0) -> tuple[float, float, float] | None:
    """The tok/s ratio over every repeat's slices pooled (tokens and seconds summed per side)
    and its 95 % bootstrap interval, resampling the paired slices (the same prompts, run back to
    back): (ratio, low, high), or None without per-slice times. The two slices of a pair run a few
    seconds apart at most (the other configurations' slices between them), so they share the
    machine's speed of the moment; the interval is what the run can tell apart, e.g. whether a
    configuration is slower than plain decoding at all. (It treats slices as independent; an
    auto configuration's state carries from one slice to the next within a pass.)"""
    pairs = [(a_s, a_t, b_s, b_t) for p, b in zip(passes, baseline)
             if len(p.slice_seconds) == len(b.slice_seconds)
             for a_s, a_t, b_s, b_t in zip(p.slice_seconds, p.slice_tokens, b.slice_seconds, b.slice_tokens)]
    if not pairs:
        return None
    from scipy.stats import bootstrap
    cols = tuple(np.asarray(col, dtype=float) for col in zip(*pairs))  # a_s, a_t, b_s, b_t: [S] each

    def ratio(a_s, a_t, b_s, b_t, axis=-1):  # (tokens / seconds) over (tokens / seconds), slices summed
        return (a_t.sum(axis) / a_s.sum(axis)) / (b_t.sum(axis) / b_s.sum(axis))
    r = float(ratio(*cols))
    if len(pairs) < 2:  # one pair: every resample is that pair
        return r, r, r
    ci = bootstrap(cols, ratio, paired=True, vectorized=True, n_resamples=draws, method="percentile",
                   confidence_level=0.95, rng=np.random.default_rng(seed)).confidence_interval
    return r, float(ci.low), float(ci.high)


def summarize_group(runs: dict[Config, list[Pass]], temp: float, conc: int, block_size: int,
                    peers: list[dict], costs_by_mode: dict[bool | None, ComponentCosts]) -> list[dict]:
    """Cells of one (temperature, concurrency) group; `ar` is the baseline of the others. The
    bound comes from the isolated `costs`; the passes' own phase timings are reported beside it."""
    out = []
    for cfg, passes in runs.items():
        ar_tok_s = median([p.tok_s for p in runs[cfg.baseline]])
        costs = costs_by_mode[cfg.compiled]
        taus = [t for p in passes for t in p.accept_lengths]
        tau = mean_tau(passes)
        hist = tau_histogram(taus, block_size)
        tok_s = median([p.tok_s for p in passes])
        n = tree_size(cfg, block_size)
        bound = costs.bound(cfg, tau, block_size)
        speedup = tok_s / ar_tok_s if ar_tok_s else None
        paired = paired_ratios(passes, runs[cfg.baseline])
        pooled = pooled_ratio(passes, runs[cfg.baseline]) if cfg != cfg.baseline else None
        phases = sorted({k for p in passes for k in p.timings})
        out.append({
            "method": cfg.method, "budget": cfg.budget, "topk": cfg.topk, "compiled": cfg.compiled,
            "label": cfg.label, "temperature": temp,
            "concurrency": conc, "tok_s": tok_s, "tok_s_runs": [p.tok_s for p in passes],
            "seconds_runs": [p.seconds for p in passes],
            "completion_tokens": sum(p.tokens for p in passes), "repeats": len(passes),
            "rounds": len(taus), "steps": sum(p.steps for p in passes), "mean_accept_length": tau,
            "accept_length_histogram": hist,
            "costs_ms": {"c1": 1e3 * costs.forward[1], "draft": 1e3 * costs.draft.get(cfg, 0.0),
                         "verify": 1e3 * costs.forward[n] if n else None, "tree_size": n, "context": costs.context},
            "mean_budget": mean([b for p in passes for b in p.budgets]),
            "predicted_tau": mean([t for p in passes for t in p.predicted_taus]),
            "phase_ms_per_step": {k: 1e3 * median([p.per_step((k,)) for p in passes]) for k in phases},
            "speedup_vs_ar": speedup, "speedup_paired": median(paired) if paired else None, "speedup_runs": paired,
            "speedup_pooled": pooled and pooled[0], "speedup_pooled_95": pooled and [pooled[1], pooled[2]],
            "bound": bound,
            "bound_share": speedup / bound if speedup is not None and bound else None,
            "speedup_vs_peers": {q["name"]: tok_s / q["tok_s"] for q in peers if q["tok_s"]},
        })
    return out


# ---------------------------------------------------------------------------- reporting
