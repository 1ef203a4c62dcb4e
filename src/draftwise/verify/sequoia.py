"""Sequoia verification of siblings drawn WITHOUT replacement (Chen et al. 2024, Algorithm 2).

Draft i at a node is drawn from Q_i = q with the earlier siblings removed, renormalized; once
q's mass is exhausted (fewer tokens in q's support than siblings) the next sibling is drawn
uniformly from the tokens not yet sampled.  Verification replays the same Q_i: accept x_i with
min(1, r(x_i)/Q_i(x_i)); after a rejection r := normalize((r - Q_i)+) and Q_{i+1} removes x_i.

Why it is exact: the one-draft lemma holds for whatever distribution Q_i the draft came from,
and the residual after a rejection, normalize((r - Q_i)+), does not depend on which x_i was
rejected, so the backward induction of SpecInfer goes through with the per-step Q_i.  A
rejected x_i has r(x_i) < Q_i(x_i), so r is zero on every sampled token and the uniform
fallback (support = unsampled tokens) still covers r.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, SamplingRelation, TopologyKind
from draftwise.errors import ContractError
from draftwise.verify.base import VerifierCapabilities
from draftwise.verify.rejection import accept_probability, residual
from draftwise.verify.specinfer import NodeDecision, ResidualTreeVerifier


def without_replacement_q(q: np.ndarray, sampled: Sequence[int]) -> np.ndarray:
    """Distribution [V] of the next sibling after `sampled` were drawn from q [V].
    A draft-model proposer drawing without replacement must sample from exactly this."""
    taken = list(sampled)
    rest = np.array(q, dtype=np.float64)  # [V]
    rest[taken] = 0.0
    total = rest.sum()
    if total > 0.0:
        return np.asarray(rest / total)
    uniform = np.ones_like(rest)  # [V]: q exhausted, Sequoia's fallback
    uniform[taken] = 0.0
    if uniform.sum() == 0.0:
        raise ContractError(f"{len(taken)} siblings already cover the whole vocabulary; no token is left to draw")
    return np.asarray(uniform / uniform.sum())


def sequoia_node(p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
    """Sequoia test of siblings `tokens` (draw order) drawn without replacement from q [V]."""
    r = p  # [V] running residual
    stay = 1.0
    accept = np.zeros(len(tokens))  # [k]
    sampled: list[int] = []
    for i, x in enumerate(tokens):
        if x in sampled:
            raise ContractError(f"token {x} was drawn twice under without_replacement sampling")
        q_i = without_replacement_q(q, sampled)  # [V], what draft i was actually drawn from
        a = accept_probability(float(r[x]), float(q_i[x]))
        accept[i] = stay * a
        stay *= 1.0 - a
        r = residual(r, q_i)
        sampled.append(x)
    return NodeDecision(accept, r)


class SequoiaVerifier(ResidualTreeVerifier):
    capabilities = VerifierCapabilities(
        name="sequoia",
        semantics=frozenset({ProbabilitySemantics.NORMALIZED_CONDITIONAL}),
        relations=frozenset({SamplingRelation.WITHOUT_REPLACEMENT}),
        # a one-position set of siblings drawn without replacement is a depth-1 tree: the node
        # rule above is all Sequoia does there (a width-W, depth-1 draft template is declared a set)
        topologies=frozenset({TopologyKind.TREE, TopologyKind.SET}),
        exact=True,
        single_source=True,
    )

    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        return sequoia_node(p, q, tokens)
