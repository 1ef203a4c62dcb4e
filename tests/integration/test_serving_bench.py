"""`draftwise bench serve` against real servers on 127.0.0.1: llama-cpp-python's own OpenAI
server on the embedded GGUF (its load generator end to end, then the command with --resume),
and `draftwise serve` once it exists.  Bounded: a few short prompts, 8 tokens, concurrency 2."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftwise.bench.serving.loadgen import CLOSED, OPEN, Endpoint, Load, Sampling, run_cell
from draftwise.bench.serving.metrics import cell_metrics
from draftwise.bench.serving.servers import BUILTIN, LLAMACPP, NEUTRAL_FIELDS, LaunchConfig, running
from draftwise.cli import app

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]
PROMPTS = ["def add(a, b):", "The capital of France is", "1, 2, 3, 4,", "import numpy as", "Once upon a time",
           "SELECT * FROM", "for i in range(", "Dear Sir,", "class Stack:", "The quick brown fox"]


def _draftwise_serve_exists() -> bool:
    done = subprocess.run([sys.executable, "-c", "from draftwise.cli import app; app()", "serve", "--help"],
                          capture_output=True, timeout=60)
    return done.returncode == 0


@pytest.fixture(scope="module")
def gguf():
    pytest.importorskip("llama_cpp.server", reason="llama_cpp.server is not installed (llama-cpp-python[server])")
    from draftwise.models import resolve

    return resolve("smollm2-135m").path


def test_load_generator_against_llama_cpp_server(gguf, tmp_path):
    # one thread: a 2-thread llama.cpp on cores other tests share stalls at its barriers
    config = LaunchConfig("smollm2-135m", gguf, "llamacpp", 1, 120.0, tmp_path)
    with running(BUILTIN["llamacpp-server"], config) as server:
        endpoint = Endpoint(server.base_url, server.model_id, "completions", NEUTRAL_FIELDS[LLAMACPP])
        closed = asyncio.run(run_cell(endpoint, PROMPTS, Load(CLOSED, 2), Sampling(8, 0.0, 0), 60.0))
        again = asyncio.run(run_cell(endpoint, PROMPTS[:4], Load(OPEN, 20.0), Sampling(8, 0.0, 0), 60.0))
    assert [r.index for r in closed.records] == list(range(len(PROMPTS)))
    for r in closed.records:
        assert r.ok, r.error
        assert r.finish_reason == "length" and r.output_tokens == 8 and r.text
        assert r.sent < r.chunk_times[0] and list(r.chunk_times) == sorted(r.chunk_times)
    # greedy: the same prompt gives the same text whatever the load
    assert [r.text for r in again.records] == [r.text for r in closed.records[:4]]
    m = cell_metrics(closed.records, closed.duration_s)
    assert (m.completed, m.failed, m.output_tokens) == (10, 0, 80)
    assert m.ttft.p50 > 0 and m.tpot.p50 > 0 and m.itl.count == 70 and m.output_throughput > 0
    # llama_cpp.server serves one request at a time: with two in flight, the second waits for the first
    second_waits = [r for r in closed.records if r.chunk_times[0] - r.sent > m.e2el.p50 * 0.5]
    assert second_waits


def _bench(out: Path, prompts: Path, servers: str, concurrency: str, *extra: str):
    return CliRunner().invoke(app, ["bench", "serve", "--servers", servers, "--concurrency", concurrency,
                                    "--workload", f"prompts:{prompts}", "--num-prompts", "4", "--max-tokens", "8",
                                    "--threads", "1", "--startup-timeout", "300", "--out", str(out), *extra])


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS[:4]) + "\n")  # short prompts: the prefill stays small
    return path


def test_bench_serve_command_and_resume(gguf, tmp_path, prompt_file):
    out = tmp_path / "run"
    first = _bench(out, prompt_file, "llamacpp-server", "2")
    assert first.exit_code == 0, first.output
    cells = json.loads((out / "results.json").read_text())["cells"]
    assert [(c["server"], c["value"], len(c["requests"])) for c in cells] == [("llamacpp-server", 2.0, 4)]
    assert _bench(out, prompt_file, "llamacpp-server", "2").exit_code != 0  # no silent overwrite
    resumed = _bench(out, prompt_file, "llamacpp-server", "2", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "results.json").read_text())["cells"] == cells
    assert (out / "logs" / "llamacpp-server.log").read_text().count("\n$ ") == 1  # the resume started no server
    report = (out / "report.md").read_text()
    assert "| c=2 | llamacpp-server |" in report
    for png in ("throughput_concurrency.png", "ttft_cdf.png", "itl_cdf.png"):
        assert (out / png).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["completed"], r["failed"], r["tokens_counted"]) for r in summary["rows"]] == [(4, 0, 4)]


def test_draftwise_serve_against_its_plain_self(gguf, tmp_path, prompt_file):
    if not _draftwise_serve_exists():
        pytest.skip("`draftwise serve` is not in this checkout yet")
    out = tmp_path / "run"
    result = _bench(out, prompt_file, "draftwise-none,lookup", "2",
                    "--server", "lookup=draftwise:--proposer prompt-lookup")
    assert result.exit_code == 0, result.output
    rows = {r["server"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert all(r["failed"] == 0 and r["completed"] == 4 and r["tokens_counted"] == 0 for r in rows.values())
    assert rows["lookup"]["same_load"]["compared"] == 4
