"""Verifier names, and the automatic choice for a set of proposer contracts and a policy."""

from __future__ import annotations

from typing import Callable, Sequence

from draftwise.runtime.contracts import ProbabilitySemantics, ProposerContract, SamplingRelation, TopologyKind
from draftwise.errors import InputError
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.base import Verifier
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier
from draftwise.verify.rejection import RejectionVerifier
from draftwise.verify.sequoia import SequoiaVerifier
from draftwise.verify.specinfer import SpecInferVerifier
from draftwise.verify.spectr import SpecTrVerifier
from draftwise.verify.typical import TypicalVerifier

VERIFIERS: dict[str, Callable[[], Verifier]] = {
    "greedy": GreedyVerifier,
    "membership": MembershipVerifier,
    "rejection": RejectionVerifier,
    "specinfer": SpecInferVerifier,
    "sequoia": SequoiaVerifier,
    "spectr": SpecTrVerifier,
    "typical": TypicalVerifier,
}

# The exact verifier that uses q best for each single-proposer contract shape.
_BY_SHAPE = {
    (SamplingRelation.IID, TopologyKind.SEQUENCE): "rejection",
    (SamplingRelation.IID, TopologyKind.TREE): "specinfer",
    (SamplingRelation.IID, TopologyKind.SET): "spectr",
    (SamplingRelation.WITHOUT_REPLACEMENT, TopologyKind.TREE): "sequoia",
    # without it a sampled depth-1 draft template (a set) fell to membership, which ignores q
    (SamplingRelation.WITHOUT_REPLACEMENT, TopologyKind.SET): "sequoia",
}


def auto_verifier_name(contracts: Sequence[ProposerContract], policy: SamplingPolicy) -> str:
    """Greedy at temperature 0; a residual verifier when one proposer gives normalized q in a
    shape it proves; target-sample membership otherwise (exact for anything)."""
    if policy.greedy:
        return "greedy"
    if len(contracts) == 1 and contracts[0].semantics is ProbabilitySemantics.NORMALIZED_CONDITIONAL:
        name = _BY_SHAPE.get((contracts[0].relation, contracts[0].topology))
        if name:
            return name
    return "membership"


def make_verifier(name: str, contracts: Sequence[ProposerContract], policy: SamplingPolicy) -> Verifier:
    if name == "auto":
        name = auto_verifier_name(contracts, policy)
    if name not in VERIFIERS:
        raise InputError(f"unknown verifier {name!r}; choose auto or one of {', '.join(VERIFIERS)}")
    return VERIFIERS[name]()
