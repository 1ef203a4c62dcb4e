import numpy as np
import pytest

from draftwise.runtime.contracts import (
    ContractError,
    ManifestMismatch,
    ProbabilitySemantics,
    ProposalNode,
    ProposalResult,
    ProposerContract,
    RoundManifest,
    SamplingRelation,
    TopologyKind,
)

NORMAL_SEQ = ProposerContract(ProbabilitySemantics.NORMALIZED_CONDITIONAL, SamplingRelation.IID, TopologyKind.SEQUENCE)
FREQ_TREE = ProposerContract(ProbabilitySemantics.FREQUENCY, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.TREE)


def manifest(**changes):
    base = dict(target_checkpoint="t@1", tokenizer_hash="tok", sampling_policy={"temperature": 0.0},
                proposers=({"name": "p"},), compiler_version="1", max_nodes=64, max_depth=16,
                verifier="greedy", exact=True, backend="transformers", dtype="float32")
    base.update(changes)
    return RoundManifest(**base)


def test_normalized_result_needs_q_and_distributions():
    q = np.full(4, 0.25)
    node = ProposalNode(token=1, parent=-1, depth=1, q=0.25)
    ok = ProposalResult(nodes=(node,), contract=NORMAL_SEQ, source="d", manifest_hash="h", distributions={-1: q})
    assert ok.semantics is ProbabilitySemantics.NORMALIZED_CONDITIONAL
    with pytest.raises(ContractError, match="no proposal distribution"):
        ProposalResult(nodes=(node,), contract=NORMAL_SEQ, source="d", manifest_hash="h")
    with pytest.raises(ContractError, match="lacks q"):
        ProposalResult(nodes=(ProposalNode(1, -1, 1),), contract=NORMAL_SEQ, source="d", manifest_hash="h",
                       distributions={-1: q})


def test_frequency_is_never_q():
    with pytest.raises(ContractError, match="never a probability"):
        ProposalResult(nodes=(ProposalNode(1, -1, 1, q=0.5, score=3.0),), contract=FREQ_TREE, source="r", manifest_hash="h")
    r = ProposalResult(nodes=(ProposalNode(1, -1, 1, score=3.0),), contract=FREQ_TREE, source="r", manifest_hash="h")
    assert r.nodes[0].q is None and r.nodes[0].score == 3.0


def test_structure_checks():
    with pytest.raises(ContractError, match="parents must come first"):
        ProposalResult(nodes=(ProposalNode(1, 1, 2, score=1), ProposalNode(2, -1, 1, score=1)), contract=FREQ_TREE,
                       source="r", manifest_hash="h")
    with pytest.raises(ContractError, match="depth"):
        ProposalResult(nodes=(ProposalNode(1, -1, 2, score=1),), contract=FREQ_TREE, source="r", manifest_hash="h")
    seq = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.SEQUENCE)
    with pytest.raises(ContractError, match="several children"):
        ProposalResult(nodes=(ProposalNode(1, -1, 1), ProposalNode(2, -1, 1)), contract=seq, source="p", manifest_hash="h")
    one_set = ProposerContract(ProbabilitySemantics.ABSENT, SamplingRelation.DETERMINISTIC_LOOKUP, TopologyKind.SET)
    with pytest.raises(ContractError, match="one-position set"):
        ProposalResult(nodes=(ProposalNode(1, -1, 1), ProposalNode(2, 0, 2)), contract=one_set, source="p", manifest_hash="h")


def test_manifest_hash_is_stable_and_sensitive():
    assert manifest().hash == manifest().hash
    for change in [dict(tokenizer_hash="other"), dict(sampling_policy={"temperature": 1.0}), dict(max_nodes=8),
                   dict(verifier="membership"), dict(backend="llamacpp"), dict(exact=False)]:
        assert manifest(**change).hash != manifest().hash, change


def test_manifest_mismatch_is_an_error():
    m = manifest()
    good = ProposalResult(nodes=(), contract=FREQ_TREE, source="r", manifest_hash=m.hash)
    m.check(good)
    bad = ProposalResult(nodes=(), contract=FREQ_TREE, source="r", manifest_hash=manifest(max_depth=3).hash)
    with pytest.raises(ManifestMismatch, match="another|manifest"):
        m.check(bad)
