"""Rejection sampling is exact: on tiny random models the first two emitted tokens follow the
target's exact joint law (chi-square, fixed seed), and a planted bug (sampling q instead of
the residual after a rejection) is caught by the same test."""

import pytest

from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.runtime.sampling import SamplingPolicy, sample
from draftwise.verify.base import Selection
from draftwise.verify.rejection import RejectionVerifier, accept_probability
from tests.integration.tiny_models import LOGITS_PATHS, chi_square_p, exact_joint, first_two_counts, tiny_backend

SAMPLES = 2000
POLICY = SamplingPolicy(temperature=1.0)


class ResidualIsQ(RejectionVerifier):
    """Planted bug: after a rejection, sample the proposal q instead of (p - q)+."""

    def select(self, round_, target, policy, rng, draws=None):
        accepted, row = [], -1
        while True:
            p = target.probs(row + 1, policy)
            children = round_.children_of(row)
            if not children:
                return Selection(tuple(accepted), sample(p, rng))
            (child,) = children
            q = round_.q_dist[0][row]
            x = int(round_.token_ids[child])
            if rng.random() < accept_probability(float(p[x]), float(q[x])):
                accepted.append(child)
                row = child
                continue
            return Selection(tuple(accepted), sample(q, rng))


def p_value(verifier, target, draft, joint) -> float:
    proposer = DraftModelProposer(draft, "tiny", DraftConfig(k=2, confidence_threshold=0.0))
    return chi_square_p(first_two_counts(target, proposer, verifier, POLICY, SAMPLES), joint)


@pytest.fixture(scope="module")
def joint():
    return exact_joint(tiny_backend(0), POLICY)


@pytest.fixture(scope="module", params=sorted(LOGITS_PATHS))
def models(request, joint):
    """The verifier reads the same logits as NumpyLogits or through the batched torch pass."""
    return LOGITS_PATHS[request.param](tiny_backend(0)), tiny_backend(1), joint


@pytest.fixture(scope="module")
def torch_models(joint):
    """The backend as it is: a planted bug is in the verifier, whatever path feeds it."""
    return tiny_backend(0), tiny_backend(1), joint


def test_rejection_matches_exact_target_law(models):
    target, draft, joint = models
    assert p_value(RejectionVerifier(), target, draft, joint) > 1e-3


def test_planted_bug_is_caught(torch_models):
    target, draft, joint = torch_models
    assert p_value(ResidualIsQ(), target, draft, joint) < 1e-6
