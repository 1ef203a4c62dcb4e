"""Many requests in one round: continuous batching at round granularity.

A `BatchDecoder` steps every active request one round at a time.  Each request is a
`SpeculativeDecoder` of its own (its prompt, sampling policy, seed, stop rules,
`max_new_tokens`, proposer state, gate state and statistics) running on its own slot of a
`BatchBackend`: the engine's round is a coroutine that stops where it needs the target's logits
(`engine.VerifyRequest`), so one round here is: every request proposes, ONE forward verifies
every request's rows (`BatchBackend.verify_many`; the linearized rows carry `origin_request`),
and every request selects, commits its own slot and publishes.  Requests join between rounds
(`submit`; up to the backend's slots, the rest wait in order) and leave when they finish, fail or
are cancelled, and their KV is freed at once.  A request that fails (context overflow, a
proposer's error, a refused round) ends with its own error; the others go on untouched.  A
shared forward that fails is retried request by request, so that only the request whose rows
cannot be verified fails.

Drafting in one call.  A proposer that runs a model and drafts in steps
(`proposers.base.SteppedProposer`: a draft model on a `DraftBatch`, the head families) stops its
request's coroutine at each model forward with a `DraftRequest`; before the shared verify, the
round answers the waiting steps of every request with one `draft_many` per shared drafter (the
requests' key), step after step, until every request waits on its verify.  So a chain of k is k
draft forwards per round for the whole batch, not k per request; a step that fails is retried
request by request, and fails only the request whose step cannot be answered.

The batch's depth.  A shared forward is as wide as its widest request: one request verifying 11
rows makes every request's row of the forward 11 wide (transformers pads; llama.cpp's cost grows
with the total rows).  So, with a batch profile t_B(n) and the gates' acceptance estimates, each
round's gated proposals are cut to the one depth D that maximizes
sum_i (1 + E_i[accepted | D]) / t_B(1 + max_i rows_i(D)): the committed tokens per second of the
whole batch, down to D = 0, plain batched decoding.

Do no harm.  The profile is taken on equal prefixes; the live batch pads slots of different
lengths, so its prices can be off.  With a `DoNoHarm` controller (`draftwise.batch_control`),
each round is played either as the gates and the depth cut chose it or as plain batched
decoding, by which of the two the rounds themselves measured to commit more tokens per second
at this batch size (with a bounded exploration of the other).  The arm is chosen before anyone
proposes (each request's round stops at an `engine.ArmRequest`), so a plain round pays for no
proposal and no draft forward, and a speculating round's price includes its proposals.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, Hashable, Iterator, Sequence

import numpy as np

from draftwise.backends.base import Backend
from draftwise.backends.batch import BatchBackend, SlotView, VerifyCall, slot_view
from draftwise.batch_control import Arm, DoNoHarm
from draftwise.cost_profile import BatchCostProfile
from draftwise.engine import (ArmRequest, GenerationConfig, GenerationResult, Shadowed, SpeculativeDecoder, Verified,
                              VerifyRequest)
from draftwise.gate import rows_within_depths
from draftwise.topology.compile import CompiledRound, cut_to_depth
from draftwise.errors import InputError
from draftwise.logits import TargetLogits
from draftwise.proposers.base import DraftRequest, answer_alone
from draftwise.shadow import ShadowOutcome, round_price

# (the slot a request runs on, its generation config) -> its decoder
DecoderFactory = Callable[[Backend, GenerationConfig], SpeculativeDecoder]
Coroutine = Generator["VerifyRequest | DraftRequest | ArmRequest | Shadowed | list[int]", Any, GenerationResult]


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
class BatchRound:
    """One shared forward: who took part, how many rows each, and how long it took."""

    requests: tuple[int, ...]
    rows: tuple[int, ...]  # per request: unread + pending + candidates
    seconds: float
    retried: bool = False  # the shared forward failed and each request was verified alone
    drafting: float = 0.0  # seconds the round's draft steps took, before the forward
    draft_calls: int = 0  # calls that answered them (one per shared drafter and step)

    @property
    def origin_request(self) -> np.ndarray:
        """[sum(rows)] request id of every row of the linearized batch."""
        return np.repeat(np.asarray(self.requests, dtype=np.int64), self.rows)


@dataclass
class _Request:
    id: int
    prompt: tuple[int, ...]
    config: GenerationConfig
    view: SlotView | None = None
    decoder: SpeculativeDecoder | None = None
    run: Coroutine | None = None
    waiting: VerifyRequest | None = None  # the round's verify it is stopped at
    drafting: DraftRequest | None = None  # or the draft step
    arming: bool = False  # or the question whether to speculate this round (`engine.ArmRequest`)
    shadowed: list[ShadowOutcome] = field(default_factory=list)  # this round's decided shadow proposals (`engine.Shadowed`)
    fresh: bool = True  # its first round (which reads its prompt) is not verified yet


@dataclass
class BatchDecoder:
    """Steps up to `target.max_slots` requests per round; `events()` runs until every request ended."""

    target: BatchBackend
    decoder_for: DecoderFactory
    default: GenerationConfig = field(default_factory=GenerationConfig)
    # t_B(n) of the target: with it, gated requests' rounds are cut to one depth that maximizes
    # the batch's committed tokens per second (a shared forward is as wide as its widest request)
    profile: BatchCostProfile | None = None
    # with it, each round speculates or decodes plainly by which measured more committed tokens
    # per second at this batch size (`draftwise.batch_control`)
    harm: DoNoHarm | None = None
    rounds: list[BatchRound] = field(default_factory=list)
    _queue: deque[_Request] = field(default_factory=deque)
    _active: dict[int, _Request] = field(default_factory=dict)
    _cancelled: set[int] = field(default_factory=set)
    _next_id: int = 0

    # ---- requests ------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], config: GenerationConfig | None = None) -> int:
        """Queue a request (token ids); it joins at the next round with a free slot.  Returns its id."""
        if not prompt:
            raise InputError("the prompt has no tokens")
        request = _Request(self._next_id, tuple(int(t) for t in prompt), config or self.default)
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

    def _batch_size(self) -> int:
        return max(1, len(self._active))

    def idle(self) -> bool:
        return not self._active and not self._queue

    # ---- rounds --------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """One round for every active request (admitting queued ones first)."""
        events: list[Event] = self._drop_cancelled()
        self._admit(events)
        for request in list(self._active.values()):
            if request.run is not None and not (request.waiting or request.drafting or request.arming):
                self._advance(request, None, events)  # just admitted: run it to its first stop
        published = len(events)
        for request in self._active.values():
            request.shadowed.clear()
        start = time.perf_counter()  # the round's proposals and draft steps are part of its price
        # only steady rounds are priced: a prompt read in the forward is no decoding step.  The
        # arm is chosen before anyone proposes, so a plain round drafts nothing
        steady = self.harm is not None and not any(r.fresh for r in self._active.values())
        batch = len(self._active)
        arm, explored = Arm.SPECULATE, False
        if self.harm is not None and batch:
            # a round where a request reads its prompt is not priced, but the others still play
            # the chosen arm: in a closed loop every join made one such round speculate unguarded
            arm, explored = self.harm.play(batch) if steady else (self.harm.chosen(batch), False)
        for request in [r for r in self._active.values() if r.arming]:
            request.arming = False
            self._advance(request, arm, events)
        drafted = self._draft(events)
        waiting = [r for r in self._active.values() if r.waiting is not None]
        if not waiting:
            return events
        verified = self._verify(waiting, arm)
        self.rounds[-1] = replace(self.rounds[-1], drafting=drafted[0], draft_calls=drafted[1])
        for request, logits in verified:
            request.fresh = False
            if isinstance(logits, BaseException):
                self._throw(request, logits, events)
            else:
                request.waiting = None
                self._advance(request, logits, events)
        if steady and self.harm is not None and not self.rounds[-1].retried:
            tokens = sum(len(e.tokens) for e in events[published:] if isinstance(e, Tokens))
            self._count_shadows(batch, [o for r in self._active.values() for o in r.shadowed])
            self.harm.observe(batch, arm, tokens, time.perf_counter() - start, explored)
        return events

    def _count_shadows(self, batch: int, outcomes: list[ShadowOutcome]) -> None:
        """Tell the guard what the requests' decided shadow proposals would have committed.  With
        a batch profile each is priced as a batch round in which every request verifies its rows:
        a plain batched round times t_B(1 + rows) / t_B(1), plus every request's proposal; an
        empty proposal is the plain round it would have been.  Without one, the proposals that
        had rows are priced at the arm's mean measured round (an empty one has no price to go by)."""
        assert self.harm is not None
        plain = self.harm.mean_seconds(batch, Arm.PLAIN)
        if self.profile is None or plain <= 0:
            self.harm.shadow(batch, [o.committed for o in outcomes if o.rows])
            return
        if not outcomes:
            return
        prices = [round_price(o, plain, self.profile.at(batch), requests=batch) for o in outcomes]
        self.harm.shadow(batch, [o.committed for o in outcomes], sum(prices) / len(prices))

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

    # ---- internals -----------------------------------------------------------------------
    def _admit(self, events: list[Event]) -> None:
        joined = False
        while self._queue and len(self._active) < self.target.max_slots:
            request = self._queue.popleft()
            try:
                request.view = slot_view(self.target, self.target.open())
                request.decoder = self.decoder_for(request.view, request.config)
                request.run = request.decoder.coroutine(
                    request.prompt, self._batch_size, ask_arm=self.harm is not None,
                    shadow_budget=None if self.harm is None else self.harm.config.shadow_budget)
            except Exception as exc:  # a refused configuration or prompt ends this request only
                self._release(request)
                events.append(Failed(request.id, exc))
                continue
            self._active[request.id] = request
            joined = True
        if joined and self.harm is not None:  # the batch's regime changed: look at the other arm again
            self.harm.joined(len(self._active))

    def _draft(self, events: list[Event]) -> tuple[float, int]:
        """Answer the requests' draft steps, one call per shared drafter and step, until every
        request waits on its verify (or ended); the seconds it took and the calls it made."""
        start, calls = time.perf_counter(), 0
        while drafting := [r for r in self._active.values() if r.drafting is not None]:
            groups: dict[Hashable, list[_Request]] = {}
            for request in drafting:
                assert request.drafting is not None
                groups.setdefault(request.drafting.key, []).append(request)
            for members in groups.values():
                calls += 1
                for request, answer in self._answer_drafts(members):
                    if isinstance(answer, BaseException):
                        self._throw(request, answer, events)
                    else:
                        request.drafting = None
                        self._advance(request, answer, events)
        return time.perf_counter() - start, calls

    @staticmethod
    def _answer_drafts(members: list[_Request]) -> list[tuple[_Request, Any]]:
        """One draft step of requests sharing a drafter in one call (request by request if it fails)."""
        steps = [r.drafting for r in members]
        assert all(s is not None for s in steps)
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
        """Run the request's coroutine to its next verify or draft step (publishing what it emits on the way)."""
        assert request.run is not None
        try:
            while True:
                step = request.run.send(reply)
                reply = None
                if isinstance(step, VerifyRequest):
                    request.waiting = step
                    return
                if isinstance(step, DraftRequest):
                    request.drafting = step
                    return
                if isinstance(step, ArmRequest):
                    request.arming = True
                    return
                if isinstance(step, Shadowed):  # counted by the controller at the round's end
                    request.shadowed.extend(step.outcomes)
                    continue
                events.append(Tokens(request.id, tuple(step)))
        except StopIteration as done:
            self._end(request)
            events.append(Finished(request.id, done.value))
        except Exception as exc:
            self._end(request)
            events.append(Failed(request.id, exc))

    def _throw(self, request: _Request, error: BaseException, events: list[Event]) -> None:
        """The request's verify or draft step failed: raise it inside its round (which rolls its slot back)."""
        assert request.run is not None
        request.waiting, request.drafting, request.arming = None, None, False
        try:
            request.run.throw(error)  # its round re-raises it after rolling back: nothing is resumed
        except Exception:
            pass
        else:  # the round went on regardless: stop it (its `finally` rolls back)
            request.run.close()
        self._end(request)
        events.append(Failed(request.id, error))

    def _verify(self, waiting: list[_Request], arm: Arm = Arm.SPECULATE,
                ) -> list[tuple[_Request, TargetLogits | Verified | BaseException]]:
        cut = self._batch_depth(waiting) if arm is Arm.SPECULATE else self._plain(waiting)
        cut.update(self._unproven_prompt_rounds(waiting))
        calls = []
        for r in waiting:
            assert r.waiting is not None and r.view is not None
            round_ = cut.get(r.id, r.waiting.round_)
            calls.append(VerifyCall(r.view.slot, r.waiting.pending, round_ if round_ is not None and round_.n else None,
                                    r.waiting.unread))
        start = time.perf_counter()
        try:
            logits = self.target.verify_many(calls)
        except Exception:
            return self._verify_alone(waiting, calls, start, cut)
        self.rounds.append(BatchRound(tuple(r.id for r in waiting), tuple(c.rows for c in calls),
                                      time.perf_counter() - start))
        return [(r, Verified(cut[r.id], out) if r.id in cut else out) for r, out in zip(waiting, logits)]

    @staticmethod
    def _plain(waiting: list[_Request], prompt_reads: bool = False) -> dict[int, CompiledRound]:
        """Request id -> its round cut to depth 0 (its pending row alone), for every steady round
        with candidates (`prompt_reads`: every round that reads its prompt)."""
        return {r.id: cut_to_depth(r.waiting.round_, 0) for r in waiting
                if r.waiting is not None and r.waiting.round_ is not None and r.waiting.round_.n
                and bool(r.waiting.unread) is prompt_reads}

    def _unproven_prompt_rounds(self, waiting: list[_Request]) -> dict[int, CompiledRound]:
        """Request id -> its prompt round cut to depth 0, for the requests reading their prompt
        this round, unless the controller measured speculation to pay at this batch size.  A
        prompt round's candidate rows are cheap for a request alone (one forward reads the prompt
        anyway), but a batch reads several prompts in one forward that is compute-bound on a CPU:
        each row costs about what a decoding row does, and is worth only its request's share of
        a batch round (benchmarks/batch_throughput/: on llama.cpp at B = 8, ten lookup rows per
        joining request made its two prompt forwards 5-10% slower, 3-4% of the run)."""
        if self.harm is None or self.harm.proven(len(waiting)):
            return {}
        return self._plain(waiting, prompt_reads=True)

    def _batch_depth(self, waiting: list[_Request]) -> dict[int, CompiledRound]:
        """Request id -> its round cut to the batch's depth, for the requests whose round it cuts."""
        gated = [r for r in waiting if r.waiting is not None and r.waiting.expected is not None
                 and r.waiting.round_ is not None and not r.waiting.unread]
        if self.profile is None or len(waiting) < 2 or not gated:
            return {}
        profile = self.profile.at(len(waiting))
        gated_ids = {r.id for r in gated}
        # the rows of the requests it does not cut (prompt calls read in a forward of their own)
        others = max((r.waiting.round_.n for r in waiting if r.id not in gated_ids and r.waiting is not None
                      and r.waiting.round_ is not None and not r.waiting.unread), default=0)
        shapes = []
        for r in gated:
            assert r.waiting is not None and r.waiting.round_ is not None and r.waiting.expected is not None
            shapes.append((r, rows_within_depths(r.waiting.round_, len(r.waiting.expected) - 1), r.waiting.expected))
        best_depth, best_rate = 0, -1.0
        for depth in range(max(len(expected) for _, _, expected in shapes)):
            rows = 1 + max(others, *(within[min(depth, len(within) - 1)] for _, within, _ in shapes))
            if rows > profile.max_rows:
                break
            tokens = sum(1.0 + expected[min(depth, len(expected) - 1)] for _, _, expected in shapes)
            rate = tokens / profile.relative_at(rows)
            if rate > best_rate:  # ties go to the shallower round
                best_depth, best_rate = depth, rate
        return {r.id: cut_to_depth(r.waiting.round_, best_depth) for r, _, expected in shapes
                if r.waiting is not None and r.waiting.round_ is not None and best_depth < len(expected) - 1}

    def _verify_alone(self, waiting: list[_Request], calls: list[VerifyCall], start: float,
                      cut: dict[int, CompiledRound]) -> list[tuple[_Request, TargetLogits | Verified | BaseException]]:
        out: list[tuple[_Request, TargetLogits | Verified | BaseException]] = []
        for request, call in zip(waiting, calls):
            try:
                logits = self.target.verify_many([call])[0]
                out.append((request, Verified(cut[request.id], logits) if request.id in cut else logits))
            except Exception as exc:
                out.append((request, exc))
        self.rounds.append(BatchRound(tuple(r.id for r in waiting), tuple(c.rows for c in calls),
                                      time.perf_counter() - start, retried=True))
        return out

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
        if request.view is not None:
            request.view.close()  # the slot's KV is freed now
            request.view = None
        if request.decoder is not None:
            request.decoder.close()  # its proposers' slots too (a draft model's)
            request.decoder = None
        request.run = None
        request.waiting, request.drafting, request.arming = None, None, False
