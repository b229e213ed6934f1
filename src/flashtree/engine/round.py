"""The data passed between the phases of a round, and packing trees (or prompt chunks: `pack_prefill`)
into one target forward.

draft -> `DraftOutput` (per-depth top-K drafts on the host) -> trees (`speculative/tree.py`) ->
`VerifyInput` (flat padded arrays + ancestor visibility, on the host for the walk and on the device
for the forward) -> target forward -> `VerifyOutput` (`speculative/verify.py`, through a
`Verifier`) -> commit (`RoundOutput`: all of a round before it) -> `StepEvent`s. Also the records the engine keeps of its rounds: phase times (`RoundTimes`),
each committed request-round for the trace (`RoundRecord`) and its cumulative counters
(`EngineStats`). Nothing here runs a model or publishes a metric.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch

from ..speculative.adaptive import Choice
from ..speculative.tree import DraftTree
from ..speculative.verify import VerifyOutput, verify_tree
from .sequence import Sequence


@dataclass(slots=True)
class VerifyInput:
    """Packed trees: host arrays for the walk (`speculative/verify.py`), device tensors for the
    target forward."""
    tokens: np.ndarray       # [B, T] node tokens (root first), pad 0
    parents: np.ndarray      # [B, T] parent index (root and pad: 0)
    depths: np.ndarray       # [B, T]
    valid: np.ndarray        # [B, T] bool
    vis: np.ndarray          # [B, T, T] bool: node t sees node j (ancestors and itself)
    flat: np.ndarray         # [R] flat indices (b * T + t) of the valid nodes, sequence-major
    ids: torch.Tensor        # [B, T] `tokens` on the device
    positions: torch.Tensor  # [B, T] RoPE position = length + depth (cache row = length + node index)
    lengths: np.ndarray      # [B] committed rows each sequence's nodes see (host: the runner copies it over)
    mask: torch.Tensor       # [B, T, T] `vis` on the device
    nodes: torch.Tensor      # [R] `flat` on the device
    sizes: list[int]         # nodes per sequence (root included)
    deepest: list[int]       # each sequence's largest node depth

    @property
    def row_depths(self) -> torch.Tensor:
        """[R] the depth of each valid node, in row (sequence-major) order, on the device."""
        return torch.from_numpy(self.depths.reshape(-1)[self.flat]).to(self.positions.device)

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Row range of each sequence among the R valid nodes."""
        ends = np.cumsum(self.sizes).tolist()
        return [(e - n, e) for e, n in zip(ends, self.sizes)]

    def scatter(self, values: torch.Tensor) -> np.ndarray:
        """Per-valid-node values [R] (device) -> padded [B, T] on the host (one copy)."""
        if self.tokens.shape[1] == 1:  # roots only: row b is node (b, 0)
            return values.cpu().numpy().astype(np.int64, copy=False).reshape(-1, 1)
        out = np.zeros(self.tokens.shape, dtype=np.int64)
        out.reshape(-1)[self.flat] = values.cpu().numpy()
        return out


def pack_trees(trees: list[DraftTree], lengths: list[int], device) -> VerifyInput:
    B, T = len(trees), max(t.size for t in trees)
    if T == 1:  # roots only (a plain round, most rounds): no visibility to build — each host array
        # call of a round costs several microseconds with its caches cold
        tokens = np.array([[t.tokens[0]] for t in trees], dtype=np.int64)
        parents, depths = np.zeros((B, 1), dtype=np.int64), np.zeros((B, 1), dtype=np.int64)
        valid, vis, flat = np.ones((B, 1), dtype=bool), np.ones((B, 1, 1), dtype=bool), np.arange(B)
    else:
        tokens = np.zeros((B, T), dtype=np.int64)
        parents = np.zeros((B, T), dtype=np.int64)
        depths = np.zeros((B, T), dtype=np.int64)
        valid = np.zeros((B, T), dtype=bool)
        vis = np.zeros((B, T, T), dtype=bool)
        vis[:, np.arange(T), np.arange(T)] = True  # padding sees itself only: no all-masked attention row
        for b, t in enumerate(trees):
            n = t.size
            tokens[b, :n] = t.tokens
            parents[b, 1:n] = t.parents[1:]
            depths[b, :n] = t.depths
            valid[b, :n] = True
            vis[b, :n, :n] = t.visibility()
        flat = np.flatnonzero(valid)
    positions = np.asarray(lengths, dtype=np.int64)[:, None] + depths
    dev = torch.device(device)
    return VerifyInput(tokens=tokens, parents=parents, depths=depths, valid=valid, vis=vis, flat=flat,
                       ids=torch.from_numpy(tokens).to(dev), positions=torch.from_numpy(positions).to(dev),
                       lengths=np.asarray(lengths, dtype=np.int64),
                       mask=torch.from_numpy(vis).to(dev), nodes=torch.from_numpy(flat).to(dev),
                       sizes=[t.size for t in trees], deepest=[max(t.depths) for t in trees])


