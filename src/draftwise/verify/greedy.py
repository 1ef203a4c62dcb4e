"""Greedy match: descend while a child equals the target's argmax. Exact at temperature 0."""

from __future__ import annotations

import numpy as np

from draftwise.runtime.sampling import PositionDraws, SamplingPolicy
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits
from draftwise.verify.base import ALL_RELATIONS, ALL_SEMANTICS, ALL_TOPOLOGIES, Selection, VerifierCapabilities, child_with_token


class GreedyVerifier:
    capabilities = VerifierCapabilities(
        name="greedy", semantics=ALL_SEMANTICS, relations=ALL_RELATIONS, topologies=ALL_TOPOLOGIES,
        exact=True, greedy_only=True, any_candidates=True,
    )

    def select(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator,
        draws: PositionDraws | None = None,
    ) -> Selection:
        best = target.argmax()  # [1 + N]
        accepted: list[int] = []
        row = -1
        while True:
            child = child_with_token(round_, row, int(best[row + 1]))
            if child is None:
                return Selection(tuple(accepted), int(best[row + 1]))
            accepted.append(child)
            row = child
