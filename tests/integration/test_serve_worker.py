"""The serve engine worker on a tiny model, without HTTP: answers are each request's decode
alone, a request past its timeout (a scripted clock) is cancelled at a round boundary and
frees its slot, a refused prompt ends with its error, and a failing round ends the requests in
it with a 500 while the thread goes on serving."""

from __future__ import annotations

import itertools
import queue
from dataclasses import dataclass

import pytest

from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.runtime.engine import Engine
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.serve.config import ServeConfig
from draftwise.serve.engine_worker import Delta, Done, EngineWorker, Refused
from draftwise.serve.metrics import ServeMetrics
from draftwise.serve.schema import CompletionRequest
from tests.helpers import make_spec
from tests.integration.tiny_models import tiny_backend

PROMPTS = [(1, 2, 3, 1, 2), (4, 5, 4, 5, 4, 5, 6), (7, 1, 7, 1), (3, 3, 3)]
SPEC = make_spec(GenerationConfig(max_new_tokens=12), proposer="prompt-lookup")


@pytest.fixture(scope="module")
def tiny():
    return tiny_backend(3)


def request(prompt, max_tokens: int = 10, **changes) -> CompletionRequest:
    fields = dict(chat=False, model="tiny", prompt=tuple(prompt), messages=(), max_tokens=max_tokens, temperature=0.0,
                  top_p=1.0, top_k=0, seed=None, stop=(), stream=False, include_usage=False)
    return CompletionRequest(**{**fields, **changes})


@dataclass
class Collected:
    updates: queue.Queue

    def final(self, timeout: float = 60):
        while True:
            update = self.updates.get(timeout=timeout)
            if not isinstance(update, Delta):
                return update


def worker_on(tiny, batch: Engine | None = None, clock=None, **limits) -> EngineWorker:
    config = ServeConfig(model="tiny", max_batch=2, **limits)
    batch = batch or batch_decoder(SPEC, TransformersBatch.from_backend(tiny, 2))
    extra = {} if clock is None else {"clock": clock}
    worker = EngineWorker(batch, tiny, config, ServeMetrics(2), {"proposer": "prompt-lookup"}, **extra)
    worker.start()
    return worker


def submit(worker: EngineWorker, req: CompletionRequest) -> tuple[int, Collected]:
    sink = Collected(queue.Queue())
    return worker.submit(req, sink.updates.put), sink


def test_answers_are_each_request_decoded_alone(tiny):
    alone = [build_decoder(SPEC, tiny).generate(list(p)).tokens[:10] for p in PROMPTS]
    worker = worker_on(tiny)
    try:
        sinks = [submit(worker, request(p))[1] for p in PROMPTS]  # 4 requests through 2 slots
        finals = [s.final() for s in sinks]
        assert all(isinstance(f, Done) for f in finals)
        assert [f.answer for f in finals] == [tiny.detokenize([t for t in a if t not in tiny.info.eos_token_ids])
                                              for a in alone]
        assert [f.completion_tokens for f in finals] == [len(a) for a in alone]
        assert all(f.draftwise["proposer"] == "prompt-lookup" and f.draftwise["rounds"] >= 1 for f in finals)
    finally:
        worker.close(30)
    assert not worker.alive and (worker.active, worker.queued) == (0, 0)


def test_a_request_past_its_timeout_is_cancelled_and_frees_its_slot(tiny):
    ticks = itertools.count(0.0, 1.0)  # every reading of the clock is one second later
    worker = worker_on(tiny, clock=lambda: next(ticks), request_timeout=8)
    try:
        _, sink = submit(worker, request(PROMPTS[0], max_tokens=50))
        done = sink.final()
        assert isinstance(done, Done) and done.finish_reason == "timeout" and done.completion_tokens < 50
        assert done.draftwise["stop_reason"] == "timeout"
        worker.close(30)
        assert worker.batch.idle() and not worker.batch.target.open_slots()  # its KV freed
    finally:
        worker.close(30)


def test_a_prompt_the_model_cannot_take_is_refused_with_its_error(tiny):
    worker = worker_on(tiny)
    try:
        over = submit(worker, request([1] * 60, max_tokens=10))[1].final()  # the tiny model's context is 64
        outside = submit(worker, request([1, 99]))[1].final()
        assert isinstance(over, Refused) and over.error.code == "context_length_exceeded"
        assert isinstance(outside, Refused) and "outside the vocabulary" in outside.error.message
        assert isinstance(submit(worker, request(PROMPTS[1]))[1].final(), Done)
    finally:
        worker.close(30)


class _FailsOnce(Engine):
    """A batch whose first round raises (a bug below the server)."""

    failed: bool = False

    def step(self):
        if not self.failed:
            self.failed = True
            raise RuntimeError("planted round failure")
        return super().step()


def test_a_failing_round_ends_its_requests_with_500_and_the_worker_goes_on(tiny):
    real = batch_decoder(SPEC, TransformersBatch.from_backend(tiny, 2))
    failing = _FailsOnce(real.target, real.decoder_for, real.default)
    worker = worker_on(tiny, batch=failing)
    try:
        first = submit(worker, request(PROMPTS[0]))[1].final()
        assert isinstance(first, Refused) and first.error.status == 500 and "planted" in first.error.message
        assert isinstance(submit(worker, request(PROMPTS[2]))[1].final(), Done) and worker.alive
    finally:
        worker.close(30)
