"""The engine loop: one background thread owns the (not thread-safe) Engine and drives `step()`.

HTTP handlers never touch the engine. They hand requests and aborts to the loop thread through
a thread-safe inbox (`submit`, `abort`) and receive `Update`s on their own asyncio queue
(`Channel`), posted with `loop.call_soon_threadsafe`. Between rounds the loop drains the inbox,
so requests join and leave the running batch at round boundaries (continuous batching) and an
aborted request's KV slot is freed before the next round. The loop also records metrics — the
engine-wide ones as differences of the engine's counters (`engine.stats`), the per-request-round
histograms from each request's `RequestMetrics` — logs one line per finished request and, every
`log_interval_s` while there is work, the decode-batch line (logs.py).

`TextDelta` turns successive full texts into increments that are safe to stream. Response
formatting and HTTP live in app.py.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from ..engine.sequence import RequestMetrics, Sequence
from ..errors import QueueFullError
from ..sampling_params import SamplingParams
from .limits import ServerLimits
from .logs import DecodeBatchLog
from .metrics import ServerMetrics

log = logging.getLogger("flashtree.server")


@dataclass(slots=True, frozen=True)
class Update:
    index: int                 # choice index within its HTTP request
    text: str                  # the choice's full text so far (stop ids and stop strings applied)
    num_tokens: int            # completion tokens so far
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" | "error" | "timeout"
    metrics: RequestMetrics | None = None  # the finished request's metrics
    block_size: int = 1
    error: str | None = None   # why a choice ended early ("error", "timeout", "abort" at shutdown)
    topk: int | None = None    # the ddtree branching cap the choice ran with
    logprobs: tuple = ()       # TokenLogprobs: the new tokens' while running; every token's when finished
    prompt_logprobs: tuple = ()  # the prompt's (SamplingParams.prompt_logprobs; the first token's None): in the
                                 # first update after the prefill, and in the final one


class TextDelta:
    """Successive full texts -> the new text that is safe to send.

    While a request runs it holds back a trailing U+FFFD (an incomplete UTF-8 character that
    later tokens complete) and any tail that could be the start of a stop string (the stop may
    span the next tokens; the engine cuts the text where a stop string begins)."""
    __slots__ = ("stop", "sent")

    def __init__(self, stop: list[str] | None):
        self.stop, self.sent = stop or [], ""

    def push(self, text: str, finished: bool) -> str:
        if not text.startswith(self.sent):  # the decoder revised text already sent: wait for more
            return text[len(self.sent):] if finished else ""
        end = len(text)
        if not finished:
            end = len(text.rstrip("\ufffd"))
            end -= max((self._stop_prefix(text[:end], s) for s in self.stop), default=0)
        if end <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):end], text[:end]
        return delta

    @staticmethod
    def _stop_prefix(text: str, stop: str) -> int:
        """Length of the longest proper prefix of `stop` that `text` ends with."""
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                return k
        return 0


class Channel:
    """The updates of one HTTP request's choices, delivered into the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[Update] = asyncio.Queue()
        self.seqs: list[Sequence] = []
        self.t_arrival = time.perf_counter()

    def put(self, update: Update) -> None:  # engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, update)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass

    async def get(self) -> Update:
        return await self.queue.get()


@dataclass(slots=True, eq=False)
class _Live:
    channel: Channel
    index: int
    t_last: float
    rounds_seen: int = 0
    first: bool = True
    logprobs_seen: int = 0
    prompt_sent: bool = False   # its prompt's logprobs went out (completions' echo)


@dataclass(slots=True)
class Submission:
    prompts: list[list[int]]            # one per choice
    params: list[SamplingParams]        # one per choice
    method: str | None = None
    budget: int | str | None = None   # an int or "auto"
    block_size: int | None = None
    topk: int | None = None
    options: dict = field(default_factory=dict)  # method-specific (ngram: max_ngram, min_ngram, draft_len)
    channel: Channel | None = field(default=None, repr=False)


SHUTTING_DOWN = "the server is shutting down"
HEARTBEAT_S = 5.0  # an idle loop wakes this often (tensor parallel: to check every rank still answers)


class ShuttingDown(RuntimeError):
    """The server is draining for shutdown and admits no new requests."""


class EngineStopped(RuntimeError):
    """The loop thread has ended (broken engine or shutdown); nothing can be admitted."""


