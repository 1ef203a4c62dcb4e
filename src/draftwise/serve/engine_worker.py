"""The one thread that owns the `Engine`: every forward runs here, never on the event loop.

The HTTP side hands requests over (`submit`, `cancel`, `drain`, `close`: thread-safe, they only
append to an inbox); the worker, between rounds, tokenizes them (the tokenizer is used by this
thread alone), checks them against the context window, submits them to the batch (a request
joins at the next round with a free slot; the rest wait in the batch's queue), runs one round
for every active request, and hands each request's updates to its sink: text deltas as rounds
commit them, then one final `Done` or `Refused`.  Cancels (a client gone, a timeout, the end of
the shutdown grace) take effect at the next round boundary, where the batch frees the
request's KV.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from draftwise.backends.base import Backend, check_fits
from draftwise.runtime.engine import Engine, Event, Finished, Tokens
from draftwise.runtime.round import GenerationConfig, GenerationResult
from draftwise.errors import BackendError, DraftwiseError
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.serve.config import ServeConfig
from draftwise.serve.errors import ApiError, bad_request
from draftwise.serve.metrics import ServeMetrics
from draftwise.serve.schema import CompletionRequest
from draftwise.serve.stops import StopText
from draftwise.runtime.text_stream import TextPieces

log = logging.getLogger("draftwise.serve")

# draftwise's stop reasons as OpenAI's finish reasons
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length"}


@dataclass(frozen=True)
class Delta:
    """Text the request's answer grew by (never empty), and the tokens that made it."""

    text: str
    tokens: int


@dataclass(frozen=True)
class Done:
    """The request ended: `finish_reason` stop | length (the engine's), timeout | shutdown |
    cancelled (cut short), or error (failed after some text was given)."""

    finish_reason: str
    text: str  # the answer's last piece (what no Delta gave)
    answer: str  # the whole answer, stop string left out
    prompt_tokens: int
    completion_tokens: int
    draftwise: Mapping[str, Any]  # the speculation statistics (the `draftwise` field of a response)
    error: str | None = None


@dataclass(frozen=True)
class Refused:
    """The request ended before any text: refused (a prompt the model cannot take) or failed."""

    error: ApiError


Update = Delta | Done | Refused
Sink = Callable[[Update], None]  # called on the worker thread; hands the update to the request's own loop


@dataclass
class _Job:
    key: int
    request: CompletionRequest
    sink: Sink
    arrived: float
    deadline: float
    seed: int
    prompt_tokens: int
    pieces: TextPieces
    stops: StopText
    engine_id: int = -1
    tokens: int = 0
    first_token: float | None = None
    cancel_reason: str | None = None


@dataclass(frozen=True)
class _Submit:
    key: int
    request: CompletionRequest
    sink: Sink
    arrived: float


@dataclass(frozen=True)
class _Cancel:
    key: int
    reason: str


@dataclass(frozen=True)
class _Drain:
    until: float


