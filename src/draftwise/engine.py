"""The round loop: propose, compile, verify in one target pass, select, publish.

Pending-token convention (DESIGN.md): the committed tokens are x[0..t]; the target's KV
holds rows for x[0..t-1] and x[t] is pending.  A round verifies pending + candidates, the
verifier selects one root-to-node path plus a bonus token, `commit` makes the pending row and
the accepted rows authoritative, and the bonus becomes the new pending token (its KV row is
computed next round, with the real token).  In the first round the target has read nothing:
the prompt's other tokens go into the same forward as `unread` rows ahead of the pending one,
so the prefill and the verification of drafts made from the prompt cost one forward, as in
transformers' assisted generation.  With a cost gate (`gate.py`) every later round verifies
only the depth of the proposal that the measured t(n) and the recent acceptance pay for,
down to a one-row step.  Whatever happens, the target is left consistent: an interrupted
round is rolled back in `finally`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Sequence

import numpy as np

from draftwise.batch_control import Arm, DoNoHarm, DoNoHarmConfig
from draftwise.backends.base import Backend, check_fits, supports_hidden
from draftwise.contracts import ProposalResult, RoundManifest, TopologyKind
from draftwise.errors import ContractError
from draftwise.errors import InputError
from draftwise.gate import CostGate, CostGateConfig, SourceGate, check_gateable, gate_round, make_gate
from draftwise.logits import TargetLogits
from draftwise.proposers.base import (DraftRequest, HoldsResources, Proposer, RoundFeedback, SteppedProposer,
                                      answer_alone)
from draftwise.sampling import PositionDraws, SamplingPolicy
from draftwise.shadow import ShadowOutcome, ShadowRounds, round_price
from draftwise.stats import GenerationStats, RoundRecord, summarize
from draftwise.text import check_utf8
from draftwise.topology.compile import COMPILER_VERSION, CompiledRound, TreeLimits, compile_round, cut_to_depth
from draftwise.verify.base import Verifier, bind


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    policy: SamplingPolicy = SamplingPolicy()
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    limits: TreeLimits = TreeLimits()
    exact: bool = True
    gate: CostGateConfig | None = None  # verify only as deep as pays, by the measured t(n)
    # do no harm (`draftwise.batch_control`): a round of a request decoded alone is a plain step
    # (no proposal) where plain steps measured more committed tokens per second; batches guard
    # their shared rounds themselves (`draftwise.batch`)
    guard: DoNoHarmConfig | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        for number, stop in enumerate(self.stop_strings):
            if not stop:  # "" is in every text: it would stop every generation at its first token
                raise InputError(f"stop string {number} is empty: it would end every generation at its first token")
            check_utf8(stop, f"stop string {number}")


@dataclass(frozen=True)
class VerifyRequest:
    """Where a round needs the target: the pending token and the round's candidate rows (None:
    the pending token alone), after `unread` tokens (the prompt, in round 1) that the same
    forward reads first.  The answer is that forward's logits (row 0 pending, r + 1 candidate r)."""

    pending: int
    round_: CompiledRound | None
    unread: tuple[int, ...] = ()
    # with a cost gate: E[accepted | the round cut to depth d] for d = 0..its depth, which a
    # batch engine reads to cut every request's round to one depth that pays for the batch
    expected: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ArmRequest:
    """In a batch with a do-no-harm controller, a steady round asks before it proposes whether to
    speculate; the batch answers every request's at once with an `Arm` (PLAIN: nothing is
    drafted, the pending row alone is verified), so a plain round pays for no draft forward."""


@dataclass(frozen=True)
class Shadowed:
    """What speculative rounds would have committed where a batch's plain rounds carried shadow
    proposals of this request (`draftwise.shadow`), once the published tokens decided it."""

    outcomes: tuple[ShadowOutcome, ...]


@dataclass(frozen=True)
class Verified:
    """A verify request answered with the round actually verified: the request's own round cut
    to a smaller depth (`topology.compile.cut_to_depth`), and that round's logits."""

    round_: CompiledRound
    logits: TargetLogits


@dataclass(frozen=True)
class GenerationResult:
    tokens: tuple[int, ...]  # new tokens only (EOS included when it ended the generation)
    text: str
    stop_reason: str  # "eos", "stop_string" or "max_new_tokens"
    stats: GenerationStats
    records: tuple[RoundRecord, ...]
    from_draft: tuple[bool, ...]  # per new token: accepted from a proposal (True) or sampled by the target
    manifest_hash: str
    exact: bool
    verifier: str


