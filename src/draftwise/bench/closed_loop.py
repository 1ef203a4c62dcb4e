"""A draftwise method with B requests in flight: the closed loop over `Engine`.

B requests are sent at the start; every time one ends (finished or failed) the next prompt is
sent, and joins the batch at the next round (continuous batching at round granularity).  A
chunk is what one round published for one request (a `Tokens` event), stamped when the
round's `step()` returned: the moment a streaming client would receive it.  Memory is sampled
at every round boundary: the backend's KV (allocated, padding included), the in-flight
requests' own rows, and the process's resident memory.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from draftwise.runtime.engine import Engine, Failed, Finished, Tokens
from draftwise.bench.cells import CellRun, RequestTrace
from draftwise.bench.env import current_rss_bytes
from draftwise.runtime.round import GenerationConfig


@dataclass
class _Live:
    question_id: str
    sent: float
    offsets: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def trace(self, tokens: tuple[int, ...], error: str | None = None) -> RequestTrace:
        return RequestTrace(self.question_id, self.sent, tuple(self.offsets), tuple(self.counts), tokens, error)


def run_closed_loop(engine: Engine, prompts: Sequence[tuple[str, Sequence[int]]], batch: int,
                    config: GenerationConfig) -> CellRun:
    """Every (question_id, prompt ids) decoded with `batch` in flight on a fresh `engine`
    (one made with `batch` slots); traces in the prompts' order."""
    backlog = deque(prompts)
    live: dict[int, _Live] = {}
    done: dict[str, RequestTrace] = {}
    start = time.perf_counter()
    kv_peak = kv_rows_peak = 0
    rss_peak = current_rss_bytes()

    def send() -> None:
        question_id, prompt = backlog.popleft()
        live[engine.submit(prompt, config)] = _Live(question_id, time.perf_counter() - start)

    for _ in range(min(batch, len(backlog))):
        send()
    while not engine.idle():
        events = engine.step()
        now = time.perf_counter() - start
        target = engine.target
        kv_peak = max(kv_peak, target.kv_bytes(None))
        kv_rows_peak = max(kv_rows_peak, sum(target.kv_bytes(slot) for slot in target.open_slots()))
        rss_peak = max(rss_peak, current_rss_bytes())
        for event in events:
            request = live[event.request]
            if isinstance(event, Tokens):
                request.offsets.append(now)
                request.counts.append(len(event.tokens))
                continue
            if isinstance(event, Finished):
                done[request.question_id] = request.trace(tuple(event.result.tokens))
            elif isinstance(event, Failed):
                done[request.question_id] = request.trace((), f"{event.error.__class__.__name__}: {event.error}")
            del live[event.request]
            if backlog:  # the lane is free: the client sends its next request now
                send()
    wall = time.perf_counter() - start
    rounds = engine.forwards
    return CellRun(wall_time=wall, requests=tuple(done[q] for q, _ in prompts), kv_peak_bytes=kv_peak,
                   kv_rows_peak_bytes=kv_rows_peak, rss_peak_bytes=rss_peak, forwards=len(rounds),
                   rows_per_forward=(sum(sum(r.rows) for r in rounds) / len(rounds)) if rounds else None,
                   forward_seconds=sum(r.seconds for r in rounds))
