"""The concurrency cells' arithmetic and bookkeeping, on hand-built traces and fake executors:
latency percentiles, exactness counts, the cell file, resume, refusals, the report and plots."""

from __future__ import annotations

import pytest

from draftwise.bench.cells import BatchRefused, Cell, CellRun, CellStore, RequestTrace, is_done
from draftwise.bench.concurrency_metrics import cell_figures, compare_tokens, request_latency
from draftwise.bench.concurrency_report import concurrency_section
from draftwise.bench.concurrency_run import parse_concurrency, pending_cells, run_concurrency
from draftwise.bench.concurrency_summary import concurrency_summary
from draftwise.bench.methods import MethodSpec
from draftwise.bench.peers import _per_request_chunks
from draftwise.bench.runner import BenchSettings, make_plan
from draftwise.errors import InputError

# request A: sent at 0.0, chunks of 1, 3, 1, 2 tokens at 0.1, 0.3, 0.35, 0.75
A = RequestTrace("a", 0.0, (0.1, 0.3, 0.35, 0.75), (1, 3, 1, 2), (1, 2, 3, 4, 5, 6, 7))
# request B: sent at 0.5 (a lane freed), chunks at 0.9 and 1.0
B = RequestTrace("b", 0.5, (0.9, 1.0), (1, 1), (8, 9))
FAILED = RequestTrace("c", 0.0, (0.2,), (1,), (), error="ValueError: context overflow")


def run_of(*requests: RequestTrace, wall: float = 1.0) -> CellRun:
    return CellRun(wall_time=wall, requests=requests, kv_peak_bytes=100, kv_rows_peak_bytes=60, rss_peak_bytes=5)


def test_request_latency_from_chunk_timestamps():
    got = request_latency(A)
    assert got.ttft == pytest.approx(0.1)
    assert got.gaps == pytest.approx((0.2, 0.05, 0.4))  # one gap per chunk, not per token
    assert got.tpot == pytest.approx(0.65 / 6)
    assert got.tokens_per_s == pytest.approx(7 / 0.75)
    single = request_latency(RequestTrace("x", 0.2, (0.3,), (1,), (5,)))
    assert single.gaps == () and single.tpot is None and single.ttft == pytest.approx(0.1)


def test_cell_percentiles_by_linear_interpolation():
    figures = cell_figures(run_of(A, B, FAILED, wall=2.0))
    # pooled gaps sorted: 0.05, 0.1, 0.2, 0.4 -> p50 at rank 1.5, p90 at rank 2.7, p99 at rank 2.97
    assert figures.itl_p50 == pytest.approx(0.15)
    assert figures.itl_p90 == pytest.approx(0.2 + 0.7 * 0.2)
    assert figures.itl_p99 == pytest.approx(0.2 + 0.97 * 0.2)
    assert figures.ttft_p50 == pytest.approx(0.25) and figures.ttft_p90 == pytest.approx(0.1 + 0.9 * 0.3)
    assert figures.total_tokens_per_s == pytest.approx(9 / 2.0)  # the failed request's tokens are not counted
    assert figures.request_tokens_per_s == pytest.approx((7 / 0.75 + 2 / 0.5) / 2)
    assert figures.failed_requests == 1


def test_exactness_counts_every_request_and_skips_failures():
    runs = [run_of(A, B, FAILED), run_of(A, B)]
    same = compare_tokens(runs, {"a": A.tokens, "b": B.tokens, "c": (1,)})
    assert (same.compared, same.mismatches) == (4, 0)
    shorter = compare_tokens(runs, {"a": A.tokens[:5], "b": (8, 0)})
    assert (shorter.compared, shorter.mismatches) == (4, 4)
    assert shorter.examples[:2] == ("a at token 5", "b at token 1")
    assert compare_tokens(runs, {}) is None  # nothing to compare is "unchecked", never 0


def test_parse_concurrency():
    assert parse_concurrency("8,1,2,2") == (1, 2, 8)
    for bad in ("0,2", "x", ",", "-1"):
        with pytest.raises(InputError):
            parse_concurrency(bad)


def test_wave_chunks_stop_at_the_request_end():
    assert _per_request_chunks([0.1, 0.2, 0.3, 0.4], [1, 1, 1, 1], 2) == [(0.1, 1), (0.2, 1)]
    assert _per_request_chunks([0.1, 0.2], [3, 4], 5) == [(0.1, 3), (0.2, 2)]  # one sequence: chunks of k


def test_cell_store_round_trip_and_cut_line(tmp_path):
    store = CellStore(tmp_path)
    cells = [Cell("plain", 2, 0, run=run_of(A, B)), Cell("skip", 2, None, refused="no batch"),
             Cell("x", 1, 0, error="RuntimeError: boom")]
    for cell in cells:
        store.append(cell)
    with open(store.path, "a") as handle:
        handle.write('{"method": "plain", "batch": 4')  # an interrupted write
    loaded = store.load()
    assert [c.key for c in loaded] == [c.key for c in cells]
    assert loaded[0].run.requests[0] == A and loaded[0].run.kv_rows_peak_bytes == 60
    assert store.path.read_text().endswith("\n")
    assert is_done(loaded, "skip", 2, 5) and not is_done(loaded, "skip", 1, 0)  # a refusal holds for every repeat
    assert is_done(loaded, "plain", 2, 0) and not is_done(loaded, "plain", 2, 1)


