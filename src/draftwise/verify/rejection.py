"""One-draft rejection sampling (Leviathan et al.; Chen et al.) over a single chain.

At each drafted token x with proposal distribution q and target distribution p (both under
the same policy): accept with probability min(1, p(x) / q(x)); on rejection emit a sample
of the normalized residual (p - q)+ and stop; if the whole chain is accepted, the bonus
token is a sample of p at the last row.
"""

from __future__ import annotations

import numpy as np

from draftwise.contracts import ContractError, ProbabilitySemantics, SamplingRelation, TopologyKind
from draftwise.sampling import SamplingPolicy, sample
from draftwise.topology.compile import CompiledRound
from draftwise.verify.base import Selection, TargetLogits, VerifierCapabilities


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalize((p - q)+); when p == q exactly the residual is empty and p itself is returned
    (a rejection then has probability zero, so the choice never matters for the marginal)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return p if total <= 0.0 else r / total


def accept_probability(p_x: float, q_x: float) -> float:
    if q_x <= 0.0:
        raise ContractError("a drafted token has q = 0 under the policy: it could not have been sampled")
    return min(1.0, p_x / q_x)


class RejectionVerifier:
    capabilities = VerifierCapabilities(
        name="rejection",
        semantics=frozenset({ProbabilitySemantics.NORMALIZED_CONDITIONAL}),
        relations=frozenset({SamplingRelation.IID}),
        topologies=frozenset({TopologyKind.SEQUENCE}),
        exact=True,
        single_source=True,
    )

    def select(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator
    ) -> Selection:
        accepted: list[int] = []
        row = -1
        while True:
            p = target.probs(row + 1, policy)  # [V]
            children = round_.children_of(row)
            if not children:
                return Selection(tuple(accepted), sample(p, rng))
            (child,) = children  # a sequence: one child per node
            q = round_.q_dist[int(round_.source_id[child])][row]  # [V], the distribution x was drawn from
            x = int(round_.token_ids[child])
            if rng.random() < accept_probability(float(p[x]), float(q[x])):
                accepted.append(child)
                row = child
                continue
            return Selection(tuple(accepted), sample(residual(p, q), rng))
