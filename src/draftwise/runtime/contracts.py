"""Data contracts shared by proposers, the topology compiler, verifiers and the engine.

A proposer says what its numbers mean (`ProbabilitySemantics`), how its candidates were
drawn (`SamplingRelation`) and how they are arranged (`TopologyKind`).  Verifiers declare
which combinations they can prove exact; `verify.base.bind` refuses the rest before any
target work.  q (a normalized conditional probability) and score (anything else) are
separate fields: nothing in draftwise casts one into the other.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from draftwise.errors import ContractError


class ManifestMismatch(ContractError):
    """A proposal or artifact was made under another round manifest."""


class ProbabilitySemantics(str, enum.Enum):
    NORMALIZED_CONDITIONAL = "normalized_conditional"  # q(token | full prefix), sums to 1 per parent
    SCORE_ONLY = "score_only"  # a ranking or logit-like score with no probability meaning
    FREQUENCY = "frequency"  # corpus counts (retrieval tries)
    ABSENT = "absent"  # no number at all (prompt lookup)


class SamplingRelation(str, enum.Enum):
    IID = "iid"  # siblings drawn independently from q
    WITHOUT_REPLACEMENT = "without_replacement"  # siblings drawn from q with earlier ones removed
    BEAM = "beam"  # top-scoring continuations
    DETERMINISTIC_LOOKUP = "deterministic_lookup"  # copied or retrieved, no randomness


class TopologyKind(str, enum.Enum):
    SEQUENCE = "sequence"  # one chain
    SET = "set"  # several candidates for one position only
    TREE = "tree"  # prefix tree


@dataclass(frozen=True)
class ProposerContract:
    """What a proposer promises about every result it will return; known before any work."""

    semantics: ProbabilitySemantics
    relation: SamplingRelation
    topology: TopologyKind


@dataclass(frozen=True)
class ProposalNode:
    """One proposed token.  `parent` indexes the same result's nodes (-1: child of the frontier)."""

    token: int
    parent: int
    depth: int  # 1 for children of the frontier (the pending token)
    q: float | None = None  # proposal probability; only under NORMALIZED_CONDITIONAL
    score: float | None = None  # frequency or score; never a probability
    source: str = ""


@dataclass(frozen=True, eq=False)
class ProposalResult:
    """A typed proposal.  Under NORMALIZED_CONDITIONAL, `distributions[parent]` holds the
    whole proposal distribution [V] from which the children of `parent` were drawn (-1 for
    the frontier): a residual update needs the vector, not only q(token)."""

    nodes: tuple[ProposalNode, ...]
    contract: ProposerContract
    source: str
    manifest_hash: str
    distributions: Mapping[int, np.ndarray] = field(default_factory=dict)
    state: Any = None  # the proposer's own handle on its provisional state, handed back by `observe`
    # the proposer's own split of its time (e.g. a head stage per tree level: "head1", "head2");
    # part of the "propose" phase, recorded beside it in the round ledger
    seconds: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate_result(self)

    @property
    def semantics(self) -> ProbabilitySemantics:
        return self.contract.semantics

    @property
    def relation(self) -> SamplingRelation:
        return self.contract.relation

    @property
    def topology(self) -> TopologyKind:
        return self.contract.topology

    def path(self, index: int) -> tuple[int, ...]:
        """Full token path from the frontier down to node `index`."""
        tokens: list[int] = []
        while index != -1:
            node = self.nodes[index]
            tokens.append(node.token)
            index = node.parent
        return tuple(reversed(tokens))


def _validate_result(result: ProposalResult) -> None:
    normalized = result.semantics is ProbabilitySemantics.NORMALIZED_CONDITIONAL
    children: dict[int, int] = {}
    for i, node in enumerate(result.nodes):
        if not -1 <= node.parent < i:
            raise ContractError(f"{result.source}: node {i} has parent {node.parent}; parents must come first")
        expected_depth = 1 if node.parent == -1 else result.nodes[node.parent].depth + 1
        if node.depth != expected_depth:
            raise ContractError(f"{result.source}: node {i} has depth {node.depth}, expected {expected_depth}")
        if node.token < 0:
            raise ContractError(f"{result.source}: node {i} has negative token id {node.token}")
        if normalized and node.q is None:
            raise ContractError(f"{result.source}: normalized_conditional node {i} lacks q")
        if not normalized and node.q is not None:
            raise ContractError(
                f"{result.source}: node {i} carries q under {result.semantics.value} semantics; "
                "a frequency or score is never a probability"
            )
        if normalized and node.parent not in result.distributions:
            raise ContractError(
                f"{result.source}: no proposal distribution for parent {node.parent} of node {i}"
            )
        children[node.parent] = children.get(node.parent, 0) + 1
    topo = result.topology
    if topo is TopologyKind.SEQUENCE and any(n > 1 for n in children.values()):
        raise ContractError(f"{result.source}: a sequence proposal has a node with several children")
    if topo is TopologyKind.SET and any(node.parent != -1 for node in result.nodes):
        raise ContractError(f"{result.source}: a one-position set may only hold children of the frontier")


@dataclass(frozen=True)
class RoundManifest:
    """Everything a round's numbers depend on; frozen before the first proposal."""

    target_checkpoint: str
    tokenizer_hash: str
    sampling_policy: Mapping[str, Any]
    proposers: tuple[Mapping[str, Any], ...]
    compiler_version: str
    max_nodes: int
    max_depth: int
    verifier: str
    exact: bool
    backend: str
    dtype: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str, separators=(",", ":"))

    @functools.cached_property
    def hash(self) -> str:  # computed once: every proposal of every round is checked against it
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def check(self, result: ProposalResult) -> None:
        if result.manifest_hash != self.hash:
            raise ManifestMismatch(
                f"proposal from {result.source!r} was made under manifest {result.manifest_hash[:12]}…, "
                f"but this round runs under {self.hash[:12]}…"
            )
