"""Per-request sampling parameters, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0   # 0 = greedy (argmax); top_k/top_p/min_p are then irrelevant
    top_p: float = 1.0         # nucleus mass kept, in (0, 1]
    top_k: int = 0             # 0 = off
    min_p: float = 0.0         # keep tokens with p >= min_p * max p; in [0, 1)
    max_tokens: int = 128
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"SamplingParams.{name} {why} (got {getattr(self, name)!r})")

        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                bad(name, "must be a number")
        for name in ("top_k", "max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(name, "must be an integer")
        if not self.temperature >= 0:
            bad("temperature", "must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 disables top-k)")
        if not 0 <= self.min_p < 1:
            bad("min_p", "must be in [0, 1)")
        if self.max_tokens < 1:
            bad("max_tokens", "must be >= 1")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            bad("seed", "must be an integer or None")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not all(isinstance(s, str) and s for s in self.stop):
                bad("stop", "must be a non-empty string or a list of non-empty strings")
        if self.stop_token_ids is not None:
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
                bad("stop_token_ids", "must be a list of non-negative token ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
