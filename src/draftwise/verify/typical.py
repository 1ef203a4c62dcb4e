"""Typical acceptance (Medusa; Cai et al. 2024): a heuristic, NOT exact.

A drafted token x under target p is accepted when p(x) > min(epsilon, delta * exp(-H(p))):
plausible tokens pass even if the target would rarely sample them, so the output law is not
p.  `bind` therefore refuses it in exact mode.  The longest accepted root-to-node path wins
(earliest row on ties); the bonus is a sample of p at its end (argmax at temperature 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from draftwise.runtime.contracts import TopologyKind
from draftwise.runtime.sampling import PositionDraws, SamplingPolicy, sample
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits
from draftwise.verify.base import ALL_RELATIONS, ALL_SEMANTICS, Selection, VerifierCapabilities


def entropy(p: np.ndarray) -> float:
    """Shannon entropy (nats) of p [V]; zero-probability tokens contribute nothing."""
    nz = p[p > 0.0]
    return float(-(nz * np.log(nz)).sum())


def typical_threshold(p: np.ndarray, epsilon: float, delta: float) -> float:
    return min(epsilon, delta * float(np.exp(-entropy(p))))


def typical_accepts(p: np.ndarray, token: int, epsilon: float, delta: float) -> bool:
    return bool(p[token] > typical_threshold(p, epsilon, delta))


@dataclass(frozen=True)
class TypicalVerifier:
    epsilon: float = 0.09  # hard threshold (Medusa's default)
    delta: float = 0.3  # entropy-adaptive threshold scale

    capabilities = VerifierCapabilities(
        name="typical", semantics=ALL_SEMANTICS, relations=ALL_RELATIONS,
        topologies=frozenset({TopologyKind.TREE}), exact=False,
    )

    def select(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator,
        draws: PositionDraws | None = None,
    ) -> Selection:
        # rows come parent-before-child, so one forward pass knows whether each parent passed
        passed = np.zeros(round_.n, dtype=bool)  # [N]: row and all its ancestors accepted
        probs: dict[int, np.ndarray] = {}
        best = -1
        for r in range(round_.n):
            parent = int(round_.parent[r])
            if parent >= 0 and not passed[parent]:
                continue
            if parent not in probs:
                probs[parent] = target.probs(parent + 1, policy)  # [V]
            if typical_accepts(probs[parent], int(round_.token_ids[r]), self.epsilon, self.delta):
                passed[r] = True
                if best == -1 or round_.depth[r] > round_.depth[best]:
                    best = r
        path: list[int] = []
        row = best
        while row != -1:
            path.append(row)
            row = int(round_.parent[row])
        bonus = sample(target.probs(best + 1, policy), rng)
        return Selection(tuple(reversed(path)), bonus)
