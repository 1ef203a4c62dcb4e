"""`draftwise bench --concurrency` on real backends: transformers' padded `generate` peer against
draftwise's plain greedy decoding on a tiny model, the closed loop's traces, and a short run on
the embedded model (cells written, refusals reported, resume skipping finished cells)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from draftwise.backends.transformers import TransformersBackend
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.bench.cells import BatchRefused, CellStore
from draftwise.bench.closed_loop import run_closed_loop
from draftwise.bench.main import run_bench
from draftwise.bench.methods import MethodSpec
from draftwise.bench.peers import HfExecutor
from draftwise.bench.pool import ModelPool
from draftwise.bench.runner import BenchSettings
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from tests.helpers import make_spec
from tests.integration.tiny_models import tiny_backend

PROMPTS = [("a", [1, 2, 3, 1, 2]), ("b", [4, 5, 4, 5, 4, 5, 6]), ("c", [7, 1, 7]), ("d", [2, 3, 2, 3, 2, 3, 2, 3, 1]),
           ("e", [6, 5])]
GREEDY = GenerationConfig(max_new_tokens=10)


@pytest.fixture(scope="module")
def tiny():
    """A tiny Llama whose EOS (token 0) is in its vocabulary, so some requests end early and a
    padded wave must cut them at their own EOS."""
    base = tiny_backend(5)
    return TransformersBackend(base.model, base.tokenizer, replace(base.info, eos_token_ids=frozenset({0})))


@pytest.fixture(scope="module")
def alone(tiny):
    engine = build_decoder(make_spec(GREEDY, proposer="none"), tiny)
    return {q: engine.generate(p).tokens for q, p in PROMPTS}


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_padded_generate_matches_plain_greedy(tiny, alone, batch):
    peer = HfExecutor(MethodSpec("hf-plain", "hf-plain", "transformers", "tiny"), tiny, None, GREEDY)
    run = peer.run_batch(PROMPTS, batch)
    assert {r.question_id: r.tokens for r in run.requests} == alone
    assert any(len(t) < GREEDY.max_new_tokens for t in alone.values())  # some rows were cut at their EOS
    for request in run.requests:
        assert sum(request.chunk_tokens) == len(request.tokens) and set(request.chunk_tokens) == {1}
    # static batching: a lane's next request is sent when its previous one ended, and waits for its wave
    waves = [run.requests[i:i + batch] for i in range(0, len(PROMPTS), batch)]
    for earlier, later in zip(waves, waves[1:]):
        for before, after in zip(earlier, later):
            assert after.sent == before.chunk_offsets[-1] and after.chunk_offsets[0] > max(
                r.chunk_offsets[-1] for r in earlier)


def test_assisted_peers_refuse_batches(tiny):
    peer = HfExecutor(MethodSpec("pl", "hf-prompt-lookup", "transformers", "tiny"), tiny, None, GREEDY)
    with pytest.raises(BatchRefused, match="one sequence at a time"):
        peer.run_batch(PROMPTS, 2)


def test_closed_loop_keeps_b_in_flight_and_each_answer_alone(tiny, alone):
    engine = batch_decoder(make_spec(GREEDY, proposer="prompt-lookup", lookup=3, guard="false"),
                           TransformersBatch.from_backend(tiny, 2))
    lookup_alone = {q: build_decoder(make_spec(GREEDY, proposer="prompt-lookup", lookup=3, guard="false"), tiny)
                    .generate(p).tokens for q, p in PROMPTS}
    run = run_closed_loop(engine, PROMPTS, 2, GREEDY)
    assert [r.question_id for r in run.requests] == [q for q, _ in PROMPTS]
    assert {r.question_id: r.tokens for r in run.requests} == lookup_alone
    assert max(len(r.requests) for r in engine.forwards) == 2 and run.forwards == len(engine.forwards)
    ends = sorted(r.chunk_offsets[-1] for r in run.requests)
    for request in run.requests:
        assert sum(request.chunk_tokens) == len(request.tokens)
        assert request.sent < request.chunk_offsets[0] <= request.chunk_offsets[-1] <= run.wall_time
        # never more than two in flight: at its send at most one other request is still running
        assert sum(o.sent <= request.sent < o.chunk_offsets[-1] for o in run.requests if o is not request) <= 1
    assert sorted(r.sent for r in run.requests)[2:] == pytest.approx(ends[:3], abs=0.05)  # sent as lanes free up
    assert run.kv_peak_bytes >= run.kv_rows_peak_bytes > 0 and run.rss_peak_bytes > 0
    assert 0 < run.forward_seconds < run.wall_time


@pytest.mark.model
def test_embedded_model_cells_refusals_and_resume(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a Python function that adds two numbers.\nList three colours.\n")
    settings = BenchSettings(workloads=(f"prompts:{prompts}",),
                             methods=("plain=dw:proposer=none,backend=transformers",
                                      "lookup=dw:proposer=prompt-lookup,backend=transformers,guard=false",
                                      "hf-plain", "hf-prompt-lookup",
                                      "skip=dw:proposer=layer-skip,skip=every-other,backend=transformers"),
                             target="smollm2-135m", max_new_tokens=6, threads=1, warmup_tokens=2, concurrency=(1, 2))
    pool = ModelPool(threads=1, seed=0)
    out = tmp_path / "run"
    summary = run_bench(settings, out, show_progress=False, pool=pool)
    table = summary["concurrency"]["methods"]
    assert summary["concurrency"]["levels"] == [1, 2]
    for name in ("plain", "lookup", "skip"):  # a self-drafter drafts per request on a pass of its own
        for batch in ("1", "2"):
            row = table[name][batch]
            assert row["repeats"] == 1 and row["requests"] == 2 and row["total_tokens_per_s"] > 0
            assert (row["exact_vs_single"]["compared"], row["exact_vs_single"]["mismatches"]) == (2, 0)
            assert row["exact_vs_plain"]["mismatches"] == 0
            assert row["itl_p50_ms"] > 0 and row["ttft_p50_ms"] > 0 and row["kv_peak_bytes"] > 0
    assert table["plain"]["2"]["vs_reference"] == 1.0 and table["hf-plain"]["2"]["exact_vs_plain"]["compared"] == 2
    assert "one sequence at a time" in table["hf-prompt-lookup"]["2"]["refused"]  # the peer's reason
    assert "refused" not in table["hf-prompt-lookup"]["1"]
    report = (out / "report.md").read_text()
    assert "## Requests in flight" in report and "| hf-prompt-lookup | 2 | refused:" in report
    assert (out / "throughput_vs_batch.png").is_file() and (out / "itl_cdf.png").is_file()

    store = CellStore(out)
    lines = store.path.read_text().splitlines()
    assert len(lines) == 5 * 2  # five methods at two B (hf-prompt-lookup's B = 2: its refusal)
    dropped = json.loads(lines[1])
    store.path.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # as if that cell had not finished
    run_bench(settings, out, resume=True, show_progress=False, pool=pool)
    after = [json.loads(line) for line in store.path.read_text().splitlines()]
    assert len(after) == len(lines) and [(c["method"], c["batch"]) for c in after[len(lines) - 1:]] == [
        (dropped["method"], dropped["batch"])]  # only the missing cell ran again
