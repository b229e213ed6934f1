"""Per-request sampling parameters, validated on construction against what the engine can represent.

The engine computes in float32 with int64 token counts, so values are checked *after* those casts:
a temperature that float32 would turn into 0 or a subnormal (and so into NaN probabilities or a
silent T=1 draw) is refused rather than run. Vocabulary-dependent limits (top_k <= vocab) are the
engine's, which knows the vocabulary.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .errors import UserError

MIN_TEMPERATURE = 1e-4      # 0 < temperature < this is refused: use 0 for greedy
MAX_TEMPERATURE = 1e4       # above this every token is equally likely to within float32 noise
INT64_MAX = 2**63 - 1
MAX_REPETITION_PENALTY = 10.0
MAX_LOGPROBS = 20            # most alternatives a token's logprobs list (OpenAI's top_logprobs cap)
SEED_RANGE = (-2**63, 2**64 - 1)  # what torch.Generator.manual_seed accepts


@dataclass(slots=True, frozen=True)
class StructuredOutput:
    """A constraint on a request's output, exactly one of: `json_schema` (a JSON Schema, as a dict
    or its text: the output is JSON that validates against it), `json_object` (any JSON object),
    `regex` (the output matches it whole) or `grammar` (an EBNF grammar in xgrammar's dialect, as
    GBNF: `root ::= ...`). `grammar.py` compiles it against the tokenizer; a spec the compiler
    rejects is refused when the request is added."""
    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self):
        given = [n for n in ("json_schema", "regex", "grammar") if getattr(self, n) is not None]
        given += ["json_object"] if self.json_object is True else []
        if len(given) != 1:
            raise UserError("StructuredOutput takes exactly one of json_schema, json_object=True, regex, grammar "
                            f"(got {', '.join(given) or 'none'})")
        if isinstance(self.json_schema, dict):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        for name in ("json_schema", "regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise UserError(f"StructuredOutput.{name} must be a non-empty string"
                                f"{' or a dict' if name == 'json_schema' else ''} (got {_short(v)})")

    @property
    def kind(self) -> str:
        return next(n for n in ("json_schema", "regex", "grammar") if getattr(self, n) is not None) \
            if not self.json_object else "json_object"


def _f32(x: float) -> float:
    return float(np.float32(x))


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0   # 0 = greedy (argmax); else in [MIN_TEMPERATURE, MAX_TEMPERATURE]
    top_p: float = 1.0         # nucleus mass kept, in (0, 1] (and > 0 as a float32)
    top_k: int = 0             # 0 = off; at most the vocabulary size (checked by the engine)
    min_p: float = 0.0         # keep tokens with p >= min_p * max p; in [0, 1)
    max_tokens: int = 128
    seed: int | None = None    # any integer torch.Generator.manual_seed takes: [-2^63, 2^64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k: each output token's log-probability and the k likeliest there
    prompt_logprobs: int | None = None  # None: off; k: the same for each prompt token after the first
    # logit processors (logit_processors.py), applied along each tree node's own path
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    min_tokens: int = 0          # stop ids are impossible until this many tokens are generated
    repetition_penalty: float = 1.0  # > 0: seen tokens' positive logits / r, negative ones * r
    presence_penalty: float = 0.0    # in [-2, 2]: subtracted from each generated token's logit
    frequency_penalty: float = 0.0   # in [-2, 2]: times its count, subtracted likewise
    structured: StructuredOutput | None = None  # the output follows a JSON schema, a regex or a grammar

    def __post_init__(self):
        def bad(name, why):
            raise UserError(f"SamplingParams.{name} {why} (got {_short(getattr(self, name))})")

        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                bad(name, "must be a number")
            if not math.isfinite(v):
                bad(name, "must be a finite number")
        for name in ("top_k", "max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(name, "must be an integer")
        t = self.temperature
        if t < 0 or (t != 0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):  # float32 keeps these normal
            bad("temperature", f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]")
        if not (0 < self.top_p <= 1 and _f32(self.top_p) > 0):
            bad("top_p", "must be in (0, 1] and representable as a positive float32 (>= 1e-38)")
        if not 0 <= self.top_k <= INT64_MAX:
            bad("top_k", "must be >= 0 (0 disables top-k) and at most the vocabulary size")
        if not 0 <= self.min_p < 1:
            bad("min_p", "must be in [0, 1)")
        if not 1 <= self.max_tokens <= INT64_MAX:
            bad("max_tokens", "must be >= 1")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                bad("seed", "must be an integer or None")
            if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
                bad("seed", "must be in [-2^63, 2^64)")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
                bad("stop", "must be a non-empty string or a list of non-empty strings")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            bad("logprobs", f"must be None (off) or an integer in [0, {MAX_LOGPROBS}]: the alternatives listed "
                            "beside each token's own log-probability")
        if self.prompt_logprobs is not None and (isinstance(self.prompt_logprobs, bool) or not isinstance(
                self.prompt_logprobs, int) or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            bad("prompt_logprobs", f"must be None (off) or an integer in [0, {MAX_LOGPROBS}]")
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                bad(name, "must be a finite number")
        if not 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            bad("repetition_penalty", f"must be in (0, {MAX_REPETITION_PENALTY:g}] (1 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                bad(name, "must be in [-2, 2] (0 = off)")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) \
                or not 0 <= self.min_tokens <= self.max_tokens:
            bad("min_tokens", "must be an integer in [0, max_tokens]")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX
                    and isinstance(b, (int, float)) and not isinstance(b, bool) and -100 <= b <= 100
                    for t, b in self.logit_bias.items()):
                bad("logit_bias", "must map token ids (non-negative integers) to biases in [-100, 100]")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            bad("structured", "must be a StructuredOutput (json_schema, json_object, regex or grammar) or None")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX for t in self.stop_token_ids):
                bad("stop_token_ids", "must be a list of non-negative token ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _short(v) -> str:
    """repr(v), cut so that a huge value is not echoed back whole."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
