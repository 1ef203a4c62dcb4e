"""Verification on the logits' device: the batched torch policy (`policy_probs`, behind
`TorchLogits` on an accelerator) against the NumPy reference (`SamplingPolicy.probs`, behind
`NumpyLogits`), the verifiers fed by either, and chain rejection (uniforms drawn at once)
against its exact law."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from draftwise.backends.torch_probs import policy_probs
from draftwise.backends.transformers_batch import TorchLogits
from draftwise.runtime.contracts import (
    ContractError,
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    SamplingRelation,
    TopologyKind,
)
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import compile_round
from draftwise.verify.base import NumpyLogits
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier
from draftwise.verify.rejection import RejectionVerifier, residual
from draftwise.verify.sequoia import SequoiaVerifier, without_replacement_q
from draftwise.verify.specinfer import SpecInferVerifier
from draftwise.verify.spectr import SpecTrVerifier
from draftwise.verify.typical import TypicalVerifier

POLICIES = [
    SamplingPolicy(temperature=t, top_k=k, top_p=p)
    for t, k, p in itertools.product([0.0, 0.3, 1.0, 1.7], [0, 1, 3, 40], [1.0, 0.95, 0.5, 0.05])
]


def policy_id(policy: SamplingPolicy) -> str:
    return f"T{policy.temperature}-k{policy.top_k}-p{policy.top_p}"


def random_logits(rng: np.random.Generator, rows: int, vocab: int, ties: bool) -> np.ndarray:
    """[rows, V] float32; with `ties`, few distinct values, so top-k and nucleus ties are common."""
    if ties:
        return rng.integers(-3, 4, size=(rows, vocab)).astype(np.float32)
    return (rng.standard_normal((rows, vocab)) * 3.0).astype(np.float32)


def assert_same_law(got: np.ndarray, want: np.ndarray) -> None:
    """Same support (the discrete choices: argmax, top-k ties, nucleus cut) and the same values."""
    np.testing.assert_array_equal(got > 0.0, want > 0.0)
    np.testing.assert_allclose(got, want, rtol=0.0, atol=1e-12)


# ------------------------------------------------------------------ the policy on the device


@pytest.mark.parametrize("policy", POLICIES, ids=policy_id)
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "tied"])
def test_policy_probs_matches_the_numpy_reference(policy, ties):
    rng = np.random.default_rng(7)
    for vocab in (2, 17, 300):
        logits = random_logits(rng, 9, vocab, ties)  # [9, V]
        got = policy_probs(torch.from_numpy(logits), policy).numpy()
        assert got.dtype == np.float64
        assert_same_law(got, policy.probs(logits))
        np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_policy_probs_takes_the_model_dtype(dtype):
    policy = SamplingPolicy(temperature=0.8, top_k=20, top_p=0.9)
    logits = torch.from_numpy(random_logits(np.random.default_rng(1), 5, 64, ties=False)).to(dtype)  # [5, 64]
    want = policy.probs(logits.to(torch.float64).numpy())  # the reference on the same values
    assert_same_law(policy_probs(logits, policy).numpy(), want)


def test_torch_and_numpy_logits_serve_the_same_rows():
    logits = random_logits(np.random.default_rng(2), 6, 50, ties=True)  # [6, 50]
    host, device = NumpyLogits(logits), TorchLogits(torch.from_numpy(logits), on_device=True)
    np.testing.assert_array_equal(device.argmax(), host.argmax())  # first maximum on ties, both
    for policy in POLICIES:
        assert_same_law(device.probs_all(policy), host.probs_all(policy))
        for row in (0, 5):
            assert_same_law(device.probs(row, policy), host.probs(row, policy))


ALL_PATHS = pytest.mark.parametrize("make", [
    NumpyLogits,
    lambda a: TorchLogits(torch.from_numpy(a)),  # on the CPU: NumPy rows, one at a time
    lambda a: TorchLogits(torch.from_numpy(a), on_device=True),  # the accelerator's batched pass
], ids=["numpy", "torch-cpu", "torch-batched"])


@ALL_PATHS
def test_rows_are_computed_once_per_policy_and_read_only(make):
    logits = make(random_logits(np.random.default_rng(3), 4, 10, ties=False))
    a, b = SamplingPolicy(temperature=1.0), SamplingPolicy(temperature=0.5)
    first = logits.probs(2, a)
    assert np.shares_memory(logits.probs(2, a), first)  # served from the cache, not recomputed
    assert not np.array_equal(logits.probs(2, b), first)
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 1.0  # a verifier writing into a shared row would corrupt the next reader


def test_the_batched_pass_runs_once_per_round():
    calls = []

    class Counting(TorchLogits):
        def _on_device(self, policy):
            calls.append(policy)
            return super()._on_device(policy)

    logits = Counting(torch.from_numpy(random_logits(np.random.default_rng(9), 6, 10, ties=False)), on_device=True)
    policy = SamplingPolicy(temperature=1.0, top_p=0.9)
    for row in (0, 3, 5, 3):
        logits.probs(row, policy)
    assert calls == [policy]  # every row from one pass and one host copy


def _top_k_dropping_ties(logits: torch.Tensor, policy: SamplingPolicy) -> torch.Tensor:
    """Planted fault: top-k keeping exactly k tokens (torch.topk's indices), not every tie of the k-th."""
    scaled = logits.to(torch.float64) / policy.temperature
    keep = torch.zeros_like(scaled, dtype=torch.bool).scatter_(-1, torch.topk(scaled, policy.top_k).indices, True)
    return torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)


