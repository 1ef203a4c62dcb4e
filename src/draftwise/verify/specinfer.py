"""SpecInfer multi-step residual verification over a tree of i.i.d. drafts (Miao et al. 2023),
and the residual tree walk that Sequoia and SpecTr reuse.

At one node with target p and proposal q the drafts x_1..x_k are tested in draw order against
a running residual r (starting at p): accept x_i with min(1, r(x_i)/q(x_i)); after a rejection
r := normalize((r - q)+).  If every draft is rejected the emitted token is a sample of r.  By
the one-draft lemma applied from the last draft backwards, the emitted token is distributed
as p for every k.

Duplicates matter.  The compiler merges equal sibling tokens into one row, but the lemma needs
every DRAW tested, duplicates included: a rejected duplicate still advances the residual, and
testing only the distinct rows biases the output (oracles.multi_candidate proves both).  So
the walk reads the draw sequence from `round_.origin`, not `children_of`.

Per-node math is a pure function of numpy vectors returning a `NodeDecision` (the exact
probability of every outcome), so the oracles enumerate it without sampling; the walk is
parameterized by a `pick` function so the oracles can enumerate whole rounds too.
"""

from __future__ import annotations

import abc

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from draftwise.runtime.contracts import ProbabilitySemantics, SamplingRelation, TopologyKind
from draftwise.errors import ContractError
from draftwise.runtime.sampling import PositionDraws, SamplingPolicy, sample
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits
from draftwise.verify.base import Selection, VerifierCapabilities
from draftwise.verify.rejection import accept_probability, residual

# pick(weights [n], non-negative, not necessarily normalized) -> chosen index.  In `select` it
# samples with the round's generator; the oracles substitute an exhaustive enumerator.
Pick = Callable[[np.ndarray], int]


def rng_pick(rng: np.random.Generator) -> Pick:
    return lambda weights: sample(np.asarray(weights, dtype=np.float64), rng)


@dataclass(frozen=True, eq=False)
class NodeDecision:
    """Exact outcome law of one node: draw i is the accepted one with probability accept[i]
    (at most one is); with the remaining mass every draw is rejected and the emitted token is
    a sample of `residual`."""

    accept: np.ndarray  # [k] float64
    residual: np.ndarray  # [V] float64, normalized

    @property
    def reject_mass(self) -> float:
        return max(0.0, 1.0 - float(self.accept.sum()))

    def outcome_weights(self) -> np.ndarray:  # [k + 1]: draws 0..k-1 accepted, then "all rejected"
        return np.append(self.accept, self.reject_mass)

    def marginal(self, tokens: Sequence[int]) -> np.ndarray:  # [V]: law of the emitted token
        out = self.reject_mass * self.residual
        for i, x in enumerate(tokens):
            out[x] += self.accept[i]
        return out


def specinfer_node(p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
    """Multi-step residual test of i.i.d. drafts `tokens` (draw order, duplicates kept).
    p, q: [V] target and proposal distributions under the same policy."""
    r = p  # [V] running residual
    stay = 1.0  # probability that every earlier draft was rejected
    accept = np.zeros(len(tokens))  # [k]
    for i, x in enumerate(tokens):
        a = accept_probability(float(r[x]), float(q[x]))
        accept[i] = stay * a
        stay *= 1.0 - a
        r = residual(r, q)
    return NodeDecision(accept, r)


def draw_rows(round_: CompiledRound, row: int) -> tuple[int, ...]:
    """Rows of every draw under `row` (-1 = frontier) in draw order, duplicates repeated.

    Read from `origin`, which records the row every input node landed on; a single-source
    round is required because one sequence of draws from one q is what the lemma is about."""
    children = round_.children_of(row)
    if not children:
        return ()
    source = int(round_.source_id[children[0]])
    draws = tuple(r for r in round_.origin[source] if r >= 0 and int(round_.parent[r]) == row)
    if set(draws) != set(children):
        raise ContractError(
            f"children of row {row} come from several proposers; a residual verifier needs one "
            "proposal distribution (verify heterogeneous trees by membership)"
        )
    return draws


def proposal_at(round_: CompiledRound, row: int, child: int) -> np.ndarray:
    """The proposal distribution [V] the children of `row` were drawn from."""
    source = int(round_.source_id[child])
    q = round_.q_dist[source].get(row) if source < len(round_.q_dist) else None
    if q is None:
        raise ContractError(
            f"no proposal distribution for the children of row {row} from {round_.sources[source]!r}; "
            "residual verification needs normalized_conditional proposals"
        )
    return q


class ResidualTreeVerifier(abc.ABC):
    """Shared walk: at each node decide among the draws, descend into the accepted one, or
    emit a residual sample; at a node without draws emit a sample of p (the bonus).
    Subclasses supply `node_decision` (the per-node law) and may override `draws`."""

    capabilities: VerifierCapabilities

    @abc.abstractmethod
    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        """The exact outcome law at one node (SpecInfer, Sequoia and SpecTr differ only here)."""

    def draws(self, round_: CompiledRound, row: int) -> tuple[int, ...]:
        return draw_rows(round_, row)

    def select(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator,
        draws: PositionDraws | None = None,
    ) -> Selection:
        return self.select_with(round_, target, policy, rng_pick(rng))

    def select_with(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, pick: Pick
    ) -> Selection:
        accepted: list[int] = []
        row = -1
        while True:
            p = target.probs(row + 1, policy)  # [V]
            draws = self.draws(round_, row)
            if not draws:
                return Selection(tuple(accepted), int(pick(p)))
            q = proposal_at(round_, row, draws[0])  # [V]
            tokens = [int(round_.token_ids[d]) for d in draws]
            decision = self.node_decision(p, q, tokens)
            i = int(pick(decision.outcome_weights()))
            if i == len(draws):
                return Selection(tuple(accepted), int(pick(decision.residual)))
            accepted.append(draws[i])
            row = draws[i]


class SpecInferVerifier(ResidualTreeVerifier):
    capabilities = VerifierCapabilities(
        name="specinfer",
        semantics=frozenset({ProbabilitySemantics.NORMALIZED_CONDITIONAL}),
        relations=frozenset({SamplingRelation.IID}),
        topologies=frozenset({TopologyKind.TREE}),
        exact=True,
        single_source=True,
    )

    def node_decision(self, p: np.ndarray, q: np.ndarray, tokens: Sequence[int]) -> NodeDecision:
        return specinfer_node(p, q, tokens)
