"""Multi-candidate verifiers are exact on real draft-model trees: on tiny random models the
first two emitted tokens follow the target's exact joint law (chi-square, fixed seeds) for
SpecInfer over i.i.d. trees, Sequoia over trees drawn without replacement and SpecTr over a
one-position set; and each planted bug the issue names is caught by the same test."""

import numpy as np
import pytest

from draftwise.runtime.contracts import SamplingRelation
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.templates import cartesian
from draftwise.verify.rejection import accept_probability, residual
from draftwise.verify.sequoia import SequoiaVerifier
from draftwise.verify.specinfer import NodeDecision, SpecInferVerifier, draw_rows
from draftwise.verify.spectr import SpecTrVerifier
from draftwise.topology.tree_spec import TreeTemplate
from tests.integration.tiny_models import LOGITS_PATHS, chi_square_p, exact_joint, first_two_counts, tiny_backend

SAMPLES = 1000
POLICY = SamplingPolicy(temperature=1.0)
TREE = cartesian([3, 2])  # 3 drafts under the frontier, 2 under each: 9 nodes, depth 2
SET = cartesian([3])  # 3 drafts at one position


class ResidualSkipped(SpecInferVerifier):
    """Planted bug: every draft re-tested against the original p (the duplicate-mass error)."""

    def node_decision(self, p, q, tokens):
        stay, accept = 1.0, np.zeros(len(tokens))
        for i, x in enumerate(tokens):
            a = accept_probability(float(p[x]), float(q[x]))
            accept[i] = stay * a
            stay *= 1.0 - a
        return NodeDecision(accept, residual(p, q))


class QNotRenormalized(SequoiaVerifier):
    """Planted bug: earlier siblings removed from q, but q is not renormalized."""

    def node_decision(self, p, q, tokens):
        r, stay, accept, removed = p, 1.0, np.zeros(len(tokens)), np.array(q, dtype=np.float64)
        for i, x in enumerate(tokens):
            a = accept_probability(float(r[x]), float(removed[x]))
            accept[i] = stay * a
            stay *= 1.0 - a
            r = residual(r, removed)
            removed = removed.copy()
            removed[x] = 0.0
        return NodeDecision(accept, r)


class SiblingOrderIgnored(SequoiaVerifier):
    """Planted bug: siblings tested in token order instead of the order they were drawn in."""

    def draws(self, round_, row):
        return tuple(sorted(draw_rows(round_, row), key=lambda r: int(round_.token_ids[r])))


@pytest.fixture(scope="module")
def joint():
    # Seeds picked by exact enumeration of the first position (not by these tests' outcomes):
    # with target 3 / draft 4 and three siblings, the two Sequoia bugs move the first token's
    # law by 0.16 and 0.56 in total variation, where target 0 / draft 1 hid them (< 0.03).
    return exact_joint(tiny_backend(3), POLICY)


@pytest.fixture(scope="module", params=sorted(LOGITS_PATHS))
def models(request, joint):
    """The verifier reads the same logits as NumpyLogits or through the batched torch pass."""
    return LOGITS_PATHS[request.param](tiny_backend(3)), tiny_backend(4), joint


@pytest.fixture(scope="module")
def torch_models(joint):
    """The backend as it is: a planted bug is in the verifier, whatever path feeds it."""
    return tiny_backend(3), tiny_backend(4), joint


def p_value(models, verifier, template, relation) -> float:
    target, draft, joint = models
    proposer = DraftModelProposer(draft, "tiny", DraftConfig(tree=TreeTemplate(template), relation=relation, confidence_threshold=0.0))
    return chi_square_p(first_two_counts(target, proposer, verifier, POLICY, SAMPLES), joint)


@pytest.mark.parametrize(
    "verifier, template, relation",
    [
        (SpecInferVerifier(), TREE, SamplingRelation.IID),
        (SequoiaVerifier(), TREE, SamplingRelation.WITHOUT_REPLACEMENT),
        (SpecTrVerifier(), SET, SamplingRelation.IID),
    ],
    ids=["specinfer-iid-tree", "sequoia-without-replacement-tree", "spectr-iid-set"],
)
def test_exact_verifier_matches_target_law(models, verifier, template, relation):
    assert p_value(models, verifier, template, relation) > 1e-3


@pytest.mark.parametrize(
    "verifier, relation",
    [
        (ResidualSkipped(), SamplingRelation.IID),
        (QNotRenormalized(), SamplingRelation.WITHOUT_REPLACEMENT),
        (SiblingOrderIgnored(), SamplingRelation.WITHOUT_REPLACEMENT),
    ],
    ids=["residual-skipped", "q-not-renormalized", "sibling-order-ignored"],
)
def test_planted_bug_is_caught(torch_models, verifier, relation):
    assert p_value(torch_models, verifier, TREE, relation) < 1e-6
