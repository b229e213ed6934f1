"""Prometheus metrics of one server: requests, tokens, speculative acceptance, load and latency.

Each server owns its own registry (several servers can live in one process, e.g. in tests).
Values are pushed by the engine loop thread; this module only names, records and renders them.

Speculative counters are per request-round: a verify forward carrying B requests is one
`flashtree_spec_rounds_total` and B `flashtree_spec_request_rounds_total`, so their ratio is the
mean batch size. "Accepted" counts draft tokens only (τ − 1; the bonus token is not a draft).
"""
from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for app.py)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class ServerMetrics:
    def __init__(self, max_block_size: int = 16):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("flashtree_requests", "Finished engine requests (one per choice) by status "
                                "(stop, length, abort, error)", ["status"], registry=r)
        self.rejected = Counter("flashtree_rejected_requests", "HTTP requests refused, by status code",
                                ["code"], registry=r)
        self.prompt_tokens = Counter("flashtree_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.completion_tokens = Counter("flashtree_completion_tokens", "Generated tokens", registry=r)
        self.rounds = Counter("flashtree_spec_rounds", "Verify forwards (one round of the running batch)", registry=r)
        self.request_rounds = Counter("flashtree_spec_request_rounds", "Rounds summed over the requests they "
                                      "carried", ["method"], registry=r)
        self.accepted = Counter("flashtree_spec_accepted_tokens", "Draft tokens accepted (bonus excluded)",
                                ["method"], registry=r)
        self.accepted_by_position = Counter("flashtree_spec_accepted_by_position", "Request-rounds whose "
                                            "draft token at depth `position` was accepted", ["method", "position"],
                                            registry=r)
        self.accept_length = Histogram("flashtree_spec_accept_length", "Tokens committed per request-round "
                                       "(tau, bonus included)", ["method"],
                                       buckets=tuple(range(1, max_block_size + 1)), registry=r)
        self.budget = Histogram("flashtree_spec_budget", "Draft nodes verified per request-round of a "
                                "budget=\"auto\" request (0 = a plain step)", ["method"],
                                buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.batch_size = Histogram("flashtree_batch_size", "Requests carried by one verify forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.queue_depth = Gauge("flashtree_queue_depth", "Requests waiting for a batch slot", registry=r)
        self.running = Gauge("flashtree_running_requests", "Requests in the running batch", registry=r)
        self.kv_slots_used = Gauge("flashtree_kv_slots_used", "KV cache slots held by requests", registry=r)
        self.kv_slots_total = Gauge("flashtree_kv_slots_total", "KV cache slots", registry=r)
        self.kv_pages_total = Gauge("flashtree_kv_pages_total", "KV cache pages (page_size tokens each)", registry=r)
        self.kv_pages_used = Gauge("flashtree_kv_pages_used", "KV cache pages held by requests", registry=r)
        self.prefix_hit_tokens = Counter("flashtree_prefix_cache_hit_tokens", "Prompt tokens not computed: "
                                         "their KV pages were in the prefix cache", registry=r)
        self.preemptions = Counter("flashtree_preemptions", "Requests sent back to the queue because KV pages ran "
                                   "out (recomputed when readmitted)", registry=r)
        self.ttft = Histogram("flashtree_time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
                              registry=r)
        self.itl = Histogram("flashtree_inter_token_latency_seconds", "Time per output token after the first "
                             "(a round's delay shared by the tokens it committed)", buckets=_ITL, registry=r)
        self.e2e = Histogram("flashtree_request_latency_seconds", "Arrival to finish", buckets=_LATENCY, registry=r)

    def record_request_rounds(self, method: str, taus: list[int]) -> None:
        if not taus:
            return
        self.request_rounds.labels(method).inc(len(taus))
        self.accepted.labels(method).inc(sum(t - 1 for t in taus))
        for t in taus:
            self.accept_length.labels(method).observe(t)
            for pos in range(1, t):
                self.accepted_by_position.labels(method, str(pos)).inc()

    def record_budgets(self, method: str, budgets: list[int]) -> None:
        for n in budgets:
            self.budget.labels(method).observe(n)

    def record_tokens(self, first: bool, n: int, since_last_s: float) -> None:
        """n tokens arrived since_last_s after the previous delivery (or after arrival, if first).

        Tokens that arrive together share the delay; those riding with the first token count 0,
        so the mean inter-token latency is (latency - ttft) / (tokens - 1)."""
        self.completion_tokens.inc(n)
        if first:
            self.ttft.observe(since_last_s)
        gap = 0.0 if first else since_last_s / n
        for _ in range(n - first):
            self.itl.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)
