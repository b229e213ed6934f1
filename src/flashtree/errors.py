"""Errors a user can fix (a path, a parameter, a config): the CLI prints them as one line, exit 2.

Every such error is a ValueError subclass defined in flashtree — `UserError` here, `ConfigError`
(config.py), `RequestError` — so Python callers can keep catching ValueError. A builtin
ValueError, a TypeError or anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class UserError(ValueError):
    """Input the user can fix; the message says what and how."""


class RequestError(UserError):
    """A request the engine cannot run; `param` names the offending parameter (for HTTP 400s)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QueueFullError(RuntimeError):
    """The engine's request queue is at its limit (HTTP 503: retry later)."""


class EngineFailure(RuntimeError):
    """The engine is no longer usable (not one request's fault): its owner should stop it."""


def is_user_error(e: BaseException) -> bool:
    return isinstance(e, ValueError) and type(e).__module__.split(".")[0] == "flashtree"