def test_the_comparison_catches_a_tie_rule_and_a_policy_mismatch():
    policy = SamplingPolicy(temperature=1.0, top_k=3)
    logits = random_logits(np.random.default_rng(4), 8, 12, ties=True)  # [8, 12]
    want = policy.probs(logits)
    with pytest.raises(AssertionError):
        assert_same_law(_top_k_dropping_ties(torch.from_numpy(logits), policy).numpy(), want)
    with pytest.raises(AssertionError):  # the right rule under another policy's top-p
        assert_same_law(policy_probs(torch.from_numpy(logits), SamplingPolicy(1.0, 3, 0.9)).numpy(), want)


# ------------------------------------------------------------------ verifiers on both paths

NC = ProbabilitySemantics.NORMALIZED_CONDITIONAL


def random_round(rng: np.random.Generator, vocab: int, policy: SamplingPolicy, relation, widths):
    """A draft-model-like round: `widths[d]` children per node at depth d, each set drawn from a
    random q under `policy` (i.i.d., or without replacement for Sequoia)."""
    nodes: list[ProposalNode] = []
    dists: dict[int, np.ndarray] = {}
    frontier = [-1]
    for depth, width in enumerate(widths, start=1):
        nxt = []
        for parent in frontier:
            q = policy.probs(rng.standard_normal(vocab) * 2.0)  # [V]
            dists[parent] = q
            drawn: list[int] = []
            for _ in range(width):
                law = without_replacement_q(q, drawn) if relation is SamplingRelation.WITHOUT_REPLACEMENT else q
                drawn.append(int(rng.choice(vocab, p=law)))
                nodes.append(ProposalNode(drawn[-1], parent, depth, q=float(law[drawn[-1]]), source="d"))
                nxt.append(len(nodes) - 1)
        frontier = nxt
    if set(widths) == {1}:
        topology = TopologyKind.SEQUENCE
    else:
        topology = TopologyKind.SET if len(widths) == 1 else TopologyKind.TREE
    contract = ProposerContract(NC, relation, topology)
    return compile_round(5, [ProposalResult(tuple(nodes), contract, "d", "h", dists)])


CASES = [
    (GreedyVerifier(), SamplingRelation.IID, (2, 2)),
    (MembershipVerifier(), SamplingRelation.IID, (3, 2)),
    (RejectionVerifier(), SamplingRelation.IID, (1, 1, 1, 1)),
    (SpecInferVerifier(), SamplingRelation.IID, (3, 2)),
    (SequoiaVerifier(), SamplingRelation.WITHOUT_REPLACEMENT, (3, 2)),
    (SpecTrVerifier(), SamplingRelation.IID, (4,)),
    (TypicalVerifier(), SamplingRelation.IID, (2, 2)),
]


@pytest.mark.parametrize("verifier, relation, widths", CASES, ids=[case[0].capabilities.name for case in CASES])
def test_verifiers_select_the_same_on_both_paths(verifier, relation, widths):
    """Same probabilities and the same generator state: the same selection, round after round."""
    rng = np.random.default_rng(11)
    greedy_only = verifier.capabilities.greedy_only
    for trial in range(40):
        policy = SamplingPolicy(0.0) if greedy_only else POLICIES[int(rng.integers(len(POLICIES)))]
        if policy.greedy and not greedy_only:
            continue  # q one-hot at the draft: covered by the greedy case
        vocab = int(rng.choice([5, 33]))
        round_ = random_round(rng, vocab, policy, relation, widths)
        logits = random_logits(rng, 1 + round_.n, vocab, ties=bool(trial % 2))  # [1 + N, V]
        try:
            want = verifier.select(round_, NumpyLogits(logits), policy, np.random.default_rng(trial))
        except ContractError:  # a draft outside the target's support under top-k/top-p (q = 0 cut)
            continue
        batched = TorchLogits(torch.from_numpy(logits), on_device=True)
        got = verifier.select(round_, batched, policy, np.random.default_rng(trial))
        assert got == want, (trial, policy)


# ------------------------------------------------------------------ vectorized chain rejection


