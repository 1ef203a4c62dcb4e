"""The engine: requests on the slots of one backend, every round shared.

An `Engine` steps every active request one round at a time (continuous batching at round
granularity; a request alone is a one-slot batch on the same code).  Each request is a
generation coroutine (`runtime.round.RequestRounds`) on its own slot of a `SlotBackend`.  One
round is: the strategy answers every request's question (`Ask`), every request proposes (the
draft steps of requests sharing a drafter answered in one `draft_many` per step), ONE forward
verifies every request's rows (`verify_many`), and every request selects, commits its own slot
and publishes; the strategy is told what the round committed.  Requests join between rounds (up
to the backend's slots; the rest wait in order) and leave when they finish, fail or are
cancelled, their KV freed at once.  A request that fails ends with its own error; a shared
forward or draft step that fails is retried request by request, so only the request whose rows
cannot be evaluated fails.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Protocol, Sequence

import numpy as np

from draftwise.backends.base import Backend, BackendInfo
from draftwise.backends.batch import SlotView, VerifyCall, slot_view
from draftwise.errors import InputError
from draftwise.runtime.logits import TargetLogits
from draftwise.proposers.base import DraftRequest, answer_alone
from draftwise.runtime.round import (Ask, GenerationConfig, GenerationResult, Published, RequestRounds, Step,
                                     Verified, VerifyRequest)
from draftwise.runtime.strategy import RoundStrategy
from draftwise.runtime.shadow import ShadowOutcome

# (the slot a request runs on, its generation config) -> its decoder
DecoderFactory = Callable[[Backend, GenerationConfig], RequestRounds]


class Slots(Protocol):
    """What the engine needs of a backend: slots to open and close, and one forward over many."""

    info: BackendInfo

    @property
    def max_slots(self) -> int: ...

    def open(self) -> int: ...

    def close(self, slot: int) -> None: ...

    def verify_many(self, calls: Sequence[VerifyCall]) -> Sequence[TargetLogits]: ...


@dataclass(frozen=True)
class Tokens:
    """Tokens a request published this round (never empty)."""

    request: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    request: int
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    """A request that ended with an error (`cancelled`: by `cancel`), its slot freed."""

    request: int
    error: BaseException
    cancelled: bool = False


Event = Tokens | Finished | Failed


@dataclass(frozen=True)
class SharedForward:
    """One shared verify forward: who took part, how many rows each, and how long it took."""

    requests: tuple[int, ...]
    rows: tuple[int, ...]  # per request: unread + pending + candidates
    seconds: float
    retried: bool = False  # the shared forward failed and each request was verified alone
    drafting: float = 0.0  # seconds the round's draft steps took, before the forward
    draft_calls: int = 0  # calls that answered them (one per shared drafter and step)

    @property
    def origin_request(self) -> np.ndarray:
        """[sum(rows)] request id of every row of the linearized forward."""
        return np.repeat(np.asarray(self.requests, dtype=np.int64), self.rows)


@dataclass
class _Request:
    id: int
    prompt: tuple[int, ...]
    config: GenerationConfig
    decoder: RequestRounds | None = None
    owns_decoder: bool = True  # made for this request by the factory on its slot (closed with it)
    slot: int | None = None
    view: SlotView | None = None  # the slot as the factory's decoder's backend
    run: Any = None  # its generation coroutine
    stop: Step | None = None  # where it waits: a question, a draft step or its verify
    shadows: list[ShadowOutcome] = field(default_factory=list)  # decided this round
    fresh: bool = True  # its first round (which reads its prompt) is not verified yet


@dataclass
class Engine:
    """Steps up to `target.max_slots` requests per round; `events()` runs until every request ended."""

    target: Slots  # a `BatchBackend` where decoders are made per request
    decoder_for: DecoderFactory | None = None
    default: GenerationConfig = field(default_factory=GenerationConfig)
    strategy: RoundStrategy = field(default_factory=RoundStrategy)
    forwards: list[SharedForward] = field(default_factory=list)
    _queue: deque[_Request] = field(default_factory=deque)
    _active: dict[int, _Request] = field(default_factory=dict)
    _cancelled: set[int] = field(default_factory=set)
    _next_id: int = 0

    # ---- requests ------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], config: GenerationConfig | None = None,
               decoder: RequestRounds | None = None) -> int:
        """Queue a request (token ids); it joins at the next round with a free slot.  Returns its id.
        `decoder`: run it with this one (its owner's, not closed with the request) instead of
        one made by `decoder_for` on the request's slot."""
        if not prompt:
            raise InputError("the prompt has no tokens")
        request = _Request(self._next_id, tuple(int(t) for t in prompt), config or self.default, decoder,
                           owns_decoder=decoder is None)
        self._next_id += 1
        self._queue.append(request)
        return request.id

    def cancel(self, request: int) -> None:
        """End a request at the next round boundary (its KV freed then); unknown ids are ignored."""
        self._cancelled.add(request)

    @property
    def active(self) -> tuple[int, ...]:
        return tuple(self._active)

    @property
    def queued(self) -> tuple[int, ...]:
        return tuple(r.id for r in self._queue)

    def idle(self) -> bool:
        return not self._active and not self._queue

    def events(self) -> Iterator[Event]:
        while not self.idle():
            yield from self.step()

    def generate_many(self, prompts: Sequence[Sequence[int]],
                      configs: Sequence[GenerationConfig] | None = None) -> list[GenerationResult | BaseException]:
        """Every prompt decoded (in shared rounds); each a result or the error it ended with."""
        if configs is not None and len(configs) != len(prompts):
            raise InputError(f"{len(configs)} generation configs for {len(prompts)} prompts")
        ids = [self.submit(p, None if configs is None else configs[i]) for i, p in enumerate(prompts)]
        outcome: dict[int, GenerationResult | BaseException] = {}
        for event in self.events():
            if isinstance(event, Finished):
                outcome[event.request] = event.result
            elif isinstance(event, Failed):
                outcome[event.request] = event.error
        return [outcome[i] for i in ids]

    # ---- the round -----------------------------------------------------------------------
    def step(self) -> list[Event]:
        """One round for every active request (admitting queued ones first)."""
        events: list[Event] = self._drop_cancelled()
        self._admit(events)
        for request in [r for r in self._active.values() if r.stop is None]:
            self._advance(request, None, events)  # just admitted: run it to its first stop
        if not self._active:
            return events
        start, published = time.perf_counter(), len(events)  # proposals and draft steps are part of its price
        batch = len(self._active)
        self.strategy.start(batch, reading_prompts=any(r.fresh for r in self._active.values()))
        for request in list(self._active.values()):
            if isinstance(ask := request.stop, Ask):
                self._advance(request, self.strategy.orders(ask, batch), events)
        drafting, draft_calls = self._draft(events)
        waiting = [r for r in self._active.values() if isinstance(r.stop, VerifyRequest)]
        if not waiting:
            return events
        verified, forward = self._verify(waiting)
        self.forwards.append(SharedForward(forward.requests, forward.rows, forward.seconds, forward.retried,
                                           drafting, draft_calls))
        for request, logits in verified:
            request.fresh = False
            if isinstance(logits, BaseException):
                self._throw(request, logits, events)
            else:
                self._advance(request, logits, events)
        tokens = sum(len(e.tokens) for e in events[published:] if isinstance(e, Tokens))
        shadows = [o for r in waiting for o in r.shadows]
        self.strategy.observe(batch, tokens, time.perf_counter() - start, shadows, forward.retried)
        return events

    # ---- internals -----------------------------------------------------------------------
    def _admit(self, events: list[Event]) -> None:
        while self._queue and len(self._active) < self.target.max_slots:
            request = self._queue.popleft()
            try:
                request.slot = self.target.open()
                if request.decoder is None:
                    assert self.decoder_for is not None, "an engine without a decoder factory runs given decoders"
                    request.view = slot_view(self.target, request.slot)  # type: ignore[arg-type]
                    request.decoder = self.decoder_for(request.view, request.config)
                request.run = request.decoder.coroutine(request.prompt)
            except Exception as exc:  # a refused configuration or prompt ends this request only
                self._release(request)
                events.append(Failed(request.id, exc))
                continue
            self._active[request.id] = request
            self.strategy.joined(len(self._active))

    def _draft(self, events: list[Event]) -> tuple[float, int]:
        """Answer the requests' draft steps, one call per shared drafter and step, until every
        request waits on its verify (or ended); the seconds it took and the calls it made."""
        start, calls = time.perf_counter(), 0
        while drafting := [r for r in self._active.values() if isinstance(r.stop, DraftRequest)]:
            groups: dict[Hashable, list[_Request]] = {}
            for request in drafting:
                assert isinstance(request.stop, DraftRequest)
                groups.setdefault(request.stop.key, []).append(request)
            for members in groups.values():
                calls += 1
                for request, answer in self._answer_drafts(members):
                    if isinstance(answer, BaseException):
                        self._throw(request, answer, events)
                    else:
                        self._advance(request, answer, events)
        return time.perf_counter() - start, calls

    @staticmethod
    def _answer_drafts(members: list[_Request]) -> list[tuple[_Request, Any]]:
        """One draft step of requests sharing a drafter in one call (request by request if it fails)."""
        steps = [r.stop for r in members]
        assert all(isinstance(s, DraftRequest) for s in steps)
        try:
            return list(zip(members, steps[0].drafter.draft_many([s.call for s in steps])))  # type: ignore[union-attr]
        except Exception:
            out: list[tuple[_Request, Any]] = []
            for request, step in zip(members, steps):
                try:
                    out.append((request, answer_alone(step)))  # type: ignore[arg-type]
                except Exception as exc:
                    out.append((request, exc))
            return out

    def _advance(self, request: _Request, reply: Any, events: list[Event]) -> None:
        """Run the request's coroutine to its next stop (publishing what it emits on the way)."""
        assert request.run is not None
        request.stop = None
        try:
            while True:
                step = request.run.send(reply)
                reply = None
                if not isinstance(step, Published):
                    request.stop = step
                    return
                request.shadows.extend(step.shadows)  # the strategy counts them at the round's end
                events.append(Tokens(request.id, step.tokens))
        except StopIteration as done:
            self._end(request)
            events.append(Finished(request.id, done.value))
        except Exception as exc:
            self._end(request)
            events.append(Failed(request.id, exc))

    def _throw(self, request: _Request, error: BaseException, events: list[Event]) -> None:
        """The request's verify or draft step failed: raise it inside its round (which rolls its slot back)."""
        assert request.run is not None
        request.stop = None
        try:
            request.run.throw(error)  # its round re-raises it after rolling back: nothing is resumed
        except Exception:
            pass
        else:  # the round went on regardless: stop it (its `finally` rolls back)
            request.run.close()
        self._end(request)
        events.append(Failed(request.id, error))

    def _verify(self, waiting: list[_Request]) -> tuple[list[tuple[_Request, TargetLogits | Verified | BaseException]],
                                                         SharedForward]:
        """ONE forward over every waiting request's rows (each request's alone if it fails)."""
        for request in waiting:
            request.shadows.clear()
        asks = [(r.id, r.stop) for r in waiting]
        cut = self.strategy.cuts(asks)  # type: ignore[arg-type]
        calls = []
        for r, (_, ask) in zip(waiting, asks):
            assert isinstance(ask, VerifyRequest) and r.slot is not None
            round_ = cut.get(r.id, ask.round_)
            calls.append(VerifyCall(r.slot, ask.pending, round_ if round_ is not None and round_.n else None,
                                    ask.unread))
        start = time.perf_counter()
        try:
            answers: list[TargetLogits | BaseException] = list(self.target.verify_many(calls))
            retried = False
        except Exception as exc:
            if len(calls) == 1:  # a forward of one request fails that request: no retry alone
                answers, retried = [exc], False
            else:
                answers, retried = [], True
            for call in calls if retried else ():
                try:
                    answers.append(self.target.verify_many([call])[0])
                except Exception as exc:
                    answers.append(exc)
        forward = SharedForward(tuple(r.id for r in waiting), tuple(c.rows for c in calls), time.perf_counter() - start,
                                retried)
        return [(r, Verified(cut[r.id], out) if r.id in cut and not isinstance(out, BaseException) else out)
                for r, out in zip(waiting, answers)], forward

    def _drop_cancelled(self) -> list[Event]:
        events: list[Event] = []
        for request_id in sorted(self._cancelled):
            request = self._active.pop(request_id, None)
            if request is None:
                queued = next((r for r in self._queue if r.id == request_id), None)
                if queued is None:
                    continue
                self._queue.remove(queued)
                request = queued
            elif request.run is not None:
                request.run.close()  # its round's `finally` rolls the slot back
            self._release(request)
            events.append(Failed(request.id, InputError(f"request {request.id} was cancelled"), cancelled=True))
        self._cancelled.clear()
        return events

    def _end(self, request: _Request) -> None:
        self._active.pop(request.id, None)
        self._release(request)

    def _release(self, request: _Request) -> None:
        if request.slot is not None:
            self.target.close(request.slot)  # the slot's KV is freed now
            request.slot, request.view = None, None
        if request.decoder is not None and request.owns_decoder:
            request.decoder.close()  # its proposers' slots too (a draft model's)
        request.decoder = None
        request.run = None
        request.stop = None