class FakeExecutor:
    def __init__(self, name: str, refuse_above: int | None = None) -> None:
        self.method = MethodSpec(name, "dw", "transformers", "t")
        self.refuse_above = refuse_above
        self.calls: list[tuple[int, int]] = []  # (batch, max_new_tokens or 0)

    def chat_prompt(self, messages):
        return [len(messages[0]["content"])]

    def run_batch(self, prompts, batch, max_new_tokens=None):
        self.calls.append((batch, max_new_tokens or 0))
        if self.refuse_above is not None and batch > self.refuse_above:
            raise BatchRefused(f"{self.method.name} runs one request at a time")
        return run_of(*(RequestTrace(q, 0.0, (0.1,), (1,), (p[0],)) for q, p in prompts))


def test_resume_skips_done_cells_and_refusals_are_recorded_once(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\nthree\n")
    settings = BenchSettings(workloads=(f"prompts:{prompts}",), methods=("p=dw:proposer=none,backend=transformers",),
                             target="t", repeats=2, concurrency=(1, 2), warmup_tokens=3)
    plan = make_plan(settings)
    store = CellStore(tmp_path)
    store.append(Cell("p", 1, 0, run=run_of(A)))  # finished before an interruption
    store.append(Cell("q", 2, None, refused="q runs one request at a time"))
    executors = {"p": FakeExecutor("p"), "q": FakeExecutor("q", refuse_above=1)}
    assert pending_cells(plan, executors, store) == 2 * 2 * 2 - 1 - 2
    done: list[tuple[str, int]] = []
    run_concurrency(plan, executors, store, lambda m, b: done.append((m, b)))
    # repeat 0: B=1 q; B=2 p | repeat 1 (q first): B=1 q, p; B=2 p
    assert done == [("q", 1), ("p", 2), ("q", 1), ("p", 1), ("p", 2)]
    assert executors["p"].calls[0] == (2, 3)  # the warm-up: the largest B, warm-up tokens
    assert executors["q"].calls[:2] == [(2, 3), (1, 3)]  # refused at B=2, so warmed up at B=1
    assert (2, 0) not in executors["q"].calls  # its refusal at B=2 was on disk: never measured again
    cells = store.load()
    assert len(cells) == 7 and pending_cells(plan, executors, store) == 0
    summary = concurrency_summary(cells, ["p", "q"], (1, 2), None, {"p": "p", "q": "p"})
    assert summary["methods"]["q"]["2"] == {"refused": "q runs one request at a time", "vs_reference": None}
    assert summary["methods"]["p"]["1"]["repeats"] == 2 and summary["methods"]["q"]["1"]["vs_reference"] == pytest.approx(3 / 5)


def test_summary_report_and_plots(tmp_path):
    from draftwise.bench.plots import plot_itl_cdf, plot_throughput_vs_batch

    cells = [Cell("plain", 1, 0, run=run_of(A, B, wall=2.0)), Cell("plain", 1, 1, run=run_of(A, B, wall=1.0)),
             Cell("plain", 2, 0, run=run_of(A, B, wall=0.5)), Cell("fast", 1, 0, run=run_of(A, B, wall=0.5)),
             Cell("fast", 2, None, refused="cannot batch")]
    single = {"plain": {"a": A.tokens, "b": B.tokens}, "fast": {"a": A.tokens, "b": (8, 8)}}
    summary = concurrency_summary(cells, ["plain", "fast"], (1, 2), single, {"plain": "plain", "fast": "plain"})
    plain = summary["methods"]["plain"]["1"]
    assert plain["total_tokens_per_s"] == pytest.approx(6.75) and plain["total_tokens_per_s_min"] == 4.5
    assert plain["total_tokens_per_s_repeats"] == [4.5, 9.0]
    fast = summary["methods"]["fast"]["1"]
    assert fast["vs_reference"] == pytest.approx(18 / 6.75, rel=1e-3)
    assert fast["exact_vs_single"]["mismatches"] == 1 and fast["exact_vs_plain"]["mismatches"] == 0
    lines = "\n".join(concurrency_section({"concurrency": summary, "workload": {"questions": 2}}))
    assert "| fast | 2 | refused: cannot batch |" in lines and "fast at B=1 (b at token 1)" in lines
    assert "| plain | 1 | 6.75 (4.50-9.00) | 1.00 |" in lines
    assert plot_throughput_vs_batch({"concurrency": summary}, tmp_path / "t.png").is_file()
    assert plot_itl_cdf({"concurrency": summary}, tmp_path / "c.png").is_file()
    assert plot_itl_cdf({"concurrency": None}, tmp_path / "none.png") is None
