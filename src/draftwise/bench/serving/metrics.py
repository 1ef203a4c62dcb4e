"""Serving metrics from request records, by the conventions of vLLM's `benchmark_serving.py`
(its `calculate_metrics`), so that figures read like theirs:

- duration: from the cell's start to the end of its last request (client clock);
- request throughput = completed requests / duration; output throughput = the completed
  requests' output tokens / duration (tok/s across all requests);
- TTFT, per request: first chunk with text - send time (queueing and prompt processing included);
- E2EL, per request: last chunk with text - send time;
- TPOT, per request with more than one output token: (E2EL - TTFT) / (output tokens - 1);
- ITL: the gaps between successive chunks with text, pooled over all requests.  A chunk is
  the unit, not a token: a server that streams several tokens in one chunk (a speculative
  round's accepted tokens) shows fewer, longer gaps, which is what its client sees; TPOT is the
  per-token figure to compare across servers.
- percentiles: numpy's default (linear interpolation between closest ranks); mean and p50, p90,
  p99 of each.  Only successful requests count; failures are counted apart.  An empty set has no
  percentile (None), where vLLM writes 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from draftwise.bench.serving.loadgen import RequestRecord

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Distribution:
    """Seconds: mean and percentiles of one per-request (or per-gap) quantity."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class CellMetrics:
    completed: int
    failed: int
    duration_s: float
    output_tokens: int
    tokens_counted: int  # completed requests whose server reported no usage (counted per chunk)
    request_throughput: float  # req/s
    output_throughput: float  # tok/s
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution


def distribution(values: Sequence[float]) -> Distribution:
    if not values:
        return Distribution(0, None, None, None, None)
    p50, p90, p99 = (float(v) for v in np.percentile(np.asarray(values, dtype=float), PERCENTILES))
    return Distribution(len(values), float(np.mean(values)), p50, p90, p99)


def ttft(record: RequestRecord) -> float:
    return record.chunk_times[0] - record.sent


def e2el(record: RequestRecord) -> float:
    return record.chunk_times[-1] - record.sent


def tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first; None for a one-token answer (vLLM skips those)."""
    if record.output_tokens <= 1:
        return None
    return (e2el(record) - ttft(record)) / (record.output_tokens - 1)


def itl(record: RequestRecord) -> list[float]:
    times = record.chunk_times
    return [b - a for a, b in zip(times, times[1:])]


def cell_metrics(records: Sequence[RequestRecord], duration_s: float) -> CellMetrics:
    done = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    tpots = [t for t in (tpot(r) for r in done) if t is not None]
    return CellMetrics(
        completed=len(done), failed=len(records) - len(done), duration_s=duration_s, output_tokens=tokens,
        tokens_counted=sum(r.tokens_counted for r in done),
        request_throughput=len(done) / duration_s, output_throughput=tokens / duration_s,
        ttft=distribution([ttft(r) for r in done]), tpot=distribution(tpots),
        itl=distribution([gap for r in done for gap in itl(r)]), e2el=distribution([e2el(r) for r in done]))
