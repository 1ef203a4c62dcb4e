"""Greedy equality with plain decoding, on the embedded model and real Spec-Bench prompts."""

import pytest

from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer
from draftwise.topology.templates import parse_template
from draftwise.verify.registry import make_verifier
from draftwise.topology.tree_spec import TreeTemplate
from tests.integration.conftest import GREEDY_NEW

pytestmark = pytest.mark.model
NEW = GREEDY_NEW
CONFIG = GenerationConfig(max_new_tokens=NEW)


def run(target, proposers, prompt, config=CONFIG, verifier="auto"):
    v = make_verifier(verifier, [p.contract for p in proposers], config.policy)
    return SpeculativeDecoder(target, proposers, v, config).generate(prompt)


@pytest.fixture(scope="module")
def prompts_and_plain(smol_chat_and_plain):
    """The session's chat prompts and their plain greedy answers of NEW tokens."""
    return [p for p, _ in smol_chat_and_plain], [t for _, t in smol_chat_and_plain]


def test_plain_matches_transformers_generate(smol_target, prompts_and_plain):
    import torch

    prompts, plain = prompts_and_plain
    ids = torch.tensor([prompts[0]])
    out = smol_target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    assert tuple(out[0, len(prompts[0]):].tolist()) == plain[0]


@pytest.mark.parametrize("candidates", [1, 4])
def test_prompt_lookup_is_token_identical(smol_target, prompts_and_plain, candidates):
    prompts, plain = prompts_and_plain
    proposer = PromptLookupProposer(PromptLookupConfig(max_candidates=candidates))
    accepted = 0
    for prompt, reference in zip(prompts, plain):
        result = run(smol_target, [proposer], prompt)
        assert result.tokens == reference
        accepted += sum(result.from_draft)
    assert accepted > 0  # the proposer did contribute somewhere


def test_draft_model_is_token_identical(smol_target, smol_draft, prompts_and_plain):
    prompts, plain = prompts_and_plain
    proposer = DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, DraftConfig(k=4))
    for prompt, reference in zip(prompts, plain):
        assert run(smol_target, [proposer], prompt).tokens == reference


def test_draft_model_tree_is_token_identical(smol_target, smol_draft, prompts_and_plain):
    from draftwise.runtime.contracts import SamplingRelation

    prompts, plain = prompts_and_plain
    config = DraftConfig(tree=TreeTemplate(parse_template("wbd:2,2,1")), relation=SamplingRelation.BEAM)
    proposer = DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, config)
    for prompt, reference in list(zip(prompts, plain))[:4]:
        assert run(smol_target, [proposer], prompt).tokens == reference


def test_draft_equal_to_target_accepts_everything(smol_target, smol_draft, prompts_and_plain):
    prompts, _ = prompts_and_plain
    k = 4
    proposer = DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, DraftConfig(k=k, confidence_threshold=0.0))
    result = run(smol_target, [proposer], prompts[1])
    full_rounds = result.records[:-1]  # the last round may be cut by max_new_tokens
    assert all(r.accepted == k for r in full_rounds)
    assert result.stats.acceptance_by_depth == [1.0] * k


def test_sampling_with_rejection_runs_and_is_seeded(smol_target, smol_draft, prompts_and_plain):
    from draftwise.runtime.sampling import SamplingPolicy

    prompts, _ = prompts_and_plain
    config = GenerationConfig(max_new_tokens=16, policy=SamplingPolicy(temperature=0.8, top_p=0.95), seed=7)
    proposer = DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, DraftConfig(k=3))
    a = run(smol_target, [proposer], prompts[0], config)
    b = run(smol_target, [proposer], prompts[0], config)
    assert a.verifier == "rejection"
    assert a.tokens == b.tokens and len(a.tokens) == 16


def _profile(relative):
    from draftwise.runtime.cost_profile import VerifyCostProfile

    return VerifyCostProfile(rows=tuple(range(1, len(relative) + 1)), relative=tuple(relative), absolute_s=None,
                             model="smollm2-135m", backend="transformers", threads=2, machine="test")


@pytest.mark.parametrize("candidates", [1, 4])
def test_cost_gate_is_token_identical_and_both_gates_and_speculates(smol_target, prompts_and_plain, candidates):
    from draftwise.runtime.gate import CostGateConfig

    # this CPU's transformers shape: one row cheap, every wider round ~3.3 plain steps
    config = GenerationConfig(max_new_tokens=NEW, gate=CostGateConfig(_profile([1.0] + [3.3] * 64)))
    proposer = PromptLookupProposer(PromptLookupConfig(max_candidates=candidates))
    prompts, plain = prompts_and_plain
    gated = speculated = 0
    for prompt, reference in zip(prompts[:5], plain[:5]):  # half the prompts: the suite's time budget
        result = run(smol_target, [proposer], prompt, config)
        assert result.tokens == reference
        gated += result.stats.gated_rounds
        speculated += sum(r.nodes > 0 for r in result.records[1:])
    assert gated > 0 and speculated > 0  # the gate decided both ways on real prompts


def test_cost_gate_where_no_round_pays_decodes_plain_steps(smol_target, prompts_and_plain):
    from draftwise.runtime.gate import CostGateConfig

    config = GenerationConfig(max_new_tokens=NEW, gate=CostGateConfig(_profile([1.0] + [100.0] * 64)))
    prompts, plain = prompts_and_plain
    result = run(smol_target, [PromptLookupProposer()], prompts[0], config)
    assert result.tokens == plain[0]
    assert all(r.nodes == 0 for r in result.records[1:])  # round 1 reads the prompt: never gated
    assert result.stats.gated_rounds == sum(r.gated for r in result.records) > 0


def test_cost_gate_on_a_flat_profile_cuts_nothing(smol_target, prompts_and_plain):
    from draftwise.runtime.gate import CostGateConfig

    prompts, _ = prompts_and_plain
    ungated = run(smol_target, [PromptLookupProposer()], prompts[1])
    flat = run(smol_target, [PromptLookupProposer()], prompts[1],
               GenerationConfig(max_new_tokens=NEW, gate=CostGateConfig(_profile([1.0] * 65))))
    assert flat.stats.gated_rounds == 0
    assert [(r.nodes, r.accepted) for r in flat.records] == [(r.nodes, r.accepted) for r in ungated.records]
