"""The server's Prometheus metrics, in a registry of its own (never the process-global one:
two servers in one process, or a test, keep their counts apart)."""

from __future__ import annotations

from typing import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from draftwise.runtime.round import GenerationResult

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServeMetrics:
    def __init__(self, max_batch: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("draftwise_requests", "Requests that ended, by endpoint and finish reason",
                                ["endpoint", "finish_reason"], registry=r)
        self.refusals = Counter("draftwise_refused_requests", "Requests refused with an error, by endpoint, "
                                "status and code", ["endpoint", "status", "code"], registry=r)
        self.prompt_tokens = Counter("draftwise_prompt_tokens", "Prompt tokens of requests that ended", registry=r)
        self.completion_tokens = Counter("draftwise_completion_tokens", "Tokens generated", registry=r)
        self.rounds = Counter("draftwise_rounds", "Speculative rounds of finished requests", registry=r)
        self.accepted = Counter("draftwise_accepted_tokens", "Drafted tokens accepted by the verifier", registry=r)
        self.batch_forwards = Counter("draftwise_batch_forwards", "Shared verify forwards (one per batch round)",
                                      registry=r)
        self.batch_size = Histogram("draftwise_batch_size", "Requests per shared forward",
                                    buckets=tuple(range(1, max_batch + 1)), registry=r)
        self.latency = Histogram("draftwise_request_seconds", "Arrival to the last token", buckets=_LATENCY, registry=r)
        self.ttft = Histogram("draftwise_time_to_first_token_seconds", "Arrival to the first token", buckets=_LATENCY,
                              registry=r)
        self.active = Gauge("draftwise_active_requests", "Requests decoding (holding a slot)", registry=r)
        self.queued = Gauge("draftwise_queued_requests", "Requests waiting for a slot", registry=r)

    def watch(self, active: Callable[[], int], queued: Callable[[], int]) -> None:
        """The gauges read the engine worker's counts when scraped."""
        self.active.set_function(active)
        self.queued.set_function(queued)

    def finished(self, endpoint: str, finish_reason: str, prompt_tokens: int, completion_tokens: int, seconds: float,
                 result: GenerationResult | None) -> None:
        self.requests.labels(endpoint, finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.latency.observe(seconds)
        if result is not None:
            self.rounds.inc(result.stats.rounds)
            self.accepted.inc(sum(r.accepted for r in result.records))

    def refused(self, endpoint: str, status: int, code: str) -> None:
        self.refusals.labels(endpoint, str(status), code).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def forwards(self, sizes: Sequence[int]) -> None:
        for size in sizes:
            self.batch_forwards.inc()
            self.batch_size.observe(size)

    def render(self) -> bytes:
        return generate_latest(self.registry)
