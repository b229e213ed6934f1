"""A request's state while it is in the engine, and the metrics it reports."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import RequestError
from ..sampling import Uniforms
from ..sampling_params import SamplingParams

if TYPE_CHECKING:
    from ..grammar import GrammarState


def check_request(prompt_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """What a request may ask of a model of `vocab_size` tokens and `max_model_len` positions:
    a non-empty prompt of valid ids that leaves room for one token, and token-valued parameters
    within the vocabulary. Raises RequestError naming the parameter."""
    V = vocab_size
    if not prompt_ids:
        raise RequestError("the prompt is empty: at least one token is needed", "prompt")
    if any(not 0 <= t < V for t in prompt_ids):
        raise RequestError(f"prompt token ids must be in [0, {V})", "prompt")
    if len(prompt_ids) >= max_model_len:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context limit is "
                           f"{max_model_len} (prompt + at least one generated token)", "prompt")
    if params.logit_bias and max(params.logit_bias) >= V:
        raise RequestError(f"logit_bias names token {max(params.logit_bias)}; token ids are in [0, {V})", "logit_bias")
    if params.top_k > V:
        raise RequestError(f"top_k must be at most the vocabulary size {V} (0 disables top-k), got {params.top_k}",
                           "top_k")


def tau_histogram(taus, block_size: int) -> list[int]:
    """counts[t-1] = rounds that committed t tokens (bonus included), t = 1..max(block_size, the
    largest tau): the one histogram the server's usage, the bench and the trace report."""
    taus = list(taus)
    counts = [0] * max(block_size, max(taus, default=1))
    for t in taus:
        counts[t - 1] += 1
    return counts


@dataclass(slots=True)
class RequestMetrics:
    rounds: int = 0
    accept_lengths: list[int] = field(default_factory=list)  # tau per round, bonus included
    budgets: list[int] = field(default_factory=list)         # budget="auto": nodes verified per round
    predicted_taus: list[float] = field(default_factory=list)  # budget="auto": E[tau] of those nodes
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    ttft_s: float | None = None

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    def histogram(self, block_size: int) -> list[int]:
        return tau_histogram(self.accept_lengths, block_size)

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "accept_lengths": list(self.accept_lengths),
                "mean_accept_length": self.mean_accept_length, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "elapsed_s": self.elapsed_s,
                "ttft_s": self.ttft_s, "budgets": list(self.budgets), "predicted_taus": list(self.predicted_taus)}


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """An output token's log-probability under the target's own distribution — the log-softmax of
    its logits, before temperature and the filters (what OpenAI's API reports, and vLLM's default)
    — and the `top` likeliest tokens there, most likely first: ((token, logprob), ...)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True, eq=False)
class Sequence:
    req_id: int
    prompt_ids: list[int]
    params: SamplingParams
    method: str                       # a name in speculative.proposer.METHODS
    block_size: int                   # deepest draft + 1: the drafter block length (1 for ar)
    budget: int                       # draft nodes per round (0 for ar)
    uniforms: Uniforms | None         # its draws, one per output position; None for greedy
    stop_ids: frozenset[int]
    topk: int | None = None           # most children per ddtree node (None = no cap)
    auto: bool = False                # budget="auto": each round verifies a chosen prefix of its tree
    options: dict = field(default_factory=dict)  # method-specific settings (e.g. ngram's n-gram sizes)
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1                    # its row of the page table while admitted (-1 while waiting)
    length: int = 0                   # tokens in the target KV cache (= committed - 1: bonus is not)
    prefilled: int = 0                # tokens of `cache_ids` computed (or adopted from the prefix cache)
    chunk: int = 0                    # prompt tokens this step's prefill computes (the scheduler's choice)
    decoding: bool = False            # the prefill is done: the sequence runs rounds
    finish_reason: str | None = None  # None while running; "stop" | "length" | "abort" | "error"
    error: str | None = None          # why it failed, when finish_reason == "error"
    text_end: int | None = None       # where a stop string cut the text
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    t_start: float = field(default_factory=time.perf_counter)
    emitted: int = 0                  # output tokens already reported by Engine.step
    logprobs: list[TokenLogprob] | None = None  # one per output token when params.logprobs is set
    grammar: GrammarState | None = None  # params.structured's state after output_ids
    prompt_logprobs: list[TokenLogprob | None] | None = None  # params.prompt_logprobs: per prompt token (0: None)

    @property
    def wants_prompt_rows(self) -> bool:
        """Its prefill keeps every row's logits: it asks for prompt logprobs it has not all got."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids)

    @property
    def bonus(self) -> int:
        return self.output_ids[-1]

    @property
    def cache_ids(self) -> list[int]:
        """The tokens whose K/V the target cache holds once caught up: the prompt and every output
        token but the last (the bonus, fed next round). A preempted sequence is prefilled from these."""
        return self.prompt_ids + self.output_ids[:-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def round_rows(self) -> int:
        """The most cache rows one round writes past its length: its largest tree."""
        return max(self.budget + 1, self.block_size)

    def depth_limit(self, max_model_len: int) -> int:
        """Deepest draft worth verifying: no deeper than the block, the tokens still allowed
        (a round emits depth+1 tokens), or the context limit."""
        return min(self.block_size - 1, self.room(max_model_len))

    def room(self, max_model_len: int) -> int:
        """Deepest node a round may verify: a round emits depth+1 tokens, within max_tokens and
        the context limit."""
        return min(self.params.max_tokens - len(self.output_ids) - 1,
                   max_model_len - self.length - 2)  # committed = length + 1, +depth+1 this round

    def append(self, new: list[int], max_model_len: int, decode, logprobs: list[TokenLogprob] | None = None) -> int:
        """Append committed tokens (and their `logprobs`, where the request asks for them), stopping
        at a stop id, max_tokens, the context limit (`max_model_len`) or a stop string (`decode`:
        ids -> text), or where the grammar (params.structured) is complete. Returns how many were
        appended."""
        p, before = self.params, len(self.output_ids)
        for tok in new:
            if self.grammar is not None:
                self.grammar.accept(tok)
            self.output_ids.append(tok)
            if tok in self.stop_ids or (self.grammar is not None and self.grammar.terminated):
                self.finish_reason = "stop"
                break
            if len(self.output_ids) >= p.max_tokens or len(self.prompt_ids) + len(self.output_ids) >= max_model_len:
                self.finish_reason = "length"  # max_tokens, or the context is full
                break
        if p.stop:
            text = decode(self.output_ids)
            hits = [i for i in (text.find(x) for x in p.stop) if i >= 0]
            if hits:
                self.text_end = min(hits)
                self.finish_reason = "stop"
        self.metrics.completion_tokens = len(self.output_ids)
        if self.logprobs is not None:
            self.logprobs.extend(logprobs[:len(self.output_ids) - before])
        return len(self.output_ids) - before
