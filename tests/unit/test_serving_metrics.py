"""Serving metrics against hand-built timestamps (vLLM's conventions), the closed and open loops
against a scripted `send`, Poisson arrivals, and the report's exactness count."""

import asyncio
import math
import time

import numpy as np
import pytest

from draftwise.bench.serving.loadgen import RequestRecord, arrival_offsets, closed_loop, open_loop
from draftwise.bench.serving.metrics import cell_metrics, distribution, itl, tpot, ttft
from draftwise.bench.serving.summary import Agreement, summarize


def record(index, sent, times, tokens=None, error=None, finish="length", text="t"):
    return RequestRecord(index, sent, tuple(times), text, tokens, finish, error)


def test_per_request_ttft_tpot_itl():
    r = record(0, 1.0, [1.5, 1.6, 1.8, 2.1], tokens=7)  # 4 chunks carrying 7 tokens
    assert ttft(r) == pytest.approx(0.5)
    assert itl(r) == pytest.approx([0.1, 0.2, 0.3])  # per chunk, not per token
    assert tpot(r) == pytest.approx((2.1 - 1.5) / 6)  # (E2EL - TTFT) / (tokens - 1)


def test_tokens_counted_per_chunk_without_usage_and_one_token_has_no_tpot():
    r = record(0, 0.0, [0.2, 0.3, 0.5])
    assert r.output_tokens == 3 and r.tokens_counted
    assert tpot(r) == pytest.approx(0.15)
    assert tpot(record(0, 0.0, [0.2], tokens=1)) is None


def test_percentiles_interpolate_linearly():
    d = distribution([4.0, 1.0, 3.0, 2.0])  # sorted 1..4: rank p/100 * 3
    assert (d.count, d.mean, d.p50, d.p90, d.p99) == (4, 2.5, 2.5, pytest.approx(3.7), pytest.approx(3.97))
    assert distribution([]) == distribution(())
    assert distribution([]).p50 is None


def test_cell_metrics_count_only_completed_requests():
    ok_a = record(0, 0.0, [1.0, 1.5, 2.0], tokens=3)
    ok_b = record(1, 0.5, [2.5, 3.5], tokens=5)
    failed = record(2, 0.0, [0.7], error="HTTP 500")
    cut = record(3, 0.0, [0.9], finish=None)  # no finish_reason: not complete, though no exception
    m = cell_metrics([ok_a, ok_b, failed, cut], duration_s=4.0)
    assert (m.completed, m.failed, m.output_tokens, m.tokens_counted) == (2, 2, 8, 0)
    assert m.request_throughput == pytest.approx(0.5) and m.output_throughput == pytest.approx(2.0)
    assert m.ttft.p50 == pytest.approx(1.5)  # 1.0 and 2.0
    assert m.tpot.mean == pytest.approx((0.5 + 0.25) / 2)  # a: 1.0 / 2, b: 1.0 / 4
    assert m.itl.count == 3 and m.itl.p50 == pytest.approx(0.5)  # 0.5, 0.5, 1.0
    assert m.e2el.p50 == pytest.approx(2.5)  # 2.0 and 3.0


def scripted_send(seconds, log):
    async def send(index, prompt):
        log.append(("start", index, time.perf_counter()))
        await asyncio.sleep(seconds[index])
        log.append(("end", index, time.perf_counter()))
        return record(index, 0.0, [seconds[index]])
    return send


def in_flight_peak(log):
    peak = now = 0
    for kind, _, _ in sorted(log, key=lambda e: (e[2], e[0] == "start")):
        now += 1 if kind == "start" else -1
        peak = max(peak, now)
    return peak


