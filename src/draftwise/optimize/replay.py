"""Replaying a configuration's rounds on a plain decoding trace, without the target.

A trace is what the target did alone: the prompt, its continuation, the measured seconds of
its first round (prompt read + first token) and of an ordinary one-row step.  For a proposer
whose candidates are a function of the context (prompt lookup, REST, a greedy draft model),
a verifier that accepts a candidate exactly when it is the target's own token (greedy; and
membership under sampling, whose target sample at each depth is distributed as the trace's
token there) accepts along the trace.  So the replay runs the real engine
(`SpeculativeDecoder`) with a `TraceBackend` standing in for the target: every row predicts
the trace, one-hot, and the engine's own round loop (limits, the first round's prompt read,
the cost gate, stop rules) decides the rounds.  Under greedy decoding the replayed rounds ARE
the rounds the engine runs on the target; under sampling they have the same distribution.

How the replay ends where the trace did: a trace shorter than `max_new_tokens` ended on a
stop rule.  When its last token occurs nowhere earlier in the continuation it is used as the
EOS set (a real EOS always qualifies: plain decoding stops at its first one); otherwise (a
stop string completed by a token seen before) the engine runs on past the trace, reading it
as its last token repeated, and the rounds are cut where the trace ends.

Time is then predicted, not measured: a later round of n rows costs step * t(n) (the
measured verify profile), round 1 the trace's measured first round (the candidate rows ride
in the prompt's forward), and every round the proposer's own time, measured by the engine
during the replay.  What the replay cannot do is a sampling draft model: its verifier accepts
with min(1, p/q), which a single trace token does not reveal.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.runtime.gate import CostGateConfig
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.trace_backend import TraceBackend
from draftwise.proposers.base import Proposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.stats import RoundRecord
from draftwise.topology.compile import TreeLimits
from draftwise.verify.base import Verifier
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier


class TraceDiverged(RuntimeError):
    """The engine, run on a trace, published other tokens than the trace's own."""


@dataclass(frozen=True)
class Trace:
    """The target decoding one prompt alone."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]  # the continuation, EOS included when it ended the generation
    first_round_s: float  # prompt read + first token
    step_s: float  # median seconds of a later one-row round (the plain step)

    def __post_init__(self) -> None:
        if not self.prompt or not self.tokens:
            raise ValueError("a trace needs a prompt and at least one generated token")
        if not (self.first_round_s > 0 and self.step_s > 0):
            raise ValueError("trace timings must be positive")

    def as_dict(self) -> dict:
        return {"prompt": list(self.prompt), "tokens": list(self.tokens), "first_round_s": self.first_round_s,
                "step_s": self.step_s}

    @classmethod
    def from_dict(cls, body: dict) -> "Trace":
        return cls(tuple(int(t) for t in body["prompt"]), tuple(int(t) for t in body["tokens"]),
                   float(body["first_round_s"]), float(body["step_s"]))


@dataclass(frozen=True)
class ReplayedRound:
    nodes: int  # candidate rows verified (the pending row not counted)
    accepted: int  # published candidate rows
    emitted: int  # published tokens: accepted + the target's own
    gated: bool  # the gate cut the proposal
    propose_s: float  # the proposer's measured time


def trace_from_records(prompt: Sequence[int], tokens: Sequence[int], round_seconds: Sequence[float]) -> Trace:
    """A trace from a plain generation: `round_seconds` [rounds], one per generated token."""
    later = list(round_seconds[1:]) or list(round_seconds)
    return Trace(tuple(prompt), tuple(tokens), float(round_seconds[0]), float(statistics.median(later)))


def replay(
    trace: Trace,
    proposer: Proposer | Sequence[Proposer] | None,
    *,
    max_new_tokens: int,
    limits: TreeLimits,
    context_length: int,
    gate: CostGateConfig | None = None,
    policy: SamplingPolicy = SamplingPolicy(),
    seed: int = 0,
    target: TraceBackend | None = None,
) -> list[ReplayedRound]:
    """The rounds the engine runs on `trace`, run by the engine itself on a `TraceBackend`
    (`target`: one made for this trace, e.g. with its hidden states, that the proposers read);
    `max_new_tokens` is the limit the trace was made under."""
    if len(trace.tokens) > max_new_tokens:
        raise ValueError(f"the trace has {len(trace.tokens)} tokens, more than max_new_tokens={max_new_tokens}")
    # one proposer, or a union's members (their candidates merged by full prefix, as the engine does)
    proposers = [] if proposer is None else list(proposer) if isinstance(proposer, Sequence) else [proposer]
    if target is None:
        target = TraceBackend(trace.prompt, trace.tokens, context_length, trace_eos(trace, max_new_tokens))
    config = GenerationConfig(max_new_tokens=max_new_tokens, policy=policy, seed=seed, limits=limits, gate=gate)
    result = SpeculativeDecoder(target, proposers, replay_verifier(policy), config).generate(list(trace.prompt))
    if result.tokens[: len(trace.tokens)] != tuple(trace.tokens):  # the last bonus token is checked here
        raise TraceDiverged(f"the engine published {list(result.tokens)} on the trace {list(trace.tokens)}")
    phases = tuple(sorted({p.phase for p in proposers}))
    left = left_per_round(result.records, len(trace.tokens))  # [rounds]
    return [replayed(record, phases, n) for record, n in zip(result.records, left) if n > 0]


def trace_eos(trace: Trace, max_new_tokens: int) -> frozenset[int]:
    """The EOS set that ends the engine where `trace` ended (see the module note): none when the
    limit ended it, its last token when that token is new to the continuation, else none (the
    rounds past the trace are cut instead)."""
    last = trace.tokens[-1]
    if len(trace.tokens) == max_new_tokens or last in trace.tokens[:-1]:
        return frozenset()
    return frozenset({last})


def replay_verifier(policy: SamplingPolicy) -> Verifier:
    """A verifier that accepts exactly the target's own tokens, which a trace reveals: greedy at
    temperature 0, target-sample membership under sampling."""
    return GreedyVerifier() if policy.greedy else MembershipVerifier()


def left_per_round(records: Sequence[RoundRecord], trace_len: int) -> list[int]:
    """[rounds] trace tokens still unpublished when each round began (<= 0: past the trace)."""
    left, out = trace_len, []
    for record in records:
        out.append(left)
        left -= record.emitted
    return out


def replayed(record: RoundRecord, phases: Sequence[str], left: int) -> ReplayedRound:
    """One engine round as the replay reports it, cut to the `left` tokens the trace still held
    (`phases`: the ledger phases the proposers' time went to)."""
    emitted = min(record.emitted, left)
    propose_s = sum(record.seconds.get(phase, 0.0) for phase in phases)
    return ReplayedRound(record.nodes, min(record.accepted, emitted), emitted, record.gated, propose_s)


def predicted_seconds(trace: Trace, rounds: Sequence[ReplayedRound], profile: VerifyCostProfile) -> float:
    """Round 1 as measured, every later round step * t(1 + nodes), plus all proposing."""
    total = trace.first_round_s
    for round_ in rounds[1:]:
        total += trace.step_s * profile.relative_at(1 + round_.nodes)
    return total + sum(r.propose_s for r in rounds)