# the phases of a step, in order, as `RoundTimes` names them (seed_costs and budget aside:
# the auto cost seeding and the budget choice, both rarely more than noise)
PHASES = ("prefill", "draft", "tree", "pack", "verify_forward", "verify_walk", "commit")


def pack_prefill(chunks: list[list[int]], starts: list[int], device):
    """Prompt chunks (each after its `starts[b]` cached rows) as one target forward: ids [B, T]
    (padded), positions [B, T], the rows cached before each chunk [B], visibility [B, T, T]
    (causal among a chunk's own tokens; padding sees only itself, so no row is all masked) and
    the flat index of each chunk's last token [B] (the rows whose logits are kept). The starts
    stay on the host (the runner copies them over)."""
    B, T = len(chunks), max(len(c) for c in chunks)
    ids = torch.zeros(B, T, dtype=torch.long)
    for b, c in enumerate(chunks):
        ids[b, :len(c)] = torch.tensor(c)
    start = torch.tensor(starts, device=device)
    n = torch.tensor([len(c) for c in chunks], device=device)
    t = torch.arange(T, device=device)
    vis = (t[None, :, None] >= t[None, None, :]) & (t[None, None, :] < n[:, None, None])
    vis |= torch.eye(T, dtype=torch.bool, device=device)
    last = torch.arange(B, device=device) * T + n - 1
    return ids.to(device), start[:, None] + t, np.asarray(starts, dtype=np.int64), vis, last


def beyond_blocks(seqs: list[Sequence], rows) -> int:
    """The context rows a drafter pass catches up on: what each sequence feeds it (rows(s)) beyond
    a block's worth — a steady drafting round feeds at most its accepted path."""
    return sum(max(rows(s) - s.block_size, 0) for s in seqs)


@dataclass(slots=True)
class RoundOutput:
    """Everything of a round before its commit (`Engine._round`)."""
    trees: list[DraftTree]          # as verified (auto sequences: cut to the round's chosen size)
    vin: VerifyInput
    vout: VerifyOutput
    choices: list[Choice | None]    # per sequence: its auto choice (None: a fixed budget)
    drafted: int                    # sequences with a draft, any method's (0: no proposer has anything to learn)
    passed: int                     # sequences the drafter pass ran for (what it cost counts: fit, the cost table)
    caught_up: int = 0              # context rows the drafter pass fed beyond a block's worth a sequence (its
                                    # prompt, or what it decoded plainly since it last drafted): 0 = a steady pass
    logprobs: list | None = None    # per sequence: its committed tokens' TokenLogprobs (None: not asked)


@dataclass(slots=True)
class StepEvent:
    seq: Sequence
    new_ids: list[int]   # tokens emitted by this step (after stop truncation)



@dataclass(slots=True)
class RoundTimes:
    """Seconds spent in each phase of an engine step (`Engine.round_times`), or summed over every
    step (`Engine.timings`). A phase that is not a field raises: a renamed phase cannot silently
    read as zero."""
    prefill: float = 0.0
    seed_costs: float = 0.0
    draft: float = 0.0
    tree: float = 0.0
    grammar: float = 0.0   # structured output: drafts pruned and forced tokens added (sampler masks: verify_walk)
    budget: float = 0.0
    pack: float = 0.0
    verify_forward: float = 0.0
    verify_walk: float = 0.0
    commit: float = 0.0

    def add(self, phase: str, seconds: float) -> None:
        setattr(self, phase, getattr(self, phase) + seconds)

    def clear(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0.0)

    def as_dict(self) -> dict[str, float]:
        """The phases that took time, by name (the form the bench's JSON and the trace keep)."""
        return {f.name: t for f in fields(self) if (t := getattr(self, f.name))}


