"""Greedy, membership and one-draft rejection against hand-built logits."""

import numpy as np
import pytest
import torch

from draftwise.runtime.contracts import ProbabilitySemantics, ProposalNode, ProposalResult, ProposerContract, SamplingRelation, TopologyKind
from draftwise.backends.transformers_batch import TorchLogits
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import compile_round
from draftwise.verify.base import NumpyLogits
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier
from draftwise.verify.rejection import RejectionVerifier, residual
from tests.helpers import result_from_paths

V = 6

# the verifier's view of the same logits: a host array (the reference) or a torch tensor
LOGITS = pytest.mark.parametrize(
    "make_logits",
    [NumpyLogits, lambda a: TorchLogits(torch.from_numpy(np.asarray(a)), on_device=True)],
    ids=["numpy", "torch"],
)


def one_hot_logits(rows):
    """rows: preferred token per target row -> logits [len(rows), V] with that argmax."""
    logits = np.zeros((len(rows), V), dtype=np.float32)
    for i, token in enumerate(rows):
        logits[i, token] = 5.0
    return logits


@LOGITS
def test_greedy_walks_the_tree(make_logits):
    # tree: 1 -> 2 -> 3, 1 -> 4, 5
    r = compile_round(10, [result_from_paths([[1, 2, 3], [1, 4], [5]])])
    rows = {tuple(r.path_tokens(i)): i for i in range(r.n)}
    # target prefers 1 at the frontier, 4 after 1, then 0 after 1-4
    targets = [0] * (1 + r.n)
    targets[0] = 1
    targets[rows[(1,)] + 1] = 4
    targets[rows[(1, 4)] + 1] = 0
    sel = GreedyVerifier().select(r, make_logits(one_hot_logits(targets)), SamplingPolicy(), np.random.default_rng(0))
    assert sel.accepted_rows == (rows[(1,)], rows[(1, 4)])
    assert sel.bonus_token == 0


@LOGITS
def test_greedy_rejects_at_root(make_logits):
    r = compile_round(10, [result_from_paths([[1, 2]])])
    sel = GreedyVerifier().select(r, make_logits(one_hot_logits([3, 0, 0])), SamplingPolicy(), np.random.default_rng(0))
    assert sel.accepted_rows == () and sel.bonus_token == 3


@LOGITS
def test_greedy_accepts_everything_then_bonus(make_logits):
    r = compile_round(10, [result_from_paths([[1, 2]])])
    sel = GreedyVerifier().select(r, make_logits(one_hot_logits([1, 2, 5])), SamplingPolicy(), np.random.default_rng(0))
    assert sel.accepted_rows == (0, 1) and sel.bonus_token == 5


@LOGITS
def test_membership_distribution_is_the_target(make_logits):
    # frontier p = (0.5, 0.3, 0.2, 0, 0, 0); tree offers tokens 0 and 1 at the root
    p = np.array([0.5, 0.3, 0.2, 1e-12, 1e-12, 1e-12])
    r = compile_round(4, [result_from_paths([[0], [1]])])
    logits = np.log(np.tile(p, (1 + r.n, 1)))
    rng = np.random.default_rng(1)
    policy = SamplingPolicy(temperature=1.0)
    first = []
    for _ in range(6000):
        sel = MembershipVerifier().select(r, make_logits(logits), policy, rng)
        first.append(int(r.token_ids[sel.accepted_rows[0]]) if sel.accepted_rows else sel.bonus_token)
    freq = np.bincount(first, minlength=V) / len(first)
    assert np.allclose(freq[:3], p[:3], atol=0.02)


def normal_chain(tokens, qs):
    contract = ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, SamplingRelation.IID, TopologyKind.SEQUENCE)
    nodes = tuple(ProposalNode(t, i - 1, i + 1, q=float(q[t])) for i, (t, q) in enumerate(zip(tokens, qs)))
    dists = {i - 1: q for i, q in enumerate(qs)}
    return ProposalResult(nodes=nodes, contract=contract, source="d", manifest_hash="m", distributions=dists)


def test_residual_by_hand():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.6, 0.2])
    assert np.allclose(residual(p, q), [1.0, 0.0, 0.0])
    assert np.allclose(residual(p, p), p)


@LOGITS
def test_rejection_accepts_when_p_dominates_and_rejects_zero_p(make_logits):
    q = np.array([0.0, 1.0, 0, 0, 0, 0])
    r = compile_round(3, [normal_chain([1], [q])])
    p_good = np.log(np.array([1e-9, 1.0, 1e-9, 1e-9, 1e-9, 1e-9]))
    sel = RejectionVerifier().select(r, make_logits(np.tile(p_good, (2, 1))), SamplingPolicy(temperature=1.0),
                                     np.random.default_rng(0))
    assert sel.accepted_rows == (0,)
    p_bad = np.log(np.array([0.5, 1e-30, 0.5, 1e-30, 1e-30, 1e-30]))
    for seed in range(20):
        sel = RejectionVerifier().select(r, make_logits(np.tile(p_bad, (2, 1))), SamplingPolicy(temperature=1.0),
                                         np.random.default_rng(seed))
        assert sel.accepted_rows == () and sel.bonus_token in (0, 2)


@LOGITS
def test_rejection_first_token_marginal_equals_p(make_logits):
    p = np.array([0.5, 0.3, 0.2, 0, 0, 0])
    q = np.array([0.2, 0.6, 0.2, 0, 0, 0])
    rng = np.random.default_rng(3)
    policy = SamplingPolicy(temperature=1.0)
    logits = np.log(np.maximum(np.tile(p, (2, 1)), 1e-300))
    first = []
    for _ in range(8000):
        x = int(rng.choice(V, p=q))
        r = compile_round(3, [normal_chain([x], [q])])
        sel = RejectionVerifier().select(r, make_logits(logits), policy, rng)
        first.append(x if sel.accepted_rows else sel.bonus_token)
    freq = np.bincount(first, minlength=V) / len(first)
    assert np.allclose(freq, p, atol=0.02)