class AsyncEngine:
    def __init__(self, llm, metrics: ServerMetrics, limits: ServerLimits | None = None, on_fatal=None,
                 log_interval_s: float | None = 10.0):
        self.llm, self.engine, self.metrics = llm, llm.engine, metrics
        self.decode_log = DecodeBatchLog(log_interval_s, self.engine.method)
        self.limits = limits or ServerLimits()
        self.on_fatal = on_fatal        # called (from the loop thread) when the engine breaks for good
        self.failure: str | None = None  # why the loop stopped, if it broke
        self.draining = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._gate = threading.Lock()   # orders submit's put against the loop's close: no orphans
        self._closed = False            # set (under _gate) when the loop thread stops for good
        self._live: dict[Sequence, _Live] = {}
        self._thread = threading.Thread(target=self._run, name="flashtree-engine", daemon=True)
        metrics.kv_slots_total.set(self.engine.blocks.num_slots)
        metrics.kv_pages_total.set(self.engine.blocks.pages_total)
        self._published = self.engine.stats.snapshot()  # the engine's counters the metrics hold already

    # ------------------------------------------------------------ called from the event loop
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop; then (tensor parallel) stop the other ranks, once no forward can run."""
        if self._thread.is_alive():
            self._inbox.put(("stop",))
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.llm.close()

    def drain(self, grace_s: float) -> None:
        """Stop admitting; requests still running after grace_s end with finish_reason "abort"."""
        if self.draining:
            return
        self.draining = True
        timer = threading.Timer(grace_s, lambda: self._inbox.put(("expire",)))
        timer.daemon = True
        timer.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def kv_usage(self) -> dict:
        """The KV cache's size and use, as /health reports them (read off the loop's thread: a
        snapshot, not a lock)."""
        b = self.engine.blocks
        return {"kv_cache_tokens": b.capacity_tokens, "kv_page_size": b.page_size, "kv_pages_used": b.used,
                "kv_pages_total": b.pages_total}

    def graphs_compiling(self) -> bool:
        """Whether batch graphs still compile in a background helper (batches run eager meanwhile),
        as /health reports it."""
        return self.engine.runner.compiling()

    async def submit(self, sub: Submission) -> Channel:
        """Queue the choices of one request; raises the engine's RequestError / QueueFullError,
        or ShuttingDown."""
        if self.draining:
            raise ShuttingDown(SHUTTING_DOWN)
        sub.channel = Channel(asyncio.get_running_loop())
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._gate:
            if self._closed:
                raise EngineStopped(self.failure or "the engine loop has stopped")
            self._inbox.put(("add", sub, fut))
        try:
            await asyncio.wrap_future(fut)
        except asyncio.CancelledError:  # the loop may have added it already: take it out again
            self.abort(sub.channel)
            raise
        return sub.channel

    def abort(self, channel: Channel) -> None:
        """Stop the channel's unfinished choices (client gone); slots are freed by the loop."""
        self._inbox.put(("abort", channel))

    # ------------------------------------------------------------ the loop thread
    def _run(self) -> None:
        while True:
            for cmd in self._commands():
                if cmd[0] == "stop":
                    self._abort_all("abort", SHUTTING_DOWN)
                    self._close()
                    return
                try:
                    self._handle(cmd)
                except Exception:
                    log.exception("engine loop: command %s failed", cmd[0])
            self._expire_waiting()
            if self.engine.has_work():
                self.decode_log.begin(self.engine)
                try:
                    self._publish(self.engine.step())
                except Exception as e:  # the engine isolates request failures: this one is its own
                    self._die(e)
                    return
                self.decode_log.tick(self.engine)
            else:
                self.decode_log.idle()
                try:  # tensor parallel: a rank that died while idle stops the server now, not at the next request
                    self.engine.runner.heartbeat()
                except Exception as e:
                    self._die(e)
                    return
            self._gauges()

    def _die(self, e: Exception) -> None:
        """The engine broke for good: end every request with an error, stop, tell the owner."""
        self.failure = f"{type(e).__name__}: {e}"
        log.critical("the engine failed and cannot continue (%s); ending all requests", self.failure,
                     exc_info=e)
        self._abort_all("error", "the engine failed; the server is stopping")
        self._close()
        self._gauges()
        if self.on_fatal is not None:
            self.on_fatal()

    def _close(self) -> None:
        """Admit nothing more and refuse what is still in the inbox, so no submitter waits forever."""
        with self._gate:
            self._closed = True
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add" and cmd[2].set_running_or_notify_cancel():
                cmd[2].set_exception(EngineStopped(self.failure or "the engine loop has stopped"))

    def _expire_waiting(self) -> None:
        """Requests that waited longer than the queue timeout end with "timeout" (HTTP 503)."""
        limit = self.limits.queue_timeout_s
        if not self.engine.waiting or limit is None:
            return
        now = time.perf_counter()
        expired = []
        for seq in self.engine.waiting:  # arrival order: stop at the first that may still wait
            if now - seq.t_start <= limit:
                break
            expired.append(seq)
        for seq in expired:
            if seq in self._live:
                self.engine.abort(seq)
                self._finish(seq, "timeout", f"the request waited more than {limit:g} s for a free slot")

    def _commands(self):
        """The pending commands; waits for one only when the engine has nothing to run."""
        try:
            yield self._inbox.get(block=not self.engine.has_work(), timeout=HEARTBEAT_S)
            while True:
                yield self._inbox.get_nowait()
        except queue.Empty:
            return

    def _handle(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, sub, fut = cmd
            if fut.set_running_or_notify_cancel():  # False: the client left while queued here
                try:
                    self._add(sub)
                except Exception as e:
                    fut.set_exception(e)
                else:
                    fut.set_result(None)
        elif cmd[0] == "abort":
            for seq in cmd[1].seqs:
                if seq in self._live:
                    self.engine.abort(seq)
                    self._finish(seq, "abort")
        elif cmd[0] == "expire":  # the shutdown grace period is over
            self._abort_all("abort", SHUTTING_DOWN)

    def _add(self, sub: Submission) -> None:
        ch = sub.channel
        if self.draining:
            raise ShuttingDown(SHUTTING_DOWN)
        cap = self.limits.max_queued_tokens
        if cap is not None:
            queued = sum(_cost(s) for s in self.engine.waiting)
            new = sum(len(p) + sp.max_tokens for p, sp in zip(sub.prompts, sub.params))
            if queued and queued + new > cap:
                raise QueueFullError(f"{queued} tokens of requests are queued and this one adds {new} "
                                     f"(the queue holds {cap})")
        try:
            for prompt, params in zip(sub.prompts, sub.params):
                seq = self.engine.add_request(prompt, params, method=sub.method, budget=sub.budget,
                                              block_size=sub.block_size, topk=sub.topk, **sub.options)
                ch.seqs.append(seq)
                self._live[seq] = _Live(ch, len(ch.seqs) - 1, ch.t_arrival)
        except Exception:  # all choices or none
            for seq in ch.seqs:
                self.engine.abort(seq)
                del self._live[seq]
            ch.seqs.clear()
            raise
        self.metrics.prompt_tokens.inc(sum(len(p) for p in sub.prompts))

    def _publish(self, events) -> None:
        now = time.perf_counter()
        self._count()  # before any request finishes: its response never runs ahead of the counters
        for seq, live in self._live.items():
            taus = seq.metrics.accept_lengths[live.rounds_seen:]
            if seq.auto:  # one chosen budget per committed round, like taus
                self.metrics.record_budgets(seq.method, seq.metrics.budgets[live.rounds_seen:])
            live.rounds_seen += len(taus)
            self.metrics.record_request_rounds(seq.method, taus)
        for ev in events:
            live = self._live.get(ev.seq)
            if live is None:
                continue
            if ev.new_ids:
                self.metrics.record_tokens(live.first, len(ev.new_ids), now - live.t_last)
                live.t_last, live.first = now, False
            if ev.seq.finished:
                self._finish(ev.seq, ev.seq.finish_reason, ev.seq.error)
            else:
                lps = ()
                if ev.seq.logprobs is not None:
                    lps, live.logprobs_seen = tuple(ev.seq.logprobs[live.logprobs_seen:]), len(ev.seq.logprobs)
                prompt = ()
                if ev.seq.prompt_logprobs is not None and not live.prompt_sent:
                    prompt, live.prompt_sent = tuple(ev.seq.prompt_logprobs), True
                live.channel.put(Update(live.index, self.llm.text_of(ev.seq), len(ev.seq.output_ids), None,
                                        logprobs=lps, prompt_logprobs=prompt))

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        live = self._live.pop(seq)
        m = seq.metrics
        if not m.elapsed_s:
            m.elapsed_s = time.perf_counter() - seq.t_start
        self.metrics.requests.labels(reason).inc()
        self.metrics.e2e.observe(time.perf_counter() - live.channel.t_arrival)
        log.info("request %d finished (%s, %s): %d prompt + %d completion tokens in %.3fs, %.1f tok/s, "
                 "mean accept length %.2f over %d rounds", seq.req_id, seq.method, reason, m.prompt_tokens,
                 m.completion_tokens, m.elapsed_s, m.completion_tokens / max(m.elapsed_s, 1e-9),
                 m.mean_accept_length, m.rounds)
        text = self.llm.text_of(seq) if reason in ("stop", "length") else ""
        live.channel.put(Update(live.index, text, len(seq.output_ids), reason, m, seq.block_size, error, seq.topk,
                                tuple(seq.logprobs or ()), tuple(seq.prompt_logprobs or ())))

    def _abort_all(self, reason: str, error: str | None = None) -> None:
        for seq in list(self._live):
            try:
                self.engine.abort(seq)
            except Exception:  # a broken engine must not keep requests waiting forever
                log.exception("abort of request %d failed", seq.req_id)
            self._finish(seq, reason, error)

    def _gauges(self) -> None:
        m, e = self.metrics, self.engine
        m.queue_depth.set(len(e.waiting))
        m.running.set(len(e.running))
        m.kv_slots_used.set(e.blocks.num_slots - e.blocks.free_slots)
        m.kv_pages_used.set(e.blocks.used)
        self._count()

    def _count(self) -> None:
        """What the engine's counters (`engine.stats`) counted since the last call, onto the
        Prometheus counters; the verify forwards' mean batch onto the batch-size histogram."""
        m, stats = self.metrics, self.engine.stats
        new, self._published = stats.since(self._published), stats.snapshot()
        if new.forwards:
            m.rounds.inc(new.forwards)
            m.batch_size.observe(new.seqs_in_forwards / new.forwards)
        m.prefix_hit_tokens.inc(new.prefix_hit_tokens)
        m.preemptions.inc(new.preemptions)


def _cost(seq: Sequence) -> int:
    """The tokens a waiting sequence will put through the engine at most."""
    return len(seq.prompt_ids) + seq.params.max_tokens
