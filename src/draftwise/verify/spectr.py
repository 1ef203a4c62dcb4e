"""SpecTr k-sequential selection (K-SEQ; Sun et al. 2023) for a one-position set of k i.i.d.
drafts from q.

With a scale rho in [1, k], each draft x is accepted with probability min(1, p(x) / (rho q(x))),
tested in draw order; the first accepted draft is emitted.  One draft is accepted with
probability beta = sum_y min(q(y), p(y)/rho), so token y is emitted by acceptance with
probability min(q(y), p(y)/rho) * (1 - (1-beta)^k) / beta, and with probability (1-beta)^k
every draft is rejected and the token comes from the residual

    p_res(y) = (p(y) - min(q(y), p(y)/rho) * (1 - (1-beta)^k) / beta) / (1-beta)^k,

which makes the output exactly p.  p_res is non-negative whenever
rho * beta(rho) >= 1 - (1-beta(rho))^k; the smallest such rho maximizes acceptance (the
paper's rho*), found by bisection (the left side grows with rho, the right side shrinks).
rho = k is always feasible by Bernoulli's inequality.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, SamplingRelation, TopologyKind
from draftwise.errors import ContractError
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits
from draftwise.verify.base import Selection, VerifierCapabilities
from draftwise.verify.specinfer import NodeDecision, Pick, ResidualTreeVerifier

_BISECTION_STEPS = 80  # halves [1, k] to below float64 resolution


def _beta(p: np.ndarray, q: np.ndarray, rho: float) -> float:
    return float(np.minimum(q, p / rho).sum())


def _shortfall(p: np.ndarray, q: np.ndarray, k: int, rho: float) -> float:
    """rho * beta - (1 - (1 - beta)^k); >= 0 means the residual is non-negative."""
    beta = _beta(p, q, rho)
    return rho * beta - (1.0 - (1.0 - beta) ** k)


def spectr_rho(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """Smallest feasible rho in [1, k] (returned from the feasible side of the bisection)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if _shortfall(p, q, k, 1.0) >= 0.0:
        return 1.0
    lo, hi = 1.0, float(k)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if _shortfall(p, q, k, mid) >= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def spectr_node(p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
    """K-SEQ over i.i.d. drafts `tokens` (draw order, duplicates kept); p, q: [V]."""
    k = len(tokens)
    rho = spectr_rho(p, q, k)
    accepted_mass = np.minimum(q, p / rho)  # [V], P(one draft is y and is accepted)
    beta = float(accepted_mass.sum())
    gain = (1.0 - (1.0 - beta) ** k) / beta if beta > 0.0 else float(k)  # limit as beta -> 0
    leftover = np.maximum(p - accepted_mass * gain, 0.0)  # [V], (1-beta)^k * p_res
    total = leftover.sum()
    res = p if total <= 0.0 else leftover / total  # empty only when rejection is impossible
    stay = 1.0
    accept = np.zeros(k)  # [k]
    for i, x in enumerate(tokens):
        if q[x] <= 0.0:
            raise ContractError("a drafted token has q = 0 under the policy: it could not have been sampled")
        a = min(1.0, float(p[x]) / (rho * float(q[x])))
        accept[i] = stay * a
        stay *= 1.0 - a
    return NodeDecision(accept, res)


class SpecTrVerifier(ResidualTreeVerifier):
    capabilities = VerifierCapabilities(
        name="spectr",
        semantics=frozenset({ProbabilitySemantics.NORMALIZED_CONDITIONAL}),
        relations=frozenset({SamplingRelation.IID}),
        topologies=frozenset({TopologyKind.SET}),
        exact=True,
        single_source=True,
    )

    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        return spectr_node(p, q, tokens)

    def select_with(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, pick: Pick
    ) -> Selection:
        if round_.n and int(round_.depth.max()) > 1:
            # K-SEQ's rho is proved for one position; deeper nodes need a tree verifier
            raise ContractError("SpecTr k-sequential selection verifies a one-position set, not a tree")
        return super().select_with(round_, target, policy, pick)
