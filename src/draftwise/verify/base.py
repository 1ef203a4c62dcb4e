"""Verifier protocol, declared capabilities, and binding by capability negotiation.

`bind` runs before any target work: an incompatible proposer/verifier pair is refused with
the reason, and a heuristic verifier is never bound in exact mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, ProposerContract, SamplingRelation, TopologyKind
from draftwise.errors import ContractError
from draftwise.runtime.logits import NumpyLogits, TargetLogits, cached  # noqa: F401  (re-exported: the verifiers' inputs)
from draftwise.runtime.sampling import PositionDraws, SamplingPolicy
from draftwise.topology.compile import CompiledRound

ALL_SEMANTICS = frozenset(ProbabilitySemantics)
ALL_RELATIONS = frozenset(SamplingRelation)
ALL_TOPOLOGIES = frozenset(TopologyKind)


class IncompatibleVerifier(ContractError):
    """The verifier cannot prove exactness for this proposer, topology or policy."""


@dataclass(frozen=True)
class VerifierCapabilities:
    name: str
    semantics: frozenset[ProbabilitySemantics]
    relations: frozenset[SamplingRelation]
    topologies: frozenset[TopologyKind]
    exact: bool  # False: a heuristic, refused in exact mode
    greedy_only: bool = False  # exact only at temperature 0
    single_source: bool = False  # needs one proposal distribution, so one proposer
    # exact whatever candidates it is shown (greedy, membership): a cut of the proposal that
    # depends on the drawn tokens, like the cost gate's, keeps it exact.  Residual verifiers
    # are exact only when every draw is tested whatever its value
    any_candidates: bool = False


@dataclass(frozen=True)
class Selection:
    accepted_rows: tuple[int, ...]  # candidate rows on one root-to-node path, root first
    bonus_token: int  # sampled from the target (or residual) after the last accepted row


class Verifier(Protocol):
    capabilities: VerifierCapabilities

    def select(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator,
        draws: PositionDraws | None = None,
    ) -> Selection: ...


def bind(
    verifier: Verifier, contracts: Sequence[ProposerContract], policy: SamplingPolicy, exact: bool = True
) -> Verifier:
    """Return `verifier` if it can serve every contract under `policy`; raise otherwise."""
    caps = verifier.capabilities
    if exact and not caps.exact:
        raise IncompatibleVerifier(
            f"verifier {caps.name!r} is a heuristic and is refused in exact mode (pass allow_heuristic to use it)"
        )
    if caps.greedy_only and not policy.greedy:
        raise IncompatibleVerifier(
            f"verifier {caps.name!r} is exact only at temperature 0, but the policy has temperature "
            f"{policy.temperature}; use 'membership' (any proposer) or a rejection-sampling verifier"
        )
    if caps.single_source and len(contracts) > 1:
        raise IncompatibleVerifier(
            f"verifier {caps.name!r} needs one proposal distribution; {len(contracts)} proposers were given "
            "(a heterogeneous tree is verified by membership)"
        )
    for contract in contracts:
        problems = []
        if contract.semantics not in caps.semantics:
            problems.append(f"probability semantics {contract.semantics.value}")
        if contract.relation not in caps.relations:
            problems.append(f"sampling relation {contract.relation.value}")
        if contract.topology not in caps.topologies:
            problems.append(f"topology {contract.topology.value}")
        if problems:
            raise IncompatibleVerifier(
                f"verifier {caps.name!r} cannot verify proposals with {', '.join(problems)}; it accepts "
                f"semantics {sorted(s.value for s in caps.semantics)}, relations "
                f"{sorted(r.value for r in caps.relations)}, topologies {sorted(t.value for t in caps.topologies)}"
            )
    return verifier


def child_with_token(round_: CompiledRound, row: int, token: int) -> int | None:
    """The child row of `row` (-1 = frontier) carrying `token`, if any (full-prefix merge makes it unique)."""
    for child in round_.children_of(row):
        if round_.token_ids[child] == token:
            return child
    return None