@dataclass
class _Emitter:
    """Collects published tokens and applies the stop rules; never goes past max_new_tokens."""

    limit: int
    eos: frozenset[int]
    stop_strings: tuple[str, ...]
    detokenize: Callable[[Sequence[int]], str]
    tokens: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    stop_reason: str | None = None

    def publish(self, tokens: Sequence[int], drafted: Sequence[bool]) -> int:
        """Append tokens up to the first stop rule; return how many were published.  Each rule
        is checked after every token, as plain decoding would, so a round that accepts several
        tokens stops at the same one (a stop string completed mid-round cuts the rest)."""
        count = 0
        for token, was_drafted in zip(tokens, drafted):
            self.tokens.append(int(token))
            self.from_draft.append(was_drafted)
            count += 1
            if token in self.eos:
                self.stop_reason = "eos"
                break
            if len(self.tokens) >= self.limit:
                self.stop_reason = "max_new_tokens"
                break
            if self.stop_strings and self._stop_string_seen():
                self.stop_reason = "stop_string"
                break
        return count

    def _stop_string_seen(self) -> bool:
        """Whether the text now holds a stop string.  Earlier checks saw everything but the tail the
        newest token changed (its own text, and up to 3 characters before it that a split UTF-8
        character completes), so only a window of trailing tokens is decoded: one whose text
        reaches the longest stop string back past that tail.  Zero-width tokens (specials) are
        covered by doubling the window until its text is long enough; this keeps each check
        O(window) rather than O(tokens so far), which made long generations quadratic."""
        longest = max(len(s) for s in self.stop_strings)
        newest = len(self.detokenize(self.tokens[-1:]))
        # + 4: a decoded window may open with up to 3 replacement characters (a split UTF-8
        # character) or lose one leading space (SentencePiece), neither of which is in the text
        needed = longest + newest + 4
        window = needed
        while True:
            start = max(0, len(self.tokens) - window)
            text = self.detokenize(self.tokens[start:])
            if start == 0 or len(text) >= needed:
                return any(s in text for s in self.stop_strings)
            window *= 2