def test_closed_loop_keeps_c_in_flight_and_sends_each_prompt_once():
    log = []
    seconds = [0.05, 0.01, 0.01, 0.03, 0.01, 0.01]
    records = asyncio.run(closed_loop(scripted_send(seconds, log), ["p"] * 6, concurrency=2))
    assert sorted(r.index for r in records) == list(range(6))
    assert in_flight_peak(log) == 2
    # the worker freed by prompt 1 takes prompt 2 at once, while prompt 0 still runs
    starts = {i: t for kind, i, t in log if kind == "start"}
    ends = {i: t for kind, i, t in log if kind == "end"}
    assert starts[2] < ends[0]


def test_open_loop_sends_at_the_offsets_whatever_is_in_flight():
    log = []
    offsets = [0.0, 0.02, 0.04]
    t0 = time.perf_counter()
    asyncio.run(open_loop(scripted_send([0.2, 0.2, 0.2], log), ["p"] * 3, offsets, t0))
    starts = sorted(t - t0 for kind, _, t in log if kind == "start")
    assert starts == pytest.approx(offsets, abs=0.015)
    assert in_flight_peak(log) == 3


def test_poisson_arrivals_are_seeded_with_mean_gap_one_over_rate():
    a = arrival_offsets(2000, rate=4.0, seed=1)
    assert a == arrival_offsets(2000, rate=4.0, seed=1) and a != arrival_offsets(2000, rate=4.0, seed=2)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    gaps = np.diff(a)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.06)
    assert np.std(gaps) == pytest.approx(0.25, rel=0.08)  # exponential: sd = mean
    assert arrival_offsets(3, rate=math.inf, seed=0) == [0.0, 0.0, 0.0]


def cell(server, value, repeat, texts, mode="closed"):
    requests = [record(i, 0.0, [0.1, 0.2], tokens=2, text=t).as_json() for i, t in enumerate(texts)]
    return {"server": server, "kind": "draftwise", "args": [], "mode": mode, "value": value, "repeat": repeat,
            "duration_s": 1.0, "requests": requests}


def test_exactness_counts_texts_against_plain_at_the_same_load_and_at_the_first():
    results = {"settings": {"temperature": 0.0}, "cells": [
        cell("draftwise-none", 1, 0, ["a", "b", "c"]), cell("draftwise-none", 4, 0, ["a", "B", "c"]),
        cell("draftwise-auto", 1, 0, ["a", "b", "x"]), cell("draftwise-auto", 4, 0, ["a", "B", "c"])]}
    rows = {(r.server, r.value): r for r in summarize(results)}
    assert (rows["draftwise-auto", 1].same_load, rows["draftwise-auto", 1].first_load) == (Agreement(1, 3),
                                                                                           Agreement(1, 3))
    # at c=4 auto equals plain at c=4, but plain's own batched answer parted from its c=1 answer
    assert (rows["draftwise-auto", 4].same_load, rows["draftwise-auto", 4].first_load) == (Agreement(0, 3),
                                                                                           Agreement(1, 3))
    assert rows["draftwise-none", 4].first_load == Agreement(1, 3)
    sampled = {**results, "settings": {"temperature": 0.7}}
    assert all(r.same_load is None and r.first_load is None for r in summarize(sampled))


def test_no_reference_at_a_load_is_not_compared_there():
    failed_first = cell("llamacpp-server", 1, 0, ["a", "b"])
    failed_first["requests"][0] = record(0, 0.0, [0.1], error="HTTP 500").as_json()
    results = {"settings": {"temperature": 0.0}, "cells": [
        cell("draftwise-none", 1, 0, ["a", "b"]), cell("draftwise-auto", 8, 0, ["a", "x"]), failed_first]}
    rows = {(r.server, r.value): r for r in summarize(results)}
    assert rows["draftwise-auto", 8].same_load is None and rows["draftwise-auto", 8].first_load == Agreement(1, 2)
    assert rows["llamacpp-server", 1].same_load == Agreement(0, 1)  # the failed request is not compared


def test_record_json_round_trip():
    r = record(3, 0.25, [0.5, 0.75], tokens=4, error=None, finish="stop", text="xy")
    assert RequestRecord.from_json(r.as_json()) == r
