"""Replaying a configuration's rounds on a plain decoding trace, without the target.

A trace is what the target did alone: the prompt, its continuation, the measured seconds of
its first round (prompt read + first token) and of an ordinary one-row step.  For a proposer
whose candidates are a function of the context (prompt lookup, REST, a greedy draft model),
a verifier that accepts a candidate exactly when it is the target's own token (greedy; and
membership under sampling, whose target sample at each depth is distributed as the trace's
token there) accepts along the trace: walking the trace's tokens down the proposal gives the
accepted length, and the next trace token is the bonus.  Under greedy decoding the replayed
rounds ARE the rounds the engine runs (the tests compare them round by round); under
sampling they have the same distribution.  The cost gate is replayed with them: it sees the
same published tokens the engine would show it.

Time is then predicted, not measured: a later round of n rows costs step * t(n) (the
measured verify profile), round 1 the trace's measured first round (the candidate rows ride
in the prompt's forward), and every round the proposer's own time, measured during the
replay.  What the replay cannot do is a sampling draft model: its verifier accepts with
min(1, p/q), which a single trace token does not reveal.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from draftwise.engine import round_limits
from draftwise.gate import CostGate, CostGateConfig, gate_round
from draftwise.cost_profile import VerifyCostProfile
from draftwise.proposers.base import Proposer
from draftwise.sampling import SamplingPolicy
from draftwise.topology.compile import CompiledRound, TreeLimits, compile_round

REPLAY_MANIFEST = "replay"  # proposals are replayed outside any decoder's round manifest


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


def accepted_along(round_: CompiledRound, future: Sequence[int]) -> int:
    """How far `future` (the target's own next tokens) walks down the proposal from the frontier."""
    parent, accepted = -1, 0
    for token in future:
        match = next((row for row in round_.children_of(parent) if int(round_.token_ids[row]) == int(token)), None)
        if match is None:
            break
        accepted, parent = accepted + 1, match
    return accepted


def replay(
    trace: Trace,
    proposer: Proposer | None,
    *,
    max_new_tokens: int,
    limits: TreeLimits,
    context_length: int,
    gate: CostGateConfig | None = None,
    policy: SamplingPolicy = SamplingPolicy(),
    seed: int = 0,
) -> list[ReplayedRound]:
    """The rounds the engine would run on `trace` (the same limits, gate and first-round rule
    as `SpeculativeDecoder._round`); `max_new_tokens` is the limit the trace was made under."""
    if len(trace.tokens) > max_new_tokens:
        raise ValueError(f"the trace has {len(trace.tokens)} tokens, more than max_new_tokens={max_new_tokens}")
    if proposer is not None:
        proposer.begin(policy, np.random.default_rng(seed))
    state = CostGate(gate) if gate is not None else None
    context, produced, rounds = list(trace.prompt), 0, []
    while produced < len(trace.tokens):
        this_round = round_limits(limits, len(context), context_length, max_new_tokens - produced)
        asked = proposer is not None and this_round.max_depth > 0
        clock = time.perf_counter()
        results = [proposer.propose(context, REPLAY_MANIFEST, max_depth=this_round.max_depth)] if asked else []
        propose_s = time.perf_counter() - clock
        offered = compile_round(len(context), results, this_round)
        # the engine's rule: round 1 reads the prompt's unread tokens in its forward (a one-token
        # prompt has none to read)
        round_, gated = gate_round(state, offered, reads_prompt=produced == 0 and len(trace.prompt) > 1)
        future = trace.tokens[produced:]
        accepted = accepted_along(round_, future)
        decided = list(future[: accepted + 1])  # accepted candidates, then the target's own token
        emitted = len(decided)  # shorter only where the trace ends on an accepted EOS
        if proposer is not None:
            proposer.observe(accepted)
        if state is not None:
            state.observe(offered if asked else None, decided)
        rounds.append(ReplayedRound(round_.n, min(accepted, emitted), emitted, gated, propose_s))
        context.extend(decided)
        produced += emitted
    return rounds


def predicted_seconds(trace: Trace, rounds: Sequence[ReplayedRound], profile: VerifyCostProfile) -> float:
    """Round 1 as measured, every later round step * t(1 + nodes), plus all proposing."""
    total = trace.first_round_s
    for round_ in rounds[1:]:
        total += trace.step_s * profile.relative_at(1 + round_.nodes)
    return total + sum(r.propose_s for r in rounds)