class SpeculativeDecoder:
    """Binds a verifier to the proposers' contracts before any target work, then decodes."""

    def __init__(
        self,
        target: Backend,
        proposers: Sequence[Proposer],
        verifier: Verifier,
        config: GenerationConfig = GenerationConfig(),
    ) -> None:
        self.target = target
        self.proposers = list(proposers)
        self.config = config
        self.verifier = bind(verifier, [p.contract for p in self.proposers], config.policy, exact=config.exact)
        # the guard of the last request decoded alone: the next one starts from its estimates
        self._last_guard: DoNoHarm | None = None
        if config.gate is not None:
            check_gateable(self.verifier.capabilities)
        info = target.info
        self.manifest = RoundManifest(
            target_checkpoint=info.checkpoint,
            tokenizer_hash=info.tokenizer_hash,
            sampling_policy=config.policy.as_dict(),
            proposers=tuple(
                {**p.identity(), "contract": {k: v.value for k, v in p.contract.__dict__.items()}} for p in self.proposers
            ),
            compiler_version=COMPILER_VERSION,
            max_nodes=config.limits.max_nodes,
            max_depth=config.limits.max_depth,
            verifier=verifier.capabilities.name,
            exact=verifier.capabilities.exact,
            backend=info.name,
            dtype=info.dtype,
        )

    def close(self) -> None:
        """Free what the proposers hold beyond a generation (in a batch: a request's draft slot)."""
        for proposer in self.proposers:
            if isinstance(proposer, HoldsResources):
                proposer.close()

    def generate(self, prompt: Sequence[int], on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        rounds = self.rounds(prompt)
        while True:
            try:
                emitted = next(rounds)
            except StopIteration as done:
                result: GenerationResult = done.value
                return result
            if on_tokens is not None:
                on_tokens(emitted)

    def rounds(self, prompt: Sequence[int]) -> Generator[list[int], None, GenerationResult]:
        """Decode round by round: yields each round's published tokens (never empty) and
        returns the `GenerationResult`.  Closing the generator early leaves the target consistent."""
        run = self.coroutine(prompt)
        reply: Any = None
        try:
            while True:
                step = run.send(reply)
                if isinstance(step, VerifyRequest):
                    reply = self.target.verify(step.pending, step.round_, unread=step.unread)
                elif isinstance(step, DraftRequest):  # not yielded alone (`propose` answers inline); kept whole
                    reply = answer_alone(step)
                elif isinstance(step, ArmRequest):  # not asked alone (no `ask_arm`): speculate
                    reply = Arm.SPECULATE
                elif isinstance(step, Shadowed):  # not yielded alone: the request's own guard counts them
                    reply = None
                else:
                    reply = None
                    yield step
        except StopIteration as done:
            result: GenerationResult = done.value
            return result
        finally:
            run.close()  # a round cut short (an error, an abandoned stream) is rolled back by its `finally`

    def coroutine(self, prompt: Sequence[int], batch_size: Callable[[], int] | None = None, ask_arm: bool = False,
                  shadow_budget: float | None = None,
                  ) -> Generator[VerifyRequest | DraftRequest | ArmRequest | Shadowed | list[int], Any, GenerationResult]:
        """The generation as a coroutine that stops wherever a round needs the target's forward:
        it yields a `VerifyRequest` and is sent that verify's logits (or `Verified`: the round cut
        further, with its logits), or yields the tokens a round
        published (and is sent None).  `rounds` runs the verify on `self.target` itself; the batch
        engine (`draftwise.batch`) gathers every request's `VerifyRequest` into one forward and
        says, through `batch_size`, how many requests share each round (the gate prices it).  In
        a batch (`batch_size` given), a stepped proposer's draft forwards stop it too: it yields
        the `DraftRequest` and is sent its answer (the batch answers every request's at once).
        `ask_arm` (a batch with a do-no-harm controller): every steady round that could propose
        first yields an `ArmRequest` and is sent the `Arm` to play; with `shadow_budget`, its plain
        rounds may carry shadow proposals (`draftwise.shadow`), and what they would have committed
        is yielded as `Shadowed` once the published tokens decide it (and is sent None)."""
        config = self.config
        if not prompt:
            raise InputError("the prompt has no tokens")
        check_fits(self.target.info, len(prompt), config.max_new_tokens)
        rng = np.random.default_rng(config.seed)
        draws = PositionDraws.for_seed(config.seed, rng)  # the target's own samples, one per position
        # a branching proposal needs per-branch resources (llama.cpp: a sequence per leaf), sized
        # here, between generations, by the backend itself
        branching = any(p.contract.topology is not TopologyKind.SEQUENCE for p in self.proposers)
        self.target.reserve(config.limits.max_nodes if branching else 0)
        if supports_hidden(self.target):  # a proposer that reads hidden states asks for them in `begin`
            self.target.track_hidden(False)  # type: ignore[attr-defined]
        for proposer in self.proposers:
            proposer.begin(config.policy, rng)
        emitter = _Emitter(config.max_new_tokens, self.target.info.eos_token_ids, config.stop_strings,
                           self.target.detokenize)
        records: list[RoundRecord] = []
        gate = make_gate(config.gate, len(self.proposers))
        # a request alone starts its guard where this decoder's last one left off (`DoNoHarm.after`)
        harm = DoNoHarm.after(self._last_guard, config.guard) \
            if config.guard is not None and self.proposers and batch_size is None else None
        budget = config.guard.shadow_budget if harm is not None and config.guard is not None else shadow_budget
        shadows = ShadowRounds(budget) if budget is not None and (harm is not None or ask_arm) and self._shadowable() \
            else None
        context = list(prompt)
        start = time.perf_counter()
        self.target.reset()
        try:
            while emitter.stop_reason is None:
                if gate is not None and batch_size is not None:
                    gate.batch = batch_size()
                record, emitted = yield from self._round(context, emitter, rng, draws, gate, harm, batch_size is not None,
                                                         ask_arm, shadows, batch_size)
                records.append(record)
                context.extend(emitted)
                if emitted:
                    yield emitted
        finally:
            self.target.rollback()  # no-op after a clean commit; undoes a round cut short by an exception
            if harm is not None:
                self._last_guard = harm
        wall = time.perf_counter() - start
        new = emitter.tokens
        return GenerationResult(
            tokens=tuple(new),
            text=self.target.detokenize([t for t in new if t not in self.target.info.eos_token_ids]),
            stop_reason=emitter.stop_reason,
            stats=summarize(records, len(new), wall),
            records=tuple(records),
            from_draft=tuple(emitter.from_draft),
            manifest_hash=self.manifest.hash,
            exact=self.verifier.capabilities.exact,
            verifier=self.verifier.capabilities.name,
        )

    def _nothing(self, source: int) -> ProposalResult:
        """An empty proposal from `source` (not asked this round)."""
        proposer = self.proposers[source]
        return ProposalResult((), proposer.contract, proposer.name, self.manifest.hash)

    def _each_source(self, proposed_by: dict[int, ProposalResult]) -> list[ProposalResult]:
        """The round's proposals in the union's order, empty for the sources not (yet) asked."""
        return [proposed_by.get(k) or self._nothing(k) for k in range(len(self.proposers))]

    def _shadowable(self) -> bool:
        """Whether the guard's plain rounds can carry shadow proposals (`draftwise.shadow`): every
        proposer proposes from the context and the target's committed state alone, and the
        verifier accepts exactly the rows whose tokens the target publishes."""
        return self.verifier.capabilities.any_candidates and all(
            getattr(proposer, "proposes_without_state", False) for proposer in self.proposers)

    def _round(self, context: list[int], emitter: _Emitter, rng: np.random.Generator, draws: PositionDraws,
               gate: CostGate | SourceGate | None,
               harm: DoNoHarm | None = None, batched: bool = False, ask_arm: bool = False,
               shadows: ShadowRounds | None = None, batch_size: Callable[[], int] | None = None,
               ) -> Generator[VerifyRequest | DraftRequest | ArmRequest | Shadowed, Any, tuple[RoundRecord, list[int]]]:
        """One round.  The first also reads the prompt (its `unread` rows) in the verify forward.
        `batched`: a stepped proposer's draft forwards are yielded, for the batch to answer with
        every request's (alone, `propose` answers them inline: the same steps, no detour).
        `shadows`: a plain round the guard chose may carry a shadow proposal, made and compiled
        as a speculative round's would be, never verified (what it would have committed is read
        off the tokens published later and told to the guard)."""
        seconds: dict[str, float] = {}
        limits = round_limits(self.config.limits, len(context), self.target.info.context_length,
                              emitter.limit - len(emitter.tokens), self.target.info.max_verify_rows)
        unread = context[self.target.cached_len : -1]  # the prompt in round 1, then nothing
        reads_prompt = bool(unread)
        # a round that reads the prompt is no decoding step: the guard neither plays nor prices it
        # (it speculates unless plain was chosen on measured rounds, carried from the last request)
        arm, explored = (Arm.SPECULATE, False) if harm is None else \
            (harm.prompt_arm(1), False) if reads_prompt else harm.play(1)
        if ask_arm and not reads_prompt and self.proposers and limits.max_depth > 0:
            arm = yield ArmRequest()  # the batch's controller decides for the whole round
            if not isinstance(arm, Arm):
                raise ContractError(f"an arm request is answered with an Arm, got {arm!r}")
        clock = started = time.perf_counter()
        # the prompt-reading round's candidates are nearly free where they ride in the prompt's
        # forward; where the backend reads the prompt apart (llama.cpp) they would cost a verify
        # forward of their own, for a proposal that continues the chat template (a first turn's
        # prompt lookup: 2% accepted) - so there that round is a plain step
        asked = bool(self.proposers) and limits.max_depth > 0 and arm is Arm.SPECULATE \
            and (not reads_prompt or self.target.info.prompt_shares_round)
        # a plain round may still ask, for a shadow proposal that is never verified (`draftwise.shadow`)
        shadowed = shadows is not None and arm is Arm.PLAIN and not reads_prompt and limits.max_depth > 0 \
            and shadows.due()
        # a union's gate asks its sources cheapest first, and a source that costs drafting time
        # only where the gate would verify some of its rows (`SourceGate.ask`; never for a shadow)
        choosy = gate if asked and isinstance(gate, SourceGate) else None
        order = choosy.start_round() if choosy is not None else range(len(self.proposers))
        proposed_by: dict[int, ProposalResult] = {}
        unasked: list[int] = []
        for k in order if asked or shadowed else ():
            proposer = self.proposers[k]
            if choosy is not None and not reads_prompt and not choosy.ask(
                    k, lambda: compile_round(len(context), self._each_source(proposed_by), limits)):
                proposed_by[k] = self._nothing(k)
                unasked.append(k)
                continue
            if batched and asked and isinstance(proposer, SteppedProposer):  # its draft forwards go up to the batch
                # (a shadow proposal's are its own: a plain round hands the batch no draft step)
                proposed_by[k] = yield from proposer.drafting(context, self.manifest.hash, max_depth=limits.max_depth)
            else:
                proposed_by[k] = proposer.propose(context, self.manifest.hash, max_depth=limits.max_depth)
            lap, clock = _lap(clock)
            seconds[proposer.phase] = seconds.get(proposer.phase, 0.0) + lap
            if choosy is not None:
                choosy.drafted(k, lap)
        results = self._each_source(proposed_by) if proposed_by else []
        for proposer, result in zip(self.proposers, results):
            self.manifest.check(result)
            if result.contract != proposer.contract:  # the verifier was bound to the declared one
                raise ContractError(
                    f"{result.source}: proposal made under contract {result.contract}, but the proposer declared "
                    f"{proposer.contract}, which the verifier was bound to"
                )

        offered = compile_round(len(context), results, limits)
        proposed = asked and any(r.nodes for r in results)
        round_, gated = gate_round(gate, offered, reads_prompt=reads_prompt)
        seconds["compile"], clock = _lap(clock)
        shadow, shadow_cost = None, 0.0
        if shadowed:  # the round the gate would verify is kept aside; the pending row alone is verified
            shadow, shadow_cost = round_, clock - started
            round_, gated = compile_round(len(context), [], limits), False

        expected = None if gate is None or not round_.n or reads_prompt else \
            tuple(gate.expected_accepted(d) for d in range(int(round_.depth.max()) + 1))
        reply = yield VerifyRequest(context[-1], round_ if round_.n else None, tuple(unread), expected)
        assert reply is not None, "a verify request is answered with the target's logits"
        if isinstance(reply, Verified):  # the batch cut this round to a smaller depth
            cut = cut_to_depth(round_, int(reply.round_.depth.max()) if reply.round_.n else 0)
            if not (np.array_equal(cut.token_ids, reply.round_.token_ids) and np.array_equal(cut.parent, reply.round_.parent)):
                raise ContractError("a batch answered a round with rows that are not a depth cut of it")
            round_, gated, logits = cut, True, reply.logits
        else:
            logits = reply
        kv_bytes = self.target.kv_bytes()
        seconds["prefill" if reads_prompt else "verify"], clock = _lap(clock)

        selection = self.verifier.select(round_, logits, self.config.policy, rng, draws=draws)
        seconds["select"], clock = _lap(clock)

        self.target.commit(selection.accepted_rows)
        seconds["commit"], clock = _lap(clock)

        accepted_tokens = [int(round_.token_ids[r]) for r in selection.accepted_rows]
        decided = accepted_tokens + [selection.bonus_token]
        emitted_count = emitter.publish(decided, [True] * len(accepted_tokens) + [False])
        for i, (proposer, result) in enumerate(zip(self.proposers, results if asked else ())):
            if i in unasked:
                continue  # as in a plain round: it proposed nothing to keep or roll back
            proposer.observe(feedback_for(i, result, round_, selection.accepted_rows, decided[:emitted_count]))
        # it learns from a shadow proposal as from an offered one, and nothing from the round that
        # reads the prompt: on a first turn that proposal continues the chat template's header into
        # the answer's opening (benchmarks/cost_gate/, "The prompt-reading round")
        if gate is not None and not reads_prompt:
            gate.observe(offered if asked or shadowed else None, decided)
        record = RoundRecord(
            nodes=round_.n,
            proposal_depth=int(round_.depth.max()) if round_.n else 0,
            accepted=min(len(selection.accepted_rows), emitted_count),  # a stop rule (EOS) cuts the rest
            emitted=emitted_count,
            fallback=asked and not proposed,
            asked=asked,
            kv_bytes=kv_bytes,
            provisional_kv_bytes=(1 + round_.n) * self.target.info.kv_row_bytes,
            depth_limit=limits.max_depth if asked else 0,
            seconds=seconds,
            slot_path=slot_path(round_, selection.accepted_rows),
            gated=gated,
            reads_prompt=reads_prompt,
            detail={key: value for result in (results if asked else ()) for key, value in result.seconds.items()},
            guard_plain=arm is Arm.PLAIN,
            shadowed=shadowed,
            by_source=source_ledger(self.proposers, round_, selection.accepted_rows[:emitted_count]) if asked else (),
            unasked=tuple(self.proposers[k].name for k in unasked),
        )
        if shadows is not None:
            if shadow is not None:  # spaced by this round's share of its batch's time
                share = (record.total_seconds - shadow_cost) / (batch_size() if batch_size is not None else 1)
                shadows.track(len(emitter.tokens) - emitted_count, shadow, shadow_cost, share,
                              None if harm is None else harm.shadow_share(1))
            outcomes = shadows.resolve(emitter.tokens)
            if harm is not None:
                for outcome in outcomes:
                    harm.shadow(1, [outcome.committed], shadow_price(outcome, gate, harm))
            elif outcomes:  # the batch's controller prices and counts them
                yield Shadowed(tuple(outcomes))
        if harm is not None and not reads_prompt:
            harm.observe(1, arm, emitted_count, record.total_seconds, explored)
        return record, emitter.tokens[-emitted_count:] if emitted_count else []


def shadow_price(outcome: ShadowOutcome, gate: CostGate | SourceGate | None, harm: DoNoHarm) -> float | None:
    """Seconds the speculative round a shadow stands for would have taken (a request alone):
    its proposal plus a plain round's verify scaled by the gate's measured t(1 + rows) / t(1);
    without a gate, an empty proposal costs a plain round and a proposal the mean measured
    speculative round (None).  Pricing each shadow by its own rows matters where rows are
    dear (llama.cpp): a handful of long proposals must not make the empty ones look like
    full-price speculative rounds, nor the reverse."""
    plain = harm.mean_seconds(1, Arm.PLAIN)
    if plain <= 0:
        return None
    if gate is not None:
        return round_price(outcome, plain, gate.profile)
    return outcome.cost + plain if outcome.rows == 0 else None


def feedback_for(source: int, result: ProposalResult, verified: CompiledRound, accepted_rows: Sequence[int],
                 published: Sequence[int]) -> RoundFeedback:
    """The accepted path in the node indices of proposer `source`'s own result (`verified`'s
    origin maps them to its rows, a gate's cut included)."""
    row_to_node = {int(row): node for node, row in enumerate(verified.origin[source]) if row >= 0}
    accepted = tuple(row_to_node[r] for r in accepted_rows if r in row_to_node)
    return RoundFeedback(result, accepted, tuple(int(t) for t in published))


def source_ledger(proposers: Sequence[Proposer], verified: CompiledRound, accepted_rows: Sequence[int],
                  ) -> tuple[tuple[str, int, int], ...]:
    """(name, verified rows it proposed, accepted rows it proposed) per proposer: `verified`'s
    origin says which rows each one's nodes landed on (a gate's or the batch's cut included)."""
    accepted = {int(r) for r in accepted_rows}
    ledger = []
    for proposer, rows in zip(proposers, verified.origin):
        mine = {row for row in rows if row >= 0}
        ledger.append((proposer.name, len(mine), len(mine & accepted)))
    return tuple(ledger)


def round_limits(limits: TreeLimits, context_len: int, context_length: int, remaining: int,
                 max_verify_rows: int = 1 << 30) -> TreeLimits:
    """This round's tree limits: no more rows than the context has room for or the target
    verifies at once (strict llama.cpp kernels: rows beyond the probed size are not bit-exact),
    no deeper than the tokens still allowed (a deeper candidate could never be published)."""
    room = min(context_length - context_len - 1, max_verify_rows - 1)
    return TreeLimits(max_nodes=max(0, min(limits.max_nodes, room)),
                      max_depth=max(0, min(limits.max_depth, remaining - 1, room)))


def slot_path(round_: CompiledRound, accepted_rows: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """(children offered, index of the selected child or -1) at the frontier and at every
    accepted row, stopping at the first node without children.  A child's index is its place
    in proposal order (`children_of`), i.e. its slot for a template or top-k proposer."""
    path: list[tuple[int, int]] = []
    parent = -1
    for row in [*accepted_rows, None]:
        children = round_.children_of(parent)
        if not children:
            break
        path.append((len(children), children.index(row) if row in children else -1))
        if row is None:
            break
        parent = row
    return tuple(path)


def _lap(clock: float) -> tuple[float, float]:
    now = time.perf_counter()
    return now - clock, now
