"""Server logs for operators: the periodic decode-batch line and the log format (text or JSON).

`DecodeBatchLog` is driven by the engine loop thread (async_engine.py) around every step and,
every `interval_s` seconds while there is work, logs one line in a fixed, grep-friendly format:

    decode batch: running 4, waiting 0, kv used 37%, accept len 3.21, gen throughput 812.4 tok/s, method ddtree

running / waiting / kv used are the state at the moment of the line; accept len (mean tokens
committed per request-round, bonus included), gen throughput (tokens generated per second) and
method (the methods by request-rounds, most first) are over the interval since the previous line:
differences of the engine's cumulative counters (`engine.stats`, an `EngineStats`); the log keeps
no counters of its own. `journalctl -u flashtree | grep 'accept len'` is how it is meant to be read.
`--log-format json` writes every record as one JSON object per line; this line's values are also
fields of its object. The engine is read duck-typed: no engine or HTTP code is imported here.
"""
from __future__ import annotations

import json
import logging
import sys
import time

log = logging.getLogger("flashtree.server")

LINE = ("decode batch: running {running}, waiting {waiting}, kv used {kv_used_pct:.0f}%, "
        "accept len {accept_len:.2f}, gen throughput {gen_throughput:.1f} tok/s, method {method}")


class DecodeBatchLog:
    """Interval statistics of the engine loop; `tick` logs a line once `interval_s` has passed.

    A window opens with the first step after an idle loop and is dropped when the loop goes idle
    again, so no line is ever written about an idle server. The engine's counters are snapshot
    when a window opens and at each line; a line reports what they counted since."""

    def __init__(self, interval_s: float | None, default_method: str, logger: logging.Logger = log):
        self.interval_s = interval_s if interval_s and interval_s > 0 else None  # None or 0: off
        self.default_method, self.log = default_method, logger
        self.t0: float | None = None
        self.seen = None  # engine.stats when the interval began (an EngineStats snapshot)

    def begin(self, engine, now: float | None = None) -> None:
        """Before a step: open a window if none is open."""
        if self.t0 is None:
            self.t0 = time.perf_counter() if now is None else now
            self.seen = engine.stats.snapshot()

    def idle(self) -> None:
        """The loop has nothing to run: close the window without a line."""
        self.t0 = None

    def tick(self, engine, now: float | None = None) -> dict | None:
        """After a step: log (and return) the line's values if the interval is over."""
        now = time.perf_counter() if now is None else now
        if self.interval_s is None or self.t0 is None or now - self.t0 < self.interval_s:
            return None
        stats = self.stats(engine, now - self.t0)
        self.log.info(LINE.format(**stats), extra={"fields": {"event": "decode_batch", **stats}})
        self.t0, self.seen = now, engine.stats.snapshot()
        return stats

    def stats(self, engine, seconds: float) -> dict:
        """The line's values: the engine's state now, its counters over the open interval."""
        blocks = engine.blocks  # KV pages held by requests, of all
        new = engine.stats.since(self.seen)
        methods = "+".join(m for m, _ in new.rounds_by_method.most_common()) or self.default_method
        return {"running": len(engine.running), "waiting": len(engine.waiting),
                "kv_used_pct": 100.0 * blocks.used / blocks.pages_total,
                "accept_len": new.committed_tokens / new.request_rounds if new.request_rounds else 0.0,
                "gen_throughput": new.generated_tokens / max(seconds, 1e-9), "method": methods,
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