@dataclass
class EngineWorker:
    batch: Engine
    target: Backend  # the tokenizer and chat template (the batch's slots share its model)
    config: ServeConfig
    metrics: ServeMetrics
    identity: Mapping[str, Any] = field(default_factory=dict)  # proposer, backend, ...: said in every response
    clock: Callable[[], float] = time.monotonic
    # read by the event loop (ints: a torn read is impossible)
    active: int = 0
    queued: int = 0
    _wake: threading.Condition = field(default_factory=threading.Condition)
    _inbox: list[_Submit | _Cancel | _Drain] = field(default_factory=list)
    _closing: bool = False
    _keys: itertools.count[int] = field(default_factory=itertools.count)
    _jobs: dict[int, _Job] = field(default_factory=dict)  # engine id -> job (worker thread only)
    _by_key: dict[int, _Job] = field(default_factory=dict)
    _drain_until: float | None = None
    _thread: threading.Thread | None = None

    # ---- the event loop's side --------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="draftwise-engine", daemon=True)
        self._thread.start()

    def submit(self, request: CompletionRequest, sink: Sink) -> int:
        """Hand a request over; returns its key (for `cancel`).  Its updates go to `sink`."""
        key = next(self._keys)
        self._post(_Submit(key, request, sink, self.clock()))
        return key

    def cancel(self, key: int, reason: str = "cancelled") -> None:
        self._post(_Cancel(key, reason))

    def drain(self, grace_seconds: float) -> None:
        """Shutdown: what is in flight may finish within `grace_seconds`, then is cancelled."""
        self._post(_Drain(self.clock() + grace_seconds))

    def close(self, timeout: float | None = None) -> None:
        """Cancel whatever is left and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _post(self, command: _Submit | _Cancel | _Drain) -> None:
        with self._wake:
            self._inbox.append(command)
            self.queued += isinstance(command, _Submit)
            self._wake.notify()

    # ---- the worker thread ------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            try:
                if self._iterate():
                    return
            except Exception as exc:  # the thread must outlive any bug, or every later request would hang
                self._fail_all(exc)

    def _iterate(self) -> bool:
        """Take the inbox, then run one round if there is work; True once closed and idle."""
        with self._wake:
            while not self._inbox and self.batch.idle() and not self._closing:
                self._wake.wait()
            commands, self._inbox = self._inbox, []
            closing = self._closing
        for command in commands:
            self._apply(command)
        self._expire(closing)
        if not self.batch.idle():
            self._step()
        self._count()
        return closing and self.batch.idle()

    def _fail_all(self, exc: BaseException) -> None:
        """A bug below the server: end every request with it (a 500), rather than leave them waiting."""
        log.error("the engine failed", exc_info=exc)
        for job in list(self._jobs.values()):
            self._cancel(job, "error")
            self._end(job)
            self._refuse(job.sink, job.request, ApiError(500, f"the engine failed: {exc!r}", "engine_error"))

    def _count(self) -> None:
        with self._wake:  # submits still in the inbox count as queued
            pending = sum(isinstance(c, _Submit) for c in self._inbox)
            self.active, self.queued = len(self.batch.active), len(self.batch.queued) + pending

    def _apply(self, command: _Submit | _Cancel | _Drain) -> None:
        if isinstance(command, _Drain):
            self._drain_until = command.until
        elif isinstance(command, _Cancel):
            job = self._by_key.get(command.key)
            if job is not None:
                self._cancel(job, command.reason)
        else:
            self._admit(command)

    def _admit(self, submit: _Submit) -> None:
        request = submit.request
        try:
            if self._drain_until is not None or self._closing:
                raise ApiError(503, "the server is shutting down", "shutting_down")
            ids = self._prompt_ids(request)
            max_tokens = self._max_tokens(request, len(ids))
            seed = secrets.randbits(63) if request.seed is None else request.seed
            policy = SamplingPolicy(temperature=request.temperature, top_k=request.top_k, top_p=request.top_p)
            config = GenerationConfig(max_new_tokens=max_tokens, policy=policy, seed=seed, stop_strings=request.stop)
        except ApiError as exc:
            self._refuse(submit.sink, request, exc)
            return
        except DraftwiseError as exc:
            self._refuse(submit.sink, request, bad_request(str(exc), "invalid_request"))
            return
        except Exception as exc:  # a tokenizer's own failure: this request's alone
            log.exception("a request could not be prepared")
            self._refuse(submit.sink, request, ApiError(500, f"the request could not be prepared: {exc!r}",
                                                        "engine_error"))
            return
        job = _Job(submit.key, request, submit.sink, submit.arrived, submit.arrived + self.config.request_timeout,
                   seed, len(ids), TextPieces(self.target.detokenize, self.target.info.eos_token_ids),
                   StopText(request.stop))
        job.engine_id = self.batch.submit(ids, config)
        self._jobs[job.engine_id] = job
        self._by_key[job.key] = job

    def _prompt_ids(self, request: CompletionRequest) -> list[int]:
        if request.chat:
            try:
                return self.target.chat_prompt([{"role": m.role, "content": m.content} for m in request.messages])
            except DraftwiseError:
                raise
            except Exception as exc:  # the template's own refusal (roles that must alternate, ...)
                raise bad_request(f"the model's chat template refused these messages: {exc}", "invalid_messages",
                                  "messages") from None
        if isinstance(request.prompt, str):
            return self.target.tokenize(request.prompt)
        assert request.prompt is not None
        vocab = self.target.info.vocab_size
        bad = next((t for t in request.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"prompt token id {bad} is outside the vocabulary [0, {vocab})", "invalid_value", "prompt")
        return list(request.prompt)

    def _max_tokens(self, request: CompletionRequest, prompt_tokens: int) -> int:
        """The request's max_tokens (the server's default, within the context, when it names none)."""
        info = self.target.info
        wanted = request.max_tokens
        if wanted is None:  # a default never overflows the context: it shrinks to what is left
            wanted = max(1, min(self.config.default_max_tokens, info.context_length - prompt_tokens))
        try:
            check_fits(info, prompt_tokens, wanted)
        except BackendError as exc:
            raise bad_request(str(exc), "context_length_exceeded", "messages" if request.chat else "prompt") from None
        return wanted

    def _cancel(self, job: _Job, reason: str) -> None:
        if job.cancel_reason is None:
            job.cancel_reason = reason
            self.batch.cancel(job.engine_id)

    def _expire(self, closing: bool) -> None:
        now = self.clock()
        over = closing or (self._drain_until is not None and now >= self._drain_until)
        for job in list(self._jobs.values()):
            if over:
                self._cancel(job, "shutdown")
            elif now >= job.deadline:
                self._cancel(job, "timeout")

    def _step(self) -> None:
        try:
            events = self.batch.step()
        except Exception as exc:
            self._fail_all(exc)
            time.sleep(0.05)  # a round that keeps failing must not spin the thread
            return
        # the batch keeps a record of every shared forward; a server would grow it without end
        self.metrics.forwards([len(r.requests) for r in self.batch.forwards])
        self.batch.forwards.clear()
        for event in events:
            self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        job = self._jobs.get(event.request)
        if job is None:
            return
        if isinstance(event, Tokens):
            if job.first_token is None:
                job.first_token = self.clock()
                self.metrics.first_token(job.first_token - job.arrived)
            job.tokens += len(event.tokens)
            shown = job.stops.feed(job.pieces.feed(event.tokens))
            if shown:
                job.sink(Delta(shown, len(event.tokens)))
            return
        self._end(job)
        if isinstance(event, Finished):
            self._done(job, FINISH_REASONS[event.result.stop_reason], event.result.text, event.result)
        elif event.cancelled:
            self._done(job, job.cancel_reason or "cancelled", job.stops.text + job.pieces.finish(), None)
        elif job.stops.sent == 0:
            self._refuse(job.sink, job.request, _as_api_error(event.error))
        else:
            self._done(job, "error", job.stops.text, None, error=str(event.error))

    def _end(self, job: _Job) -> None:
        self._jobs.pop(job.engine_id, None)
        self._by_key.pop(job.key, None)

    def _done(self, job: _Job, reason: str, final: str, result: GenerationResult | None, error: str | None = None) -> None:
        rest = job.stops.finish(final)
        completion = len(result.tokens) if result is not None else job.tokens
        stats = self._statistics(job, result, reason)
        self.metrics.finished(_endpoint(job.request), reason, job.prompt_tokens, completion,
                              self.clock() - job.arrived, result)
        job.sink(Done(reason, rest, job.stops.text[:job.stops.sent], job.prompt_tokens, completion, stats, error))

    def _refuse(self, sink: Sink, request: CompletionRequest, error: ApiError) -> None:
        self.metrics.refused(_endpoint(request), error.status, error.code)
        sink(Refused(error))

    def _statistics(self, job: _Job, result: GenerationResult | None, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {**self.identity, "seed": job.seed}
        if result is None:
            return {**out, "stop_reason": reason, "new_tokens": job.tokens}
        s = result.stats
        return {**out, "verifier": result.verifier, "exact": result.exact, "stop_reason": result.stop_reason,
                "new_tokens": s.new_tokens, "rounds": s.rounds, "mean_accepted": round(s.mean_accepted, 4),
                "mean_emitted": round(s.mean_emitted, 4), "fallbacks": s.fallbacks, "gated_rounds": s.gated_rounds,
                "tokens_per_s": round(s.tokens_per_s, 3)}


def _endpoint(request: CompletionRequest) -> str:
    return "chat" if request.chat else "completions"


def _as_api_error(error: BaseException) -> ApiError:
    if isinstance(error, DraftwiseError):
        return bad_request(str(error), "invalid_request")
    return ApiError(500, f"the engine failed: {error!r}", "engine_error")
