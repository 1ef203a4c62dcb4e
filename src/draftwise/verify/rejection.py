"""One-draft rejection sampling (Leviathan et al.; Chen et al.) over a single chain.

At each drafted token x with proposal distribution q and target distribution p (both under
the same policy): accept with probability min(1, p(x) / q(x)); on rejection emit a sample
of the normalized residual (p - q)+ and stop; if the whole chain is accepted, the bonus
token is a sample of p at the last row.

The chain is tested in one vectorized step, as gpt-fast and vLLM do: one uniform per draft
drawn at once, the accept mask u < p(x)/q(x) over the whole chain, the first rejection read
off it, and one residual (or bonus) sample.  The uniforms past the first rejection are never
looked at, so each token is still accepted with probability min(1, p/q) given its prefix: the
law is the loop's, only the generator's stream is consumed differently.
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
        rows = chain_rows(round_)  # [n] candidate rows, root first
        path = [-1, *rows]  # the frontier, then every candidate row
        probs = target.probs_all(policy)  # [1 + N, V]
        at = np.array(path[:-1], dtype=np.int64) + 1  # [n]: the probs row each draft was drawn after
        q_at = [round_.q_dist[int(round_.source_id[c])][r] for c, r in zip(rows, path)]  # n x [V]
        tokens = round_.token_ids[rows]  # [n]
        q_x = np.array([q[x] for q, x in zip(q_at, tokens)], dtype=np.float64)  # [n]
        kept = first_rejection(rng.random(len(rows)) < accept_probabilities(probs[at, tokens], q_x))
        if kept == len(rows):  # the whole chain is accepted: the bonus is a sample of p after it
            return Selection(tuple(rows), sample(probs[path[-1] + 1], rng))
        return Selection(tuple(rows[:kept]), sample(residual(probs[at[kept]], q_at[kept]), rng))


def chain_rows(round_: CompiledRound) -> list[int]:
    """The candidate rows of a one-child-per-node round, root first."""
    rows: list[int] = []
    children = round_.children_of(-1)
    while children:
        (child,) = children  # a sequence: one child per node
        rows.append(child)
        children = round_.children_of(child)
    return rows


def accept_probabilities(p_x: np.ndarray, q_x: np.ndarray) -> np.ndarray:
    """min(1, p(x) / q(x)) per draft; [n] -> [n]."""
    if np.any(q_x <= 0.0):
        raise ContractError("a drafted token has q = 0 under the policy: it could not have been sampled")
    return np.minimum(1.0, p_x / q_x)


def first_rejection(accepted: np.ndarray) -> int:
    """Index of the first False in a bool mask [n] (n when all are True): the accepted prefix length."""
    return int(np.argmin(accepted)) if not accepted.all() else len(accepted)
