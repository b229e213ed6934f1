"""The engine's options: `EngineConfig`, validated where it is built, and the KV capacity they imply.

It holds the defaults and limits of the options (budgets, page size, prefill pacing) and does not
decide anything per round: the engine (`engine.py`) reads these once when it is built.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from ..errors import UserError
from ..speculative.limits import AUTO
from ..speculative.proposer import METHODS

MAX_BUDGET = 512
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_BUDGET = AUTO  # ddtree and hybrid: a seeded sampled run still repeats exactly whatever the choices
                       # (each output position has its own uniform: sampling.Uniforms)
AUTO_MAX_BUDGET = 32  # the largest tree an auto round drafts (it verifies a best-first prefix of it)
MAX_PAGE_SIZE = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 256  # prompt rows prefilled per step (padding included)
DEFAULT_PREFILL_STALL = 2.0  # a stream's longest gap: its round + a paced prefill, ~3-4x its median
# LLM(precompile=): which compiled graphs are built at load. "single": the ones one sequence runs
# (a first chat answers after them); graphs for batches compile the first time a batch runs.
# "all": every graph the engine can run (a benchmark: no compile inside a request, no eager step).
# "background" (a server's default): the single ones, then the batch graphs in a helper process
# while the engine serves, batches running eager until their graphs are written (no compile
# inside a request either; without a helper, as "all").
PRECOMPILE = ("single", "all", "background")


@dataclass(slots=True)
class EngineConfig:
    method: str | None = None        # None = the pair's default (speculative.proposer.default_method)
    budget: int | str | None = None  # ddtree nodes per round, or "auto" (chosen each round); None = DEFAULT_BUDGET
    topk: int | None = None          # most children per ddtree node (1 = a chain); None = no cap
    block_size: int | None = None    # None = the drafter's block size
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_model_len: int | None = None  # None = the target's max_position_embeddings
    max_queue: int = 1024
    max_budget: int = 256            # the largest per-request ddtree budget (sizes the cache slack)
    auto_max_budget: int = AUTO_MAX_BUDGET  # budget="auto": the most nodes a round may verify (<= max_budget)
    max_ngram: int = 3               # ngram: the longest suffix n-gram looked up
    min_ngram: int = 1               # ngram: the shortest
    draft_len: int = 10              # ngram: the longest chain copied (transformers' prompt_lookup_num_tokens)
    max_consecutive_failures: int = 8  # sequences failing in a row (none committing) = a broken engine
    compile: bool | str = "auto"     # the model runner's forwards: "auto" | True | False (eager)
    page_size: int = 16              # KV cache rows per page
    kv_cache_tokens: int | None = None  # KV capacity in tokens; None = max_batch_size full-length sequences
    enable_prefix_caching: bool = True  # reuse cached pages of equal prompt prefixes
    max_num_batched_tokens: int | None = None  # prompt rows prefilled per step (padding included); None = DEFAULT_...
    threads: int | None = None       # the most compute threads; None = FLASHTREE_THREADS, else one per core (cpu.py)
    prefill_stall: float | None = DEFAULT_PREFILL_STALL  # while others decode, a step's prefill takes at most
                                     # this many of their rounds (prefill_pacing.py); None = the row budget only

    grammar_drafts: bool = True      # structured output: drafts pruned, over-drafted, forced (False: masks only)

    def __post_init__(self):
        if self.method is not None and self.method not in METHODS:
            raise UserError(f"method '{self.method}' is not supported; choose one of {', '.join(METHODS)}")
        if self.max_batch_size < 1:
            raise UserError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 1 <= self.max_budget <= MAX_BUDGET:
            raise UserError(f"max_budget must be in [1, {MAX_BUDGET}], got {self.max_budget}")
        if isinstance(self.auto_max_budget, bool) or not isinstance(self.auto_max_budget, int) \
                or self.auto_max_budget < 1:
            raise UserError(f"auto_max_budget must be an integer >= 1, got {self.auto_max_budget!r}")
        if not _int_in(self.page_size, 1, MAX_PAGE_SIZE):
            raise UserError(f"page_size must be an integer in [1, {MAX_PAGE_SIZE}], got {self.page_size!r}")
        if self.kv_cache_tokens is not None and not _int_in(self.kv_cache_tokens, 1):
            raise UserError(f"kv_cache_tokens must be a positive integer (or None: room for max_batch_size "
                            f"full-length sequences), got {self.kv_cache_tokens!r}")
        if self.threads is not None and not _int_in(self.threads, 1):
            raise UserError(f"threads must be a positive integer (or None: FLASHTREE_THREADS, else one per core), "
                            f"got {self.threads!r}")
        if self.max_num_batched_tokens is not None and not _int_in(self.max_num_batched_tokens, 1):
            raise UserError(f"max_num_batched_tokens must be a positive integer (or None: "
                            f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}), got {self.max_num_batched_tokens!r}")
        if self.prefill_stall is not None and (isinstance(self.prefill_stall, bool) or
                                               not isinstance(self.prefill_stall, (int, float)) or
                                               not self.prefill_stall > 0):
            raise UserError(f"prefill_stall must be a number > 0 (a prefill beside decoding streams takes at most "
                            f"that many of their rounds) or None (no pacing), got {self.prefill_stall!r}")


def default(option: str):
    """EngineConfig's default for `option`: the one list of defaults `LLM`, the CLI and the
    server read."""
    f = next(f for f in fields(EngineConfig) if f.name == option)
    assert f.default is not MISSING, option
    return f.default


KV_MEMORY_SHARE = 0.5  # the default pool is at most this share of the memory available at load


def kv_cache_plan(config: EngineConfig, max_model_len: int, drafter_block_size: int, bytes_per_token: int = 0,
                  available_bytes: int | None = None) -> tuple[int, int]:
    """(the most cache rows one sequence may need, the KV capacity in tokens) for these options:
    a sequence at the context limit plus one round's largest tree; by default room for
    max_batch_size such sequences, but no more than KV_MEMORY_SHARE of `available_bytes` holds at
    `bytes_per_token` (and never less than one such sequence). kv_cache_tokens sets it outright."""
    slack = max(config.max_budget, drafter_block_size, config.draft_len) + 1
    capacity = max_model_len + slack
    if config.kv_cache_tokens:
        return capacity, config.kv_cache_tokens
    tokens = config.max_batch_size * capacity
    if bytes_per_token > 0 and available_bytes is not None:
        tokens = min(tokens, max(capacity, int(KV_MEMORY_SHARE * available_bytes) // bytes_per_token))
    return capacity, tokens


def kv_bytes_per_token(itemsize: int, layers: int, kv_heads: int, head_dim: int, draft_layers: int = 0,
                       draft_kv_heads: int = 0, draft_head_dim: int = 0, feature_width: int = 0) -> int:
    """One cache row's bytes: the target's K and V, the drafter's context K and V, and the target
    features kept for the drafter on the same row."""
    return itemsize * (2 * layers * kv_heads * head_dim + 2 * draft_layers * draft_kv_heads * draft_head_dim
                       + feature_width)


def available_memory(device) -> int | None:
    """Bytes the OS could give this process now (MemAvailable; free memory on a CUDA device), or None."""
    if device.type == "cuda":
        import torch
        return torch.cuda.mem_get_info(device)[0]
    try:
        line = next(ln for ln in open("/proc/meminfo") if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def _int_in(x, lo: int, hi: int | None = None) -> bool:
    return not isinstance(x, bool) and isinstance(x, int) and lo <= x and (hi is None or x <= hi)
