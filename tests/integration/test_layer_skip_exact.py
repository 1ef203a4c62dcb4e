"""Draft & Verify (`--proposer layer-skip`) is exact.

- temperature 1, tiny random 4-layer Llama: the first three emitted tokens follow the target's
  exact law (chi-square) for sampled chains under rejection sampling (fixed gamma 0, so a depth-2
  chain is drafted every time, and adaptive gamma) and for i.i.d. trees under SpecInfer;
  every proposal records the skipped pass's own q;
- temperature 0: greedy output is plain decoding's, on the tiny model and on the embedded
  SmolLM2 over the Spec-Bench development prompts, with drafts both accepted and rejected.
"""

import numpy as np
import pytest
import torch

from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.layer_skip import LayerSkipConfig, SelfDraftProposer, open_layer_skip
from draftwise.proposers.family import DrafterResources
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.rejection import RejectionVerifier
from draftwise.verify.registry import make_verifier
from draftwise.verify.specinfer import SpecInferVerifier
from draftwise.topology.templates import cartesian
from draftwise.topology.tree_spec import TreeTemplate
from tests.helpers import assert_probs_close, make_spec
from tests.integration.test_layer_skip_backend import deep_tiny
from tests.integration.tiny_heads import exact_law, law_p_value
from tests.integration.conftest import GREEDY_NEW, REAL_PROMPTS

POLICY = SamplingPolicy(temperature=1.0)
PROMPT = [1, 2, 3]
NEW = 3
SAMPLES = 1500
SKIP = "bits:01100110"  # layer 0 MLP, layer 1 attention, layer 2 MLP, layer 3 attention skipped


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return deep_tiny(seed=2)


@pytest.fixture(scope="module")
def law(target):
    return exact_law(target, POLICY, PROMPT, NEW)  # [V, V, V]


def counts_of(target, proposer, verifier, policy, samples):
    vocab = target.info.vocab_size
    counts = np.zeros([vocab] * NEW)
    seen = {"accepted": 0, "rejected": 0}
    for seed in range(samples):
        result = SpeculativeDecoder(target, [proposer], verifier,
                                    GenerationConfig(max_new_tokens=NEW, policy=policy, seed=seed)).generate(PROMPT)
        assert result.records[0].nodes > 0, "round 1 must verify drafts for the test to mean anything"
        counts[tuple(result.tokens)] += 1
        seen["accepted" if result.records[0].accepted else "rejected"] += 1
    return counts, seen


@pytest.mark.parametrize("settings, verifier", [
    ({"gamma": 0.0, "adaptive": False}, RejectionVerifier()),
    ({"gamma": 0.5, "adaptive": True}, RejectionVerifier()),
    ({"tree": TreeTemplate(cartesian([2, 2]))}, SpecInferVerifier()),
], ids=["chain-fixed-gamma", "chain-adaptive-gamma", "tree-iid"])
def test_sampled_layer_skip_drafts_emit_the_target_law(target, law, settings, verifier):
    proposer = open_layer_skip(LayerSkipConfig(skip=SKIP, **settings), DrafterResources(target))
    counts, seen = counts_of(target, proposer, verifier, POLICY, SAMPLES)
    assert seen["accepted"] > 100 and seen["rejected"] > 100  # both branches of the verifier ran
    assert law_p_value(counts, law) > 1e-3


def test_a_proposal_records_the_skipped_pass_q(target):
    """The recorded q is the skip-set model's own softmax: a draft from the full target instead
    (the classic relabelling fault) would record other numbers."""
    proposer = open_layer_skip(LayerSkipConfig(skip=SKIP, gamma=0.0, adaptive=False, k=2), DrafterResources(target))
    proposer.begin(POLICY, np.random.default_rng(0))
    result = proposer.propose(PROMPT, "m")
    draft = proposer.draft
    draft.reset()
    want = POLICY.probs(draft.extend(PROMPT).logits[0].numpy())
    assert_probs_close(result.distributions[-1], want)
    target.reset()
    full = POLICY.probs(target.extend(PROMPT).logits[0].numpy())
    assert np.abs(full - want).max() > 1e-2


def test_adaptive_gamma_moves_with_the_rounds(target):
    proposer = open_layer_skip(LayerSkipConfig(skip=SKIP, gamma=0.5), DrafterResources(target))
    assert isinstance(proposer, SelfDraftProposer) and proposer.controller is not None
    SpeculativeDecoder(target, [proposer], make_verifier("greedy", [proposer.contract], SamplingPolicy()),
                       GenerationConfig(max_new_tokens=20)).generate(PROMPT)
    assert proposer.gamma != 0.5
    fixed = open_layer_skip(LayerSkipConfig(skip=SKIP, gamma=0.5, adaptive=False), DrafterResources(target))
    assert fixed.controller is None


@pytest.mark.parametrize("carry", [False, True])
def test_adaptive_gamma_restarts_each_generation_unless_carried(target, carry):
    proposer = open_layer_skip(LayerSkipConfig(skip=SKIP, gamma=0.5, carry=carry), DrafterResources(target))
    decoder = SpeculativeDecoder(target, [proposer], make_verifier("greedy", [proposer.contract], SamplingPolicy()),
                                 GenerationConfig(max_new_tokens=20))
    decoder.generate(PROMPT)
    ended = proposer.gamma
    assert ended != 0.5
    proposer.begin(SamplingPolicy(), np.random.default_rng(0))  # what the next generation does first
    assert proposer.gamma == (ended if carry else 0.5)
    assert proposer.identity()["carry"] is carry


GREEDY_PROMPTS = [[1, 2, 3], [5, 0, 7, 7], [4], [2, 6, 1, 3, 0]]


@pytest.mark.parametrize("tree", [None, "cartesian:2,2"], ids=["chain", "tree"])
def test_greedy_layer_skip_emits_what_plain_decoding_emits_tiny(target, tree):
    config = GenerationConfig(max_new_tokens=16)
    plain = SpeculativeDecoder(target, [], make_verifier("greedy", [], config.policy), config)
    options = {"proposer": "layer-skip", "skip": SKIP, "verifier": "greedy", **({"tree": tree} if tree else {})}
    decoder = build_decoder(make_spec(config, **options), target)
    accepted = 0
    for prompt in GREEDY_PROMPTS:
        result = decoder.generate(prompt)
        assert result.tokens == plain.generate(prompt).tokens
        accepted += sum(result.from_draft)
    assert accepted > 0


# the MLPs of layers 20-28 skipped: drafts are accepted and rejected often enough to exercise both
SMOL_SKIP = "bits:" + "".join("01" if 20 <= i < 29 else "00" for i in range(30))


@pytest.mark.model
def test_greedy_layer_skip_is_plain_decoding_on_smollm2(smol_target, smol_chat_and_plain):
    config = GenerationConfig(max_new_tokens=GREEDY_NEW)
    decoder = build_decoder(make_spec(config, proposer="layer-skip", skip=SMOL_SKIP, verifier="greedy"), smol_target)
    accepted = rejected = 0
    for prompt, plain in smol_chat_and_plain:
        result = decoder.generate(prompt)
        assert result.tokens == plain
        accepted += sum(r.accepted for r in result.records)
        rejected += sum(r.nodes > r.accepted for r in result.records)
    assert len(smol_chat_and_plain) == REAL_PROMPTS and accepted > 0 and rejected > 0