def chain(tokens, qs):
    contract = ProposerContract(NC, SamplingRelation.IID, TopologyKind.SEQUENCE)
    nodes = tuple(ProposalNode(t, i - 1, i + 1, q=float(q[t]), source="d") for i, (t, q) in enumerate(zip(tokens, qs)))
    return compile_round(3, [ProposalResult(nodes, contract, "d", "h", {i - 1: q for i, q in enumerate(qs)})])


def exact_chain_law(p: np.ndarray, qs, tokens) -> dict[tuple[int, int], float]:
    """(accepted count, emitted token) -> probability under one-draft rejection tested in order."""
    law, stay = {}, 1.0
    for i, (q, x) in enumerate(zip(qs, tokens)):
        a = min(1.0, p[i, x] / q[x])
        for y, mass in enumerate(residual(p[i], q)):
            law[(i, y)] = law.get((i, y), 0.0) + stay * (1.0 - a) * mass
        stay *= a
    for y, mass in enumerate(p[len(tokens)]):
        law[(len(tokens), y)] = law.get((len(tokens), y), 0.0) + stay * mass
    return law


@ALL_PATHS
def test_chain_follows_the_exact_rejection_law(make):
    vocab, samples = 4, 6000
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(vocab), size=4)  # [4, V]: frontier + 3 drafts
    qs = list(rng.dirichlet(np.ones(vocab), size=3))  # 3 x [V]
    tokens = [1, 2, 0]  # fixed drafts: the law below is conditional on them
    round_ = chain(tokens, qs)
    target = make(np.log(p))
    law = exact_chain_law(p, qs, tokens)
    keys = sorted(law)
    counts = dict.fromkeys(keys, 0)
    draws = np.random.default_rng(6)
    policy = SamplingPolicy(temperature=1.0)
    for _ in range(samples):
        sel = RejectionVerifier().select(round_, target, policy, draws)
        assert sel.accepted_rows == tuple(range(len(sel.accepted_rows)))
        counts[(len(sel.accepted_rows), sel.bonus_token)] += 1
    expected = np.array([law[k] for k in keys]) * samples
    big = expected >= 5
    observed = np.array([counts[k] for k in keys])
    assert observed[~big].sum() <= 5 + 5 * (~big).sum()  # the unlikely cells stay unlikely
    assert chisquare(observed[big], expected[big] * observed[big].sum() / expected[big].sum()).pvalue > 1e-3


def test_empty_chain_samples_the_frontier():
    p = np.array([[0.25, 0.75]])  # [1, V]: frontier only
    contract = ProposerContract(NC, SamplingRelation.IID, TopologyKind.SEQUENCE)
    round_ = compile_round(3, [ProposalResult((), contract, "d", "h", {})])
    sel = RejectionVerifier().select(round_, NumpyLogits(np.log(p)), SamplingPolicy(1.0), np.random.default_rng(0))
    assert sel.accepted_rows == () and sel.bonus_token in (0, 1)


def test_the_chain_reads_rows_only_up_to_the_first_rejection():
    """Host logits pay for the rows the chain reaches, not for the whole chain."""
    read = []

    class Recording(NumpyLogits):
        def probs(self, row, policy):
            read.append(row)
            return super().probs(row, policy)

    q = np.array([0.5, 0.5, 0.0])
    round_ = chain([0, 0, 0], [q, q, q])
    logits = np.log(np.array([[1e-9, 0.5, 0.5]] * 4))  # p(0) ~ 0: the first draft is rejected
    sel = RejectionVerifier().select(round_, Recording(logits), SamplingPolicy(1.0), np.random.default_rng(0))
    assert sel.accepted_rows == () and read == [0]


def test_a_draft_outside_q_is_refused_wherever_it_sits():
    q = np.array([0.5, 0.5, 0.0])
    round_ = chain([0, 2], [q, q])  # the second draft has q = 0: it was not drawn from q
    with pytest.raises(ContractError, match="q = 0"):
        RejectionVerifier().select(round_, NumpyLogits(np.zeros((3, 3))), SamplingPolicy(1.0), np.random.default_rng(0))


def test_cpu_logits_take_the_numpy_reference_itself():
    """No sync to save on the CPU: TorchLogits there serves the reference's own rows."""
    logits = random_logits(np.random.default_rng(8), 5, 40, ties=True)  # [5, 40]
    policy = SamplingPolicy(temperature=0.7, top_k=6, top_p=0.8)
    half = torch.from_numpy(logits).to(torch.bfloat16)  # a bf16 model's logits: widened, as before
    for row in range(5):
        want = policy.probs(logits[row])
        np.testing.assert_array_equal(TorchLogits(torch.from_numpy(logits)).probs(row, policy), want)
        np.testing.assert_array_equal(TorchLogits(half).probs(row, policy), policy.probs(half[row].float().numpy()))
