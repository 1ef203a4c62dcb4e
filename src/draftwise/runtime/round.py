"""One request's generation as rounds: propose -> compile -> verify -> select -> commit -> publish.

Pending-token convention (docs/architecture.md, "Coordinates"): the committed tokens are
x[0..t]; the target's KV holds rows for x[0..t-1] and x[t] is pending.  A round verifies pending
+ candidates, the verifier selects one root-to-node path plus a bonus token, `commit` makes the
pending row and the accepted rows authoritative, and the bonus becomes the new pending token.
The first round also reads the prompt (`unread` rows ahead of the pending one, in the same
forward).  A generation is a coroutine that stops wherever its engine decides for it or needs a
model: it asks how to play the round (`Ask`), hands up draft steps (`DraftRequest`) and its
verify (`VerifyRequest`), and reports what it published (`Published`).  The engine
(`runtime.engine`) answers for one request or many alike; an interrupted round is rolled back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Sequence

import numpy as np

from draftwise.backends.base import Backend, check_fits, supports_hidden
from draftwise.runtime.guard import Arm, DoNoHarmConfig
from draftwise.runtime.contracts import ProposalResult, RoundManifest, TopologyKind
from draftwise.errors import ContractError, InputError
from draftwise.runtime.gate import CostGate, CostGateConfig, SourceGate, check_gateable, gate_round, make_gate
from draftwise.runtime.logits import TargetLogits
from draftwise.proposers.base import DraftRequest, HoldsResources, Proposer, RoundFeedback, SteppedProposer
from draftwise.runtime.sampling import PositionDraws, SamplingPolicy
from draftwise.runtime.shadow import ShadowOutcome, ShadowRounds
from draftwise.runtime.stats import GenerationStats, RoundRecord, summarize
from draftwise.runtime.text import check_utf8
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
    # do no harm (docs/trees-and-planning.md, the guard): a request alone takes plain steps (nothing
    # proposed) where they measured more committed tokens per second; None: no guard alone
    guard: DoNoHarmConfig | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        for number, stop in enumerate(self.stop_strings):
            if not stop:  # "" is in every text: it would stop every generation at its first token
                raise InputError(f"stop string {number} is empty: it would end every generation at its first token")
            check_utf8(stop, f"stop string {number}")


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


# ---- what a round says to its engine, and what it is answered --------------------------------
@dataclass(frozen=True)
class Ask:
    """Every round asks, before proposing, how to play (answered with `Orders`)."""

    reads_prompt: bool


@dataclass(frozen=True)
class Orders:
    """How to play a round: speculate or take a plain step (nothing proposed, the pending row
    alone verified); how many requests share its forward (the gate prices rows by it); and
    the share of a plain round's time a shadow proposal may take (None: no shadows)."""

    arm: Arm = Arm.SPECULATE
    batch: int = 1
    shadow_share: float | None = None
    guard_plain: bool = False  # the guard, not the round's own limits, made it plain


@dataclass(frozen=True)
class VerifyRequest:
    """The pending token and the round's candidate rows (None: the pending token alone), after
    `unread` tokens (the prompt, in round 1) that the same forward reads first.  Answered with that
    forward's logits (row 0 pending, r + 1 candidate r), or `Verified` (the round cut shallower)."""

    pending: int
    round_: CompiledRound | None
    unread: tuple[int, ...] = ()
    # with a cost gate: E[accepted | the round cut to depth d] for d = 0..its depth, which the
    # engine reads to cut every request's round to one depth that pays for the whole forward
    expected: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Verified:
    """A verify answered with the round actually verified: the request's round cut to a smaller
    depth (`topology.compile.cut_to_depth`), and that round's logits."""

    round_: CompiledRound
    logits: TargetLogits


@dataclass(frozen=True)
class Published:
    """A round's published tokens (never empty), and the shadow proposals they decided."""

    tokens: tuple[int, ...]
    shadows: tuple[ShadowOutcome, ...] = ()


