"""One-draft rejection sampling (Leviathan et al.; Chen et al.) over a single chain.

At each drafted token x with proposal distribution q and target distribution p (both under
the same policy): accept with probability min(1, p(x) / q(x)); on rejection emit a sample
of the normalized residual (p - q)+ and stop; if the whole chain is accepted, the bonus
token is a sample of p at the last row.

All the accept uniforms are drawn at once, as gpt-fast and vLLM do, and the first rejection
is the first draft whose uniform is not below p(x)/q(x); the uniforms past it are never looked
at, so each draft is still accepted with probability min(1, p/q) given its prefix: the law is
the one-at-a-time loop's, only the generator's stream is consumed differently (n + 1 draws
for n drafts, whatever the outcome).  The rows are read in order up to the first rejection:
logits on an accelerator hand over every row after one batched pass (no sync per node), and
host logits then compute only the rows the chain reaches.
"""

from __future__ import annotations

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, SamplingRelation, TopologyKind
from draftwise.errors import ContractError
from draftwise.runtime.sampling import PositionDraws, SamplingPolicy, sample
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits
from draftwise.verify.base import Selection, VerifierCapabilities


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
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator,
        draws: PositionDraws | None = None,
    ) -> Selection:
        rows = chain_rows(round_)  # [n] candidate rows, root first
        path = [-1, *rows]  # path[i]: the row draft i was drawn after (-1 = frontier)
        uniforms = rng.random(len(rows))  # [n], one per draft, drawn at once
        for i, (row, child) in enumerate(zip(path, rows)):
            p = target.probs(row + 1, policy)  # [V]
            q = round_.q_dist[int(round_.source_id[child])][row]  # [V], the distribution the draft was drawn from
            x = int(round_.token_ids[child])
            if not uniforms[i] < accept_probability(float(p[x]), float(q[x])):
                return Selection(tuple(rows[:i]), sample(residual(p, q), rng))
        return Selection(tuple(rows), sample(target.probs(path[-1] + 1, policy), rng))  # the bonus after the chain


def chain_rows(round_: CompiledRound) -> list[int]:
    """The candidate rows of a one-child-per-node round, root first."""
    rows: list[int] = []
    children = round_.children_of(-1)
    while children:
        (child,) = children  # a sequence: one child per node
        rows.append(child)
        children = round_.children_of(child)
    return rows