class PhaseClock:
    """Times the phases of engine steps: `with clock("draft"): ...` adds the block's seconds to the
    step's times (`step`, fresh each `new_step`) and to the totals over every step (`total`)."""

    def __init__(self):
        self.total, self.step = RoundTimes(), RoundTimes()
        self.started = time.perf_counter()

    def new_step(self) -> None:
        self.step, self.started = RoundTimes(), time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since this step began."""
        return time.perf_counter() - self.started

    def __call__(self, phase: str) -> _Timing:
        return _Timing(self, phase)


class _Timing:
    """One `with clock(phase)` block (a plain class: a generator-based context manager costs
    ~1.1 us a block, nine blocks a round)."""
    __slots__ = ("clock", "phase", "t0")

    def __init__(self, clock: PhaseClock, phase: str):
        self.clock, self.phase = clock, phase

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        dt = time.perf_counter() - self.t0
        self.clock.total.add(self.phase, dt)
        self.clock.step.add(self.phase, dt)


@dataclass(slots=True)
class RoundRecord:
    """One sequence's committed round as `Engine.round_log` keeps it (the trace reads these)."""
    req_id: int
    tree: DraftTree                # the tree it verified (its root: the last committed token)
    path: list[int]                # the accepted nodes, root first
    bonus: int                     # the token the target drew after them
    predicted_tau: float | None    # budget="auto": the tau its choice expected
    times: RoundTimes | None = None  # its step's phase times (complete once the step is)

    @property
    def tau(self) -> int:
        return len(self.path)

    @property
    def committed(self) -> list[int]:
        """The tokens the round committed: the accepted nodes' tokens, then the bonus."""
        return [self.tree.tokens[i] for i in self.path[1:]] + [self.bonus]


@dataclass(slots=True)
class EngineStats:
    """The engine's cumulative counters since it was built (`Engine.stats`), the one record the
    server's decode-batch log and Prometheus metrics and the bench read. Each counts where its
    fact happens in the engine; a reader keeps a `snapshot()` and takes `since(it)` later, so
    no reader keeps counters of its own."""
    rounds: int = 0             # committed rounds (steps that decoded)
    forwards: int = 0           # target verify forwards
    seqs_in_forwards: int = 0   # sequences in those forwards (their mean batch = this / forwards)
    request_rounds: int = 0     # rounds committed per sequence (one per sequence per committed round)
    committed_tokens: int = 0   # tokens those request-rounds committed, bonus included (the sum of tau)
    generated_tokens: int = 0   # tokens emitted to requests (a prefill's first token included)
    prefix_hit_tokens: int = 0  # prompt tokens adopted from the prefix cache, not computed
    preemptions: int = 0        # sequences sent back to the queue because pages ran out
    rounds_by_method: Counter[str] = field(default_factory=Counter)  # request-rounds per method

    def request_round(self, method: str, tau: int) -> None:
        """One sequence committed tau tokens (bonus included) in a round of `method`."""
        self.request_rounds += 1
        self.committed_tokens += tau
        self.rounds_by_method[method] += 1

    def snapshot(self) -> EngineStats:
        """A copy that later counting leaves alone."""
        return replace(self, rounds_by_method=Counter(self.rounds_by_method))

    def since(self, earlier: EngineStats) -> EngineStats:
        """What was counted after `earlier` (a snapshot of this record), field by field."""
        return EngineStats(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})


# draw(batch, vin, logits) -> [B, T] the target's draw at every node, on the host (the engine's sampler)
Draw = Callable[[list, VerifyInput, torch.Tensor], np.ndarray]
# verifier(batch, vin, logits [rows, V], draw) -> VerifyOutput: the engine's `verifier` seam (a test's
# wrong verifier, or a negative control of `measure/exactness.py`, goes there and must be caught)
Verifier = Callable[[list, VerifyInput, torch.Tensor, Draw], VerifyOutput]


def verify_round(batch: list, vin: VerifyInput, logits: torch.Tensor, draw: Draw) -> VerifyOutput:
    """The round's verify: the target's draws at every node, walked down each tree (`verify_tree`)."""
    return verify_tree(vin.tokens, vin.parents, vin.depths, vin.valid, draw(batch, vin, logits), vin.vis)