Step = Ask | DraftRequest | VerifyRequest | Published


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
        """Whether the text now holds a stop string.  Only a window of trailing tokens is decoded,
        one whose text reaches the longest stop string back past what the newest token changed
        (its own text and up to 3 characters a split UTF-8 character completes); the window
        doubles over zero-width tokens.  Each check is O(window), not O(tokens so far)."""
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


@dataclass
class _Generation:
    """One generation's state between rounds."""

    context: list[int]
    emitter: _Emitter
    rng: np.random.Generator
    draws: PositionDraws
    gate: CostGate | SourceGate | None
    shadows: ShadowRounds | None
    records: list[RoundRecord] = field(default_factory=list)


@dataclass
class _Proposal:
    """What the propose and compile steps made of a round: the round to verify and its ledger."""

    results: list[ProposalResult]
    offered: CompiledRound  # every source's candidates, merged
    round_: CompiledRound  # what is verified: `offered`, cut by the gate, or nothing (a plain step)
    gated: bool
    asked: bool
    shadow: CompiledRound | None  # a plain round's shadow proposal, kept aside, never verified
    unasked: tuple[int, ...]
    seconds: dict[str, float]


class Laps:
    """Seconds per named phase of a round, measured back to back."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.start = self._clock = time.perf_counter()

    def lap(self, phase: str) -> float:
        now = time.perf_counter()
        spent, self._clock = now - self._clock, now
        self.seconds[phase] = self.seconds.get(phase, 0.0) + spent
        return spent


class RequestRounds:
    """A request's decoder: binds a verifier to the proposers' contracts before any target work,
    freezes the round manifest, and runs a generation as a coroutine of rounds."""

    def __init__(self, target: Backend, proposers: Sequence[Proposer], verifier: Verifier,
                 config: GenerationConfig = GenerationConfig()) -> None:
        self.target = target
        self.proposers = list(proposers)
        self.config = config
        self.verifier = bind(verifier, [p.contract for p in self.proposers], config.policy, exact=config.exact)
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

    @property
    def shadowable(self) -> bool:
        """Whether plain rounds can carry shadow proposals (`draftwise.runtime.shadow`): every proposer
        proposes from the context and the target's committed state alone, and the verifier
        accepts exactly the rows whose tokens the target publishes."""
        return bool(self.proposers) and self.verifier.capabilities.any_candidates and all(
            getattr(proposer, "proposes_without_state", False) for proposer in self.proposers)

    def coroutine(self, prompt: Sequence[int]) -> Generator[Step, Any, GenerationResult]:
        """The generation, round by round (see the module docstring); returns its result."""
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
        state = _Generation(list(prompt), emitter, rng, draws, make_gate(config.gate, len(self.proposers)),
                            ShadowRounds(0.0) if self.shadowable else None)
        start = time.perf_counter()
        self.target.reset()
        try:
            while emitter.stop_reason is None:
                yield (yield from self._round(state))
        finally:
            self.target.rollback()  # no-op after a clean commit; undoes a round cut short by an exception
        new = emitter.tokens
        return GenerationResult(
            tokens=tuple(new),
            text=self.target.detokenize([t for t in new if t not in self.target.info.eos_token_ids]),
            stop_reason=emitter.stop_reason,
            stats=summarize(state.records, len(new), time.perf_counter() - start),
            records=tuple(state.records),
            from_draft=tuple(emitter.from_draft),
            manifest_hash=self.manifest.hash,
            exact=self.verifier.capabilities.exact,
            verifier=self.verifier.capabilities.name,
        )

    def _round(self, g: _Generation) -> Generator[Step, Any, Published]:
        """One round, as the design reads: propose, compile, verify, select, commit, publish."""
        limits = round_limits(self.config.limits, len(g.context), self.target.info.context_length,
                              g.emitter.limit - len(g.emitter.tokens), self.target.info.max_verify_rows)
        unread = g.context[self.target.cached_len:-1]  # the prompt in round 1, then nothing
        can_propose = bool(self.proposers) and limits.max_depth > 0
        orders = yield Ask(bool(unread))
        if not isinstance(orders, Orders):
            raise ContractError(f"a round's question is answered with Orders, got {orders!r}")
        laps = Laps()
        proposal = yield from self._propose(g, orders, limits, can_propose, bool(unread), laps)
        expected = None if g.gate is None or not proposal.round_.n or unread else \
            tuple(g.gate.expected_accepted(d) for d in range(int(proposal.round_.depth.max()) + 1))
        round_ = proposal.round_
        reply = yield VerifyRequest(g.context[-1], round_ if round_.n else None, tuple(unread), expected)
        round_, logits, gated = _answered(round_, reply, proposal.gated)
        kv_bytes = self.target.kv_bytes()
        laps.lap("prefill" if unread else "verify")

        selection = self.verifier.select(round_, logits, self.config.policy, g.rng, draws=g.draws)
        laps.lap("select")
        self.target.commit(selection.accepted_rows)
        laps.lap("commit")

        accepted = [int(round_.token_ids[r]) for r in selection.accepted_rows]
        decided = accepted + [selection.bonus_token]
        emitted = g.emitter.publish(decided, [True] * len(accepted) + [False])
        self._observe(g, proposal, round_, selection.accepted_rows, decided, emitted, bool(unread))
        record = RoundRecord(
            nodes=round_.n, proposal_depth=int(round_.depth.max()) if round_.n else 0,
            accepted=min(len(selection.accepted_rows), emitted),  # a stop rule (EOS) cuts the rest
            emitted=emitted, fallback=proposal.asked and not any(r.nodes for r in proposal.results),
            asked=proposal.asked, kv_bytes=kv_bytes, provisional_kv_bytes=(1 + round_.n) * self.target.info.kv_row_bytes,
            depth_limit=limits.max_depth if proposal.asked else 0, seconds={**proposal.seconds, **laps.seconds},
            slot_path=slot_path(round_, selection.accepted_rows), gated=gated, reads_prompt=bool(unread),
            detail={k: v for result in (proposal.results if proposal.asked else ()) for k, v in result.seconds.items()},
            guard_plain=orders.guard_plain, shadowed=proposal.shadow is not None,
            by_source=source_ledger(self.proposers, round_, selection.accepted_rows[:emitted]) if proposal.asked else (),
            unasked=tuple(self.proposers[k].name for k in proposal.unasked),
        )
        g.records.append(record)
        g.context.extend(g.emitter.tokens[-emitted:])
        return Published(tuple(g.emitter.tokens[-emitted:]), self._shadows(g, proposal, record, orders, emitted))

    def _propose(self, g: _Generation, orders: Orders, limits: TreeLimits, can_propose: bool, reads_prompt: bool,
                 laps: Laps) -> Generator[DraftRequest, Any, _Proposal]:
        """Ask the sources (a union's gate asks them cheapest first, and a source that costs
        drafting time only where some of its rows would be verified), compile their candidates,
        and cut the round to the depth the gate prices as paying.  A plain round may still ask,
        for a shadow proposal made as a speculative round's would be and never verified."""
        asked = can_propose and orders.arm is Arm.SPECULATE
        shadowed = (can_propose and orders.arm is Arm.PLAIN and not reads_prompt and orders.shadow_share is not None
                    and g.shadows is not None and g.shadows.due())
        choosy = g.gate if asked and isinstance(g.gate, SourceGate) else None
        if g.gate is not None:
            g.gate.batch = orders.batch
        proposed_by: dict[int, ProposalResult] = {}
        unasked: list[int] = []
        for k in (choosy.start_round() if choosy is not None else range(len(self.proposers))) if asked or shadowed else ():
            proposer = self.proposers[k]
            if choosy is not None and not reads_prompt and not choosy.ask(
                    k, lambda: compile_round(len(g.context), self._each_source(proposed_by), limits)):
                unasked.append(k)
                continue
            if asked and isinstance(proposer, SteppedProposer):  # its draft forwards go up to the engine
                proposed_by[k] = yield from proposer.drafting(g.context, self.manifest.hash, max_depth=limits.max_depth)
            else:  # a shadow's draft steps are its own: a plain round hands the engine none
                proposed_by[k] = proposer.propose(g.context, self.manifest.hash, max_depth=limits.max_depth)
            spent = laps.lap(proposer.phase)
            if choosy is not None:
                choosy.drafted(k, spent)
        results = self._each_source(proposed_by) if asked or shadowed else []
        for proposer, result in zip(self.proposers, results):
            self.manifest.check(result)
            if result.contract != proposer.contract:  # the verifier was bound to the declared one
                raise ContractError(f"{result.source}: proposal made under contract {result.contract}, but the "
                                    f"proposer declared {proposer.contract}, which the verifier was bound to")
        offered = compile_round(len(g.context), results, limits)
        round_, gated = gate_round(g.gate, offered, reads_prompt=reads_prompt)
        shadow = round_ if shadowed else None  # the pending row alone is verified
        if shadowed:
            round_, gated = compile_round(len(g.context), [], limits), False
        laps.lap("compile")
        seconds = dict(laps.seconds)
        laps.seconds.clear()
        return _Proposal(results, offered, round_, gated, asked, shadow, tuple(unasked), seconds)

    def _observe(self, g: _Generation, proposal: _Proposal, verified: CompiledRound, accepted_rows: Sequence[int],
                 decided: Sequence[int], emitted: int, reads_prompt: bool) -> None:
        """Tell the proposers what the round published and the gate what it decided.  The gate
        learns from a shadow as from an offered proposal, and nothing from the round that reads
        the prompt: on a first turn that proposal continues the chat template's header
        (benchmarks/cost_gate/, "The prompt-reading round")."""
        for i, result in enumerate(proposal.results if proposal.asked else ()):
            if i not in proposal.unasked:  # an unasked source proposed nothing to keep or roll back
                self.proposers[i].observe(feedback_for(i, result, verified, accepted_rows, decided[:emitted]))
        if g.gate is not None and not reads_prompt:
            g.gate.observe(proposal.offered if proposal.asked or proposal.shadow is not None else None, decided)

    def _shadows(self, g: _Generation, proposal: _Proposal, record: RoundRecord, orders: Orders,
                 emitted: int) -> tuple[ShadowOutcome, ...]:
        """Track this round's shadow (spaced by its share of the plain round's time) and return the
        shadows the published tokens have decided."""
        if g.shadows is None:
            return ()
        if proposal.shadow is not None:
            cost = sum(proposal.seconds.values())
            share = (record.total_seconds - cost) / orders.batch
            g.shadows.track(len(g.emitter.tokens) - emitted, proposal.shadow, cost, share, orders.shadow_share)
        return tuple(g.shadows.resolve(g.emitter.tokens))

    def _nothing(self, source: int) -> ProposalResult:
        """An empty proposal from `source` (not asked this round)."""
        proposer = self.proposers[source]
        return ProposalResult((), proposer.contract, proposer.name, self.manifest.hash)

    def _each_source(self, proposed_by: dict[int, ProposalResult]) -> list[ProposalResult]:
        """The round's proposals in the union's order, empty for the sources not (yet) asked."""
        return [proposed_by.get(k) or self._nothing(k) for k in range(len(self.proposers))]


def _answered(round_: CompiledRound, reply: Any, gated: bool) -> tuple[CompiledRound, TargetLogits, bool]:
    """The verified round, its logits and whether it was cut: the engine may answer with the
    round cut shallower (`Verified`), which must be a depth cut of the one asked for."""
    assert reply is not None, "a verify request is answered with the target's logits"
    if not isinstance(reply, Verified):
        return round_, reply, gated
    cut = cut_to_depth(round_, int(reply.round_.depth.max()) if reply.round_.n else 0)
    if not (np.array_equal(cut.token_ids, reply.round_.token_ids) and np.array_equal(cut.parent, reply.round_.parent)):
        raise ContractError("an engine answered a round with rows that are not a depth cut of it")
    return cut, reply.logits, True


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
    origin says which rows each one's nodes landed on (a gate's or the engine's cut included)."""
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
