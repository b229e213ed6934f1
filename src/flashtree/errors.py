"""Errors a user can fix (a path, a parameter, a config): the CLI prints them as one line, exit 2.

Every such error is a ValueError subclass defined in flashtree — `UserError` here, `ConfigError`
(config.py), `RequestError` (engine) — so Python callers can keep catching ValueError. A builtin
ValueError, a TypeError or anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class UserError(ValueError):
    """Input the user can fix; the message says what and how."""


def is_user_error(e: BaseException) -> bool:
    return isinstance(e, ValueError) and type(e).__module__.split(".")[0] == "flashtree"
