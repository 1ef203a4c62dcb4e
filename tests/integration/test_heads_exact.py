"""Draft heads are exact: on a tiny random Llama with random non-trivial heads over a reduced
draft vocabulary (6 of 8 tokens), the tokens emitted after the first (round 2 onward, where the
heads read the frontier state the verify forward left) follow the target's exact law at
temperature 1 (chi-square, fixed seeds) for sampled Medusa, Hydra, Hydra++ (deeper heads and
the prefix layer over the context) and Clover (with its augmenting block) children: i.i.d.
under SpecInfer, without replacement under Sequoia.  At temperature 0 every family, chain and
tree, emits exactly what plain decoding emits."""

import pytest
import torch

from draftwise.runtime.contracts import SamplingRelation
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.heads import HeadsConfig, HeadsProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.templates import cartesian
from draftwise.topology.tree_spec import TreeTemplate
from draftwise.build import build_decoder
from draftwise.verify.registry import make_verifier
from draftwise.verify.sequoia import SequoiaVerifier
from draftwise.verify.specinfer import SpecInferVerifier
from tests.helpers import make_spec
from tests.integration.tiny_heads import emitted_counts, exact_law, law_p_value, random_headset, save_headset
from tests.integration.tiny_models import tiny_backend

SAMPLES = 600
NEW = 4  # round 1 emits one token; round 2 verifies a depth-2 tree and emits up to three
POLICY = SamplingPolicy(temperature=1.0)
PROMPT = [1, 2, 3]
TREE = TreeTemplate(cartesian([2, 2]))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # a 2-layer model: threads cost more than they give (conftest restores)


@pytest.fixture(scope="module")
def target():
    return tiny_backend(3)


@pytest.fixture(scope="module")
def law(target):
    """[V, V, V]: the exact law of emitted tokens 2..4 (token 1 summed out)."""
    return exact_law(target, POLICY, PROMPT, NEW).sum(axis=0)


# family -> (layers, prefix): Hydra++ with deeper heads and the prefix layer, Clover with the augmenting block
OPTIONS = {"medusa": (1, False), "hydra": (1, False), "hydra++": (2, True), "clover": (1, True)}


@pytest.mark.parametrize("family", list(OPTIONS))
@pytest.mark.parametrize("verifier, relation", [
    (SpecInferVerifier(), SamplingRelation.IID),
    (SequoiaVerifier(), SamplingRelation.WITHOUT_REPLACEMENT),
], ids=["specinfer-iid", "sequoia-without-replacement"])
def test_sampled_head_children_emit_the_target_law(target, law, family, verifier, relation):
    layers, prefix = OPTIONS[family]
    headset = random_headset(family, target, seed=1, num_heads=2, draft_vocab=6, layers=layers, prefix=prefix)
    proposer = HeadsProposer(family, target, headset, HeadsConfig(tree=TREE, relation=relation))
    counts, seen = emitted_counts(target, proposer, verifier, POLICY, PROMPT, SAMPLES, NEW)
    assert seen["accepted"] > 50 and seen["rejected"] > 50  # both the accepted and the residual branches ran
    assert law_p_value(counts, law) > 1e-3


def test_sequoia_stays_exact_when_a_top_k_policy_exhausts_the_draft_vocabulary(target):
    """top-k 2 leaves the heads' q two tokens, and a parent needs three children drawn without
    replacement: the third comes from Sequoia's fallback, uniform over the tokens not drawn yet.
    The verifier reads that law over the target's whole vocabulary, so the proposer must draw it
    there too, not over its draft vocabulary (4 of 8 tokens here)."""
    policy = SamplingPolicy(temperature=1.0, top_k=2)
    law = exact_law(target, policy, PROMPT, 3).sum(axis=0)  # [V, V]: tokens 2 and 3
    headset = random_headset("medusa", target, seed=1, num_heads=2, draft_vocab=4)
    config = HeadsConfig(tree=TreeTemplate(cartesian([3])), relation=SamplingRelation.WITHOUT_REPLACEMENT)
    proposer = HeadsProposer("medusa", target, headset, config)
    counts, _ = emitted_counts(target, proposer, SequoiaVerifier(), policy, PROMPT, 400, 3)
    assert law_p_value(counts, law) > 1e-3


# ---- greedy identity -------------------------------------------------------------------------

GREEDY_PROMPTS = [[1, 2, 3], [5, 0, 7, 7], [4], [2, 6, 1, 3, 0]]


@pytest.fixture(scope="module")
def plain(target):
    config = GenerationConfig(max_new_tokens=16)
    decoder = SpeculativeDecoder(target, [], make_verifier("greedy", [], config.policy), config)
    return [decoder.generate(p).tokens for p in GREEDY_PROMPTS]


@pytest.mark.parametrize("family", list(OPTIONS))
@pytest.mark.parametrize("tree", [None, "cartesian:2,2", "[[0],[1],[2],[0,0],[0,1],[0,0,0]]"], ids=["chain", "cartesian", "sparse"])
def test_greedy_heads_emit_what_plain_decoding_emits(target, plain, family, tree, tmp_path):
    layers, prefix = OPTIONS[family]
    headset = random_headset(family, target, seed=5, num_heads=3, draft_vocab=6, layers=layers, prefix=prefix)
    directory = save_headset(tmp_path / "heads", headset)
    options = {"proposer": family, "heads": directory, "verifier": "greedy"}
    spec = make_spec(GenerationConfig(max_new_tokens=16), **options, **({"tree": tree} if tree else {}))
    decoder = build_decoder(spec, target)
    accepted = 0
    for prompt, reference in zip(GREEDY_PROMPTS, plain):
        result = decoder.generate(prompt)
        assert result.tokens == reference
        assert any(r.nodes for r in result.records[1:])
        accepted += sum(result.from_draft)
    assert accepted > 0  # the heads did contribute somewhere
