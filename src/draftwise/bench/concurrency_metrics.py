"""Metrics of the concurrency cells: throughput, latency percentiles, memory, exactness per (method, B).

Conventions (the report and docs/bench.md repeat them):
- total tok/s = the cell's new tokens (every request) / the cell's wall time (first send to
  last token); per-request tok/s = a request's new tokens / (its last chunk - its send), the
  median over the cell's requests.
- TTFT = a request's first chunk - its send (in a closed loop a request is sent when its lane
  frees up, so waiting for a slot or a static batch's wave counts).
- ITL is counted per streamed chunk, as vLLM's benchmark_serving does: the gaps between
  consecutive chunks of one request; a round that publishes k tokens is one chunk (one gap),
  not k - 1 extra zero gaps.  TPOT = (last chunk - first chunk) / (tokens - 1) per request
  (requests of one token have none) spreads a multi-token chunk over its tokens.
- percentiles are numpy's linear interpolation (`np.percentile`, as vLLM's benchmark), over a
  cell's requests (TTFT, TPOT) or its pooled gaps (ITL); with several repeats each figure is
  the median of the repeats' figures, and total tok/s also carries the repeats' min and max.
- memory: the most KV the backend held (allocated, padding included) and the in-flight
  requests' own rows, and the process's resident memory sampled at round boundaries (every
  loaded model included), the most over the repeats.
- exactness (temperature 0): every request of every repeat compared token by token with the
  same method's single-request answer and with its backend's plain reference's single-request
  answer (the first turns of the per-question pass); a request that failed is not compared.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from draftwise.bench.cells import Cell, CellRun, RequestTrace

CDF_POINTS = 101  # quantiles kept per (method, B) to draw its ITL CDF from summary.json


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


@dataclass(frozen=True)
class RequestLatency:
    ttft: float | None  # seconds; None for a request that published nothing
    gaps: tuple[float, ...]  # between consecutive chunks
    tpot: float | None  # seconds per token after the first; None below two tokens
    tokens_per_s: float | None  # new tokens / (last chunk - send)


def request_latency(trace: RequestTrace) -> RequestLatency:
    offsets = trace.chunk_offsets
    if not offsets:
        return RequestLatency(None, (), None, None)
    tokens = sum(trace.chunk_tokens)
    gaps = tuple(float(b - a) for a, b in zip(offsets, offsets[1:]))
    tpot = (offsets[-1] - offsets[0]) / (tokens - 1) if tokens > 1 else None
    span = offsets[-1] - trace.sent
    return RequestLatency(offsets[0] - trace.sent, gaps, tpot, tokens / span if span > 0 else None)


@dataclass(frozen=True)
class CellFigures:
    """One repeat's figures (seconds and tokens/s)."""

    total_tokens_per_s: float
    request_tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    itl_p50: float | None
    itl_p90: float | None
    itl_p99: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    failed_requests: int


def cell_figures(run: CellRun) -> CellFigures:
    good = [r for r in run.requests if r.error is None]
    latencies = [request_latency(r) for r in good]
    ttft = [x.ttft for x in latencies if x.ttft is not None]
    gaps = [g for x in latencies for g in x.gaps]
    tpot = [x.tpot for x in latencies if x.tpot is not None]
    rates = [x.tokens_per_s for x in latencies if x.tokens_per_s is not None]
    tokens = sum(len(r.tokens) for r in good)
    return CellFigures(
        total_tokens_per_s=tokens / run.wall_time if run.wall_time > 0 else 0.0,
        request_tokens_per_s=statistics.median(rates) if rates else None,
        ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90),
        itl_p50=percentile(gaps, 50), itl_p90=percentile(gaps, 90), itl_p99=percentile(gaps, 99),
        tpot_p50=percentile(tpot, 50), tpot_p90=percentile(tpot, 90),
        failed_requests=len(run.requests) - len(good),
    )


@dataclass(frozen=True)
class Exactness:
    compared: int  # requests compared (every repeat's)
    mismatches: int
    examples: tuple[str, ...]  # "QUESTION_ID at token I", the first few


def compare_tokens(runs: Sequence[CellRun], expected: dict[str, tuple[int, ...]]) -> Exactness | None:
    """Each request's tokens against `expected[question_id]`; None when nothing could be compared."""
    compared = mismatches = 0
    examples: list[str] = []
    for run in runs:
        for request in run.requests:
            want = expected.get(request.question_id)
            if want is None or request.error is not None:
                continue
            compared += 1
            at = next((i for i, (a, b) in enumerate(zip(request.tokens, want)) if a != b),
                      None if len(request.tokens) == len(want) else min(len(request.tokens), len(want)))
            if at is not None:
                mismatches += 1
                if len(examples) < 5:
                    examples.append(f"{request.question_id} at token {at}")
    return Exactness(compared, mismatches, tuple(examples)) if compared else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 3)


def itl_cdf(runs: Sequence[CellRun]) -> list[float]:
    """CDF_POINTS quantiles (ms) of every gap of every repeat: enough to draw the ITL CDF."""
    gaps = [g for run in runs for r in run.requests if r.error is None for g in request_latency(r).gaps]
    if not gaps:
        return []
    return [round(float(x) * 1e3, 3) for x in np.percentile(np.asarray(gaps), np.linspace(0, 100, CDF_POINTS))]


def cell_row(cells: Sequence[Cell], single: dict[str, tuple[int, ...]] | None,
             plain: dict[str, tuple[int, ...]] | None) -> dict:
    """The (method, B) row of summary.json from its cells (every repeat, failures included):
    `single` the method's own single-request tokens and `plain` its plain reference's, by
    question (None: not compared, as at temperature > 0)."""
    runs = [c.run for c in cells if c.run is not None]
    figures = [cell_figures(run) for run in runs]
    rates = [f.total_tokens_per_s for f in figures]
    mine = None if single is None else compare_tokens(runs, single)
    theirs = None if plain is None else compare_tokens(runs, plain)
    return {
        "repeats": len(runs),
        "errors": [c.error for c in cells if c.error is not None],
        "requests": len(runs[0].requests) if runs else 0,
        "failed_requests": sum(f.failed_requests for f in figures),
        "total_tokens_per_s": round(statistics.median(rates), 3) if rates else None,
        "total_tokens_per_s_min": round(min(rates), 3) if rates else None,
        "total_tokens_per_s_max": round(max(rates), 3) if rates else None,
        "total_tokens_per_s_repeats": [round(r, 3) for r in rates],
        "request_tokens_per_s": _round(_median([f.request_tokens_per_s for f in figures])),
        **{f"{name}_ms": _ms(_median([getattr(f, name) for f in figures]))
           for name in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "itl_p99", "tpot_p50", "tpot_p90")},
        "itl_cdf_ms": itl_cdf(runs),
        "kv_peak_bytes": max((r.kv_peak_bytes for r in runs if r.kv_peak_bytes is not None), default=None),
        "kv_rows_peak_bytes": max((r.kv_rows_peak_bytes for r in runs if r.kv_rows_peak_bytes is not None),
                                  default=None),
        "rss_peak_bytes": max((r.rss_peak_bytes for r in runs), default=None),
        "forwards": _median([r.forwards for r in runs]),
        "rows_per_forward": _round(_median([r.rows_per_forward for r in runs])),
        # the round-cost ledger: the shared forwards' share of the wall time (draftwise methods)
        "forward_share": _round(_median([None if r.forward_seconds is None else r.forward_seconds / r.wall_time
                                         for r in runs if r.wall_time > 0])),
        "exact_vs_single": None if mine is None else asdict(mine),
        "exact_vs_plain": None if theirs is None else asdict(theirs),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
