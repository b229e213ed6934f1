"""Server logs for operators: the periodic decode-batch line and the log format (text or JSON).

`DecodeBatchLog` is fed by the engine loop thread (async_engine.py) after every step and, every
`interval_s` seconds while there is work, logs one line in a fixed, grep-friendly format:

    decode batch: running 4, waiting 0, kv used 37%, accept len 3.21, gen throughput 812.4 tok/s, method ddtree

running / waiting / kv used are the state at the moment of the line; accept len (mean tokens
committed per request-round, bonus included) and gen throughput (tokens generated per second)
are over the interval since the previous line. `journalctl -u flashtree | grep 'accept len'`
is how it is meant to be read. `--log-format json` writes every record as one JSON object per
line; this line's values are also fields of its object. No engine or HTTP code here.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter

log = logging.getLogger("flashtree.server")

LINE = ("decode batch: running {running}, waiting {waiting}, kv used {kv_used_pct:.0f}%, "
        "accept len {accept_len:.2f}, gen throughput {gen_throughput:.1f} tok/s, method {method}")


class DecodeBatchLog:
    """Interval statistics of the engine loop; `tick` logs a line once `interval_s` has passed.

    A window opens with the first step after an idle loop and is dropped when the loop goes idle
    again, so no line is ever written about an idle server."""

    def __init__(self, interval_s: float | None, default_method: str, logger: logging.Logger = log):
        self.interval_s = interval_s if interval_s and interval_s > 0 else None  # None or 0: off
        self.default_method, self.log = default_method, logger
        self.t0: float | None = None
        self._reset()

    def _reset(self) -> None:
        self.tokens = self.rounds = self.accepted = 0
        self.methods: Counter[str] = Counter()

    def begin(self, now: float) -> None:
        """Before a step: open a window if none is open."""
        if self.t0 is None:
            self.t0 = now
            self._reset()

    def idle(self) -> None:
        """The loop has nothing to run: close the window without a line."""
        self.t0 = None

    def record(self, method: str, taus: list[int]) -> None:
        """Request-rounds committed by one sequence in the latest step (tau each, bonus included)."""
        self.rounds += len(taus)
        self.accepted += sum(taus)
        if taus:
            self.methods[method] += len(taus)

    def generated(self, n: int) -> None:
        self.tokens += n

    def tick(self, engine, now: float | None = None) -> dict | None:
        """After a step: log (and return) the line's values if the interval is over."""
        now = time.perf_counter() if now is None else now
        if self.interval_s is None or self.t0 is None or now - self.t0 < self.interval_s:
            return None
        stats = self.stats(engine, now - self.t0)
        self.log.info(LINE.format(**stats), extra={"fields": {"event": "decode_batch", **stats}})
        self.t0 = now
        self._reset()
        return stats

    def stats(self, engine, seconds: float) -> dict:
        blocks = engine.blocks  # KV pages held by requests, of all
        methods = "+".join(m for m, _ in self.methods.most_common()) or self.default_method
        return {"running": len(engine.running), "waiting": len(engine.waiting),
                "kv_used_pct": 100.0 * blocks.used / blocks.pages_total,
                "accept_len": self.accepted / self.rounds if self.rounds else 0.0,
                "gen_throughput": self.tokens / max(seconds, 1e-9), "method": methods,
                "interval_s": round(seconds, 3)}


# ------------------------------------------------------------------------------------ formats
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, the record's
    `fields` (extra={"fields": {...}}) and the traceback as `exc_info` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                       + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        out.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str = "text", stream=None) -> None:
    """Root logging for `flashtree serve`: level (debug|info|warning|error) and format text|json."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
