"""Planted faults in the heads proposers, and the checks that catch them (each check passes on
the real proposer and fails on the faulty one):

- a Hydra proposer whose level-i input embeds the WRONG path (the parent's parent's tokens, or
  a sibling's).  Its q stays the law its children are drawn from, so a residual verifier is
  still exact and no output test can see it; the check that does is direct: the q recorded
  for every parent equals the head's own softmax on that parent's own path, computed here
  from the modules.
- a Medusa proposer whose depth-2 children are recorded with depth 1's law: caught by the same
  direct check, by a sampling check (the children's empirical law against the recorded q), and
  end to end (the emitted tokens against the target's exact law, chi-square).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from draftwise.runtime.contracts import SamplingRelation
from draftwise.proposers.heads import HeadsConfig, HeadsProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.templates import cartesian
from draftwise.topology.tree_spec import TreeTemplate
from draftwise.verify.specinfer import SpecInferVerifier
from tests.integration.tiny_heads import (
    children_law_p,
    emitted_counts,
    exact_law,
    frontier_state,
    law_p_value,
    own_path_mismatches,
    random_headset,
)
from tests.integration.tiny_models import tiny_backend

POLICY = SamplingPolicy(temperature=1.0)
TREE = TreeTemplate(cartesian([2, 2, 2]))
PROMPTS = [[1, 2, 3], [6, 0, 4, 4], [7]]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # a 2-layer model: threads cost more than they give (conftest restores)


@pytest.fixture(scope="module")
def target():
    return tiny_backend(3)


@pytest.fixture(scope="module")
def law23(target):
    """[V, V]: the exact law of emitted tokens 2 and 3 after the prompt [1, 2, 3]."""
    return exact_law(target, POLICY, [1, 2, 3], 4).sum(axis=(0, 3))


# ---- the planted faults --------------------------------------------------------------------

class GrandparentPaths:
    """embed[paths] with every path one step stale: [x_t, a, b] is read as [x_t, x_t, a]."""

    def __init__(self, embed: torch.Tensor) -> None:
        self.embed = embed

    def __getitem__(self, paths: torch.Tensor) -> torch.Tensor:  # paths [P, L]
        return self.embed[torch.cat([paths[:, :1], paths[:, :-1]], dim=1)]


class SiblingPaths:
    """embed[paths] with the level's paths rotated: each parent reads its neighbour's path."""

    def __init__(self, embed: torch.Tensor) -> None:
        self.embed = embed

    def __getitem__(self, paths: torch.Tensor) -> torch.Tensor:
        return self.embed[paths.roll(1, dims=0)]


class WrongPathHydra(HeadsProposer):
    def __init__(self, *args, wrong, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed = wrong(self.embed)


class WrongDepthMedusa(HeadsProposer):
    """Children below depth 1 are drawn from their own head's q, but recorded with depth 1's."""

    def propose(self, context, manifest_hash, max_depth=None):
        return self._bent(super().propose(context, manifest_hash, max_depth))

    def drafting(self, context, manifest_hash, max_depth=None):  # the engine's rounds draft here
        return self._bent((yield from super().drafting(context, manifest_hash, max_depth)))

    @staticmethod
    def _bent(result):
        if not result.nodes:
            return result
        dists = {p: result.distributions[-1] for p in result.distributions}
        nodes = tuple(replace(n, q=float(dists[n.parent][n.token])) for n in result.nodes)
        return replace(result, nodes=nodes, distributions=dists)


def hydra(target, relation=SamplingRelation.BEAM, wrong=None):
    headset = random_headset("hydra", target, seed=7, num_heads=3, draft_vocab=6)
    config = HeadsConfig(tree=TREE, relation=relation)
    if wrong is None:
        return HeadsProposer("hydra", target, headset, config)
    return WrongPathHydra("hydra", target, headset, config, wrong=wrong)


def medusa(target, relation=SamplingRelation.IID, faulty=False, tree=TREE, policy_vocab=6):
    headset = random_headset("medusa", target, seed=7, num_heads=3, draft_vocab=policy_vocab)
    return (WrongDepthMedusa if faulty else HeadsProposer)("medusa", target, headset,
                                                           HeadsConfig(tree=tree, relation=relation))


def own_path_report(proposer, target, policy=POLICY) -> list[str]:
    """own_path_mismatches over a few frontiers (the engine's round 1 state of each prompt)."""
    bad = []
    weights = target.token_weights()
    for prompt in PROMPTS:
        context = frontier_state(target, prompt)
        proposer.begin(policy, np.random.default_rng(0))
        result = proposer.propose(context, "m")
        assert result.nodes and len({n.parent for n in result.nodes if n.depth == 3}) > 1
        bad += own_path_mismatches(result, proposer.headset, weights, policy, target.frontier_hidden(), context[-1])
    return bad


# ---- the direct check: q is the head's own law on the node's own path ------------------------

@pytest.mark.parametrize("relation", [SamplingRelation.BEAM, SamplingRelation.IID, SamplingRelation.WITHOUT_REPLACEMENT])
def test_real_proposers_record_each_heads_own_law(target, relation):
    assert own_path_report(hydra(target, relation), target) == []
    assert own_path_report(medusa(target, relation), target) == []


@pytest.mark.parametrize("wrong", [GrandparentPaths, SiblingPaths], ids=["grandparent", "sibling"])
def test_a_hydra_reading_the_wrong_path_is_caught(target, wrong):
    bad = own_path_report(hydra(target, wrong=wrong), target)
    assert bad and all("q of parent" in line for line in bad)
    # depth 1 reads only the pending token, which both faults keep: only deeper parents are off
    assert not any("path []" in line for line in bad)


def test_a_medusa_recording_the_wrong_depth_is_caught_directly(target):
    bad = own_path_report(medusa(target, faulty=True), target)
    assert bad and not any("path []" in line for line in bad)


# ---- the sampling check: children follow the recorded law ------------------------------------

@pytest.mark.parametrize("family", ["medusa", "hydra"])
@pytest.mark.parametrize("relation", [SamplingRelation.IID, SamplingRelation.WITHOUT_REPLACEMENT])
def test_real_children_follow_the_recorded_law(target, family, relation):
    proposer = medusa(target, relation) if family == "medusa" else hydra(target, relation)
    context = frontier_state(target, PROMPTS[0])
    p = children_law_p(proposer, target, context, POLICY, 800, relation is SamplingRelation.WITHOUT_REPLACEMENT)
    assert p > 1e-3


def test_children_follow_the_recorded_law_when_a_top_k_policy_spends_q(target):
    """Three children drawn without replacement under top-k 2: the third is Sequoia's fallback,
    which the recorded law (as the verifier reads it) puts on the whole vocabulary."""
    proposer = medusa(target, SamplingRelation.WITHOUT_REPLACEMENT, tree=TreeTemplate(cartesian([3])), policy_vocab=4)
    context = frontier_state(target, PROMPTS[0])
    assert children_law_p(proposer, target, context, SamplingPolicy(temperature=1.0, top_k=2), 800, True) > 1e-3


def test_a_medusa_recording_the_wrong_depth_fails_the_sampling_check(target):
    context = frontier_state(target, PROMPTS[0])
    assert children_law_p(medusa(target, faulty=True), target, context, POLICY, 800, False) < 1e-6


# ---- end to end: the emitted law --------------------------------------------------------------

@pytest.mark.parametrize("faulty", [False, True], ids=["real", "wrong-depth"])
def test_a_medusa_recording_the_wrong_depth_fails_the_exactness_test(target, law23, faulty):
    """test_heads_exact's chi-square, on the law of emitted tokens 2 and 3 (the fault bends the
    depth-2 acceptance, which decides token 3).  How far the fault moves that law depends on
    how far depth 1's q is from depth 2's: these heads (seed 7) move it enough to be seen in 400
    samples; a head set whose two depths nearly agree would hide it, which is why the direct
    checks above come first."""
    proposer = medusa(target, faulty=faulty, tree=TreeTemplate(cartesian([2, 2])))
    counts, seen = emitted_counts(target, proposer, SpecInferVerifier(), POLICY, [1, 2, 3], 400, 4)
    assert seen["accepted"] > 50
    p = law_p_value(counts.sum(axis=2), law23)
    assert p < 1e-6 if faulty else p > 1e-3
