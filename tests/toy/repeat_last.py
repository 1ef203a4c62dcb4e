"""A test-only drafter family, added as a new family is: this one module, plus one
registration (`DRAFTERS.with_family(FAMILY)` here; a line in `proposers/registry.py` for one
the library ships).  It proposes the last committed token repeated `repeat` times."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract
from draftwise.runtime.contracts import SamplingRelation, TopologyKind
from draftwise.errors import InputError
from draftwise.options import option
from draftwise.proposers.base import RoundFeedback
from draftwise.proposers.family import CandidateShape, DrafterFamily
from draftwise.runtime.sampling import SamplingPolicy

CONTRACT = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.SEQUENCE)


@dataclass(frozen=True)
class RepeatLastConfig:
    repeat: int = option(3, help="how many copies of the last token to propose")

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise InputError(f"repeat must be >= 1, got {self.repeat}")


class RepeatLastProposer:
    name, phase, contract = "repeat-last", "propose", CONTRACT

    def __init__(self, config: RepeatLastConfig) -> None:
        self.config = config
        self.accepted: list[int] = []  # what `observe` was told, round by round

    def identity(self) -> dict:
        return {"name": self.name, "repeat": self.config.repeat}

    def begin(self, policy: SamplingPolicy, rng: np.random.Generator) -> None:
        self.accepted = []

    def propose(self, context: Sequence[int], manifest_hash: str, max_depth: int | None = None) -> ProposalResult:
        depth = self.config.repeat if max_depth is None else min(self.config.repeat, max_depth)
        nodes = tuple(ProposalNode(token=int(context[-1]), parent=d - 2, depth=d, source=self.name)
                      for d in range(1, depth + 1))
        return ProposalResult(nodes, CONTRACT, self.name, manifest_hash)

    def observe(self, feedback: RoundFeedback) -> None:
        self.accepted.append(len(feedback.accepted))


FAMILY = DrafterFamily(
    name="repeat-last",
    config=RepeatLastConfig,
    contract=lambda config: CONTRACT,
    shape=lambda config: CandidateShape(config.repeat, config.repeat, False),
    build=lambda config, resources: RepeatLastProposer(config),
    summary="the last token, repeated",
    free_to_ask=True,
)
