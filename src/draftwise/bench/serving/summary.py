"""One summary row per (server, load) from results.json's cells: the median over repeats of each
cell's figures (min and max of output tok/s beside it), failures summed, and exactness: the
prompts whose text differs from the reference server's (draftwise-none: plain decoding, the same
engine) at the same load and repeat, and from its answer at the first load level of repeat 0 (one
request at a time, where the run starts at c=1).  Texts are compared only at temperature 0,
where they are determined."""

from __future__ import annotations

from typing import Any

import statistics
from dataclasses import dataclass

from draftwise.bench.serving.loadgen import RequestRecord
from draftwise.bench.serving.metrics import PERCENTILES, CellMetrics, cell_metrics
from draftwise.bench.serving.settings import REFERENCE_SERVER


@dataclass(frozen=True)
class Agreement:
    """Of `compared` completed requests answered by the reference too, `differ` had another text."""

    differ: int
    compared: int

    def __str__(self) -> str:
        return f"{self.differ} of {self.compared}"


@dataclass(frozen=True)
class Row:
    server: str
    mode: str
    value: float
    repeats: int
    completed: int
    failed: int
    tokens_counted: int
    output_tok_s: float  # medians over repeats from here on
    output_tok_s_min: float
    output_tok_s_max: float
    request_s: float
    ttft_ms: tuple[float | None, ...]  # p50, p90, p99
    tpot_ms: tuple[float | None, ...]
    itl_ms: tuple[float | None, ...]
    e2el_ms_p50: float | None
    same_load: Agreement | None  # None: not compared (no reference cell, or temperature > 0)
    first_load: Agreement | None
    load_avg_1m: float | None  # the machine's, as the cells ended (median over repeats)


def records(cell: dict[str, Any]) -> list[RequestRecord]:
    return [RequestRecord.from_json(r) for r in cell["requests"]]


def summarize(results: dict[str, Any]) -> list[Row]:
    settings = results["settings"]
    cells = results["cells"]
    greedy = settings["temperature"] == 0
    keys = list(dict.fromkeys((c["server"], c["mode"], c["value"]) for c in cells))
    return [_row(server, mode, value, [c for c in cells if (c["server"], c["mode"], c["value"]) == (server, mode, value)],
                 cells, greedy) for server, mode, value in keys]


def _row(server: str, mode: str, value: float, mine: list[dict[str, Any]], cells: list[dict[str, Any]], greedy: bool) -> Row:
    metrics = [cell_metrics(records(c), c["duration_s"]) for c in mine]
    rates = [m.output_throughput for m in metrics]
    same, first = _agreements(mine, cells) if greedy else (None, None)
    return Row(server=server, mode=mode, value=value, repeats=len(mine), completed=sum(m.completed for m in metrics),
               failed=sum(m.failed for m in metrics), tokens_counted=sum(m.tokens_counted for m in metrics),
               output_tok_s=statistics.median(rates), output_tok_s_min=min(rates), output_tok_s_max=max(rates),
               request_s=statistics.median(m.request_throughput for m in metrics),
               ttft_ms=_ms_percentiles(metrics, "ttft"), tpot_ms=_ms_percentiles(metrics, "tpot"),
               itl_ms=_ms_percentiles(metrics, "itl"), e2el_ms_p50=_median_ms([m.e2el.p50 for m in metrics]),
               same_load=same, first_load=first,
               load_avg_1m=_median([c.get("load_avg_1m") for c in mine]))


def _ms_percentiles(metrics: list[CellMetrics], name: str) -> tuple[float | None, ...]:
    return tuple(_median_ms([getattr(getattr(m, name), f"p{p}") for m in metrics]) for p in PERCENTILES)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _median_ms(values: list[float | None]) -> float | None:
    median = _median(values)
    return None if median is None else median * 1e3


def _texts(cell: dict[str, Any]) -> dict[int, str]:
    return {r["index"]: r["text"] for r in cell["requests"] if r["error"] is None}


def _agreements(mine: list[dict[str, Any]], cells: list[dict[str, Any]]) -> tuple[Agreement | None, Agreement | None]:
    """(against the reference at the same load and repeat, against its first-load answer)."""
    reference = [c for c in cells if c["server"] == REFERENCE_SERVER]
    if not reference:
        return None, None
    first_load = (reference[0]["mode"], reference[0]["value"])
    anchor = next((c for c in reference if (c["mode"], c["value"], c["repeat"]) == (*first_load, 0)), reference[0])
    pairs = [(cell, next((c for c in reference if (c["mode"], c["value"], c["repeat"]) ==
                          (cell["mode"], cell["value"], cell["repeat"])), None)) for cell in mine]
    return (_agreement([(cell, peer) for cell, peer in pairs if peer is not None]),
            _agreement([(cell, anchor) for cell in mine]))


def _agreement(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> Agreement | None:
    differ = compared = 0
    for cell, reference in pairs:
        theirs = _texts(reference)
        for index, text in _texts(cell).items():
            if index in theirs:
                compared += 1
                differ += text != theirs[index]
    return Agreement(differ, compared) if compared else None
