"""What one HTTP request and the whole server may ask of the engine, and how long anyone waits.

Plain settings (`flashtree serve` flags); app.py and async_engine.py enforce them. Defaults are
sized so that honest clients never meet them and a hostile one cannot hold the server.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError


@dataclass(slots=True)
class ServerLimits:
    max_body_bytes: int = 4 * 2**20          # larger request bodies: 413 before parsing
    max_request_tokens: int | None = None    # n x (prompt + max_tokens) per request; None: 8 x the context
    max_queued_tokens: int | None = None     # prompt + max_tokens summed over waiting requests; None: 64 x the context
    queue_timeout_s: float | None = 120.0    # a request still waiting after this gets 503 (None: no limit)
    header_timeout_s: float = 10.0           # a connection must send its request headers within this
    body_timeout_s: float = 30.0             # ... and its body within this after the headers
    shutdown_timeout_s: float = 30.0         # SIGTERM: grace for running requests, then they end
    retry_after_s: int = 2                   # the Retry-After sent with 503s for load

    def __post_init__(self):
        for name in ("max_body_bytes", "max_request_tokens", "max_queued_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise UserError(f"{name} must be >= 1, got {v}")
        for name in ("queue_timeout_s", "header_timeout_s", "body_timeout_s", "shutdown_timeout_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise UserError(f"{name} must be > 0 seconds, got {v}")

    def resolved(self, max_model_len: int) -> ServerLimits:
        """These limits with the context-relative defaults filled in."""
        return ServerLimits(self.max_body_bytes, self.max_request_tokens or 8 * max_model_len,
                            self.max_queued_tokens or 64 * max_model_len, self.queue_timeout_s,
                            self.header_timeout_s, self.body_timeout_s, self.shutdown_timeout_s,
                            self.retry_after_s)
