"""Bad input and the edges of a round: each gives a clear error or the right output."""

import dataclasses

import pytest

from draftwise.backends.base import ContextOverflow
from draftwise.runtime.contracts import ManifestMismatch
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer, TokenizerMismatch
from draftwise.proposers.prompt_lookup import PromptLookupProposer
from draftwise.verify.base import IncompatibleVerifier
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier
from draftwise.verify.rejection import RejectionVerifier
from draftwise.topology.tree_spec import TreeTemplate
from tests.helpers import result_from_paths

pytestmark = pytest.mark.model


class ScriptedProposer:
    """Proposes a fixed continuation of the prompt (a stand-in for a perfect or broken lookup)."""

    name = "scripted"
    phase = "propose"

    def __init__(self, prompt_len, script, manifest_override=None):
        self.contract = PromptLookupProposer().contract
        self.prompt_len, self.script, self.override = prompt_len, list(script), manifest_override

    def identity(self):
        return {"name": self.name}

    def begin(self, policy, rng):
        pass

    def observe(self, feedback):
        pass

    def propose(self, context, manifest_hash, max_depth=None):
        done = len(context) - self.prompt_len
        chunk = self.script[done: done + 6]
        result = result_from_paths([chunk] if chunk else [], source=self.name,
                                   manifest_hash=self.override or manifest_hash, contract=self.contract)
        return result


def decode(target, proposers, prompt, **config):
    config = GenerationConfig(**config)
    return SpeculativeDecoder(target, proposers, GreedyVerifier(), config).generate(prompt)


@pytest.fixture(scope="module")
def prompt(smol_target):
    return smol_target.chat_prompt([{"role": "user", "content": "Say hello in one short sentence."}])


def test_max_new_tokens_reached_mid_round(smol_target, prompt):
    plain = decode(smol_target, [], prompt, max_new_tokens=40)
    script = list(plain.tokens) + [1, 2, 3]
    for limit in (1, 5, 9):
        result = decode(smol_target, [ScriptedProposer(len(prompt), script)], prompt, max_new_tokens=limit)
        assert result.tokens == plain.tokens[:limit]
        assert result.stop_reason in ("max_new_tokens", "eos")


def test_eos_inside_a_draft_stops_there(smol_target, prompt):
    plain = decode(smol_target, [], prompt, max_new_tokens=80)
    assert plain.stop_reason == "eos", "the prompt should end with EOS within 80 tokens"
    script = list(plain.tokens) + [42, 43, 44]  # junk after EOS must never be published
    result = decode(smol_target, [ScriptedProposer(len(prompt), script)], prompt, max_new_tokens=80)
    assert result.tokens == plain.tokens and result.stop_reason == "eos"
    assert result.tokens[-1] in smol_target.info.eos_token_ids


def test_empty_proposals_fall_back_to_one_target_step(smol_target, prompt):
    plain = decode(smol_target, [], prompt, max_new_tokens=6)
    result = decode(smol_target, [ScriptedProposer(len(prompt), [])], prompt, max_new_tokens=6)
    assert result.tokens == plain.tokens
    assert result.stats.rounds == 6
    # the last round has room for its own target token only: the proposer is not asked then
    assert result.stats.fallbacks == 5
    # round 1 reads the prompt in its forward (the ledger's "prefill"), later rounds verify only
    assert result.records[0].seconds.get("prefill", 0) > 0 and "verify" not in result.records[0].seconds
    assert all("prefill" not in r.seconds for r in result.records[1:])
    assert result.records[0].reads_prompt and not any(r.reads_prompt for r in result.records[1:])


class CountingBackend:
    """Delegates to a backend and counts its forwards: `extend`, `verify` and `verify_more`
    calls, and the rows the verifies evaluated."""

    def __init__(self, inner):
        self.inner = inner
        self.extends = 0
        self.verifies = 0
        self.verify_rows = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def extend(self, tokens):
        self.extends += 1
        return self.inner.extend(tokens)

    def verify(self, pending, round_, unread=()):
        self.verifies += 1
        self.verify_rows += 1 + (0 if round_ is None else round_.n)
        return self.inner.verify(pending, round_, unread)

    def verify_more(self, round_, first_row):
        self.verifies += 1
        self.verify_rows += round_.n - first_row
        return self.inner.verify_more(round_, first_row)


class DepthRecordingProposer:
    """Delegates to a proposer and records the depth each round allowed it."""

    def __init__(self, inner):
        self.inner = inner
        self.depths = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, context, manifest_hash, max_depth=None):
        self.depths.append(max_depth)
        return self.inner.propose(context, manifest_hash, max_depth)

    def drafting(self, context, manifest_hash, max_depth=None):  # a stepped proposer's rounds come here
        self.depths.append(max_depth)
        return (yield from self.inner.drafting(context, manifest_hash, max_depth))


def test_draft_stops_at_what_the_round_can_verify(smol_target, smol_draft, prompt):
    from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer

    counting = CountingBackend(smol_draft)
    proposer = DraftModelProposer(counting, smol_target.info.tokenizer_hash, DraftConfig(k=8, confidence_threshold=0.0))
    result = decode(smol_target, [proposer], prompt, max_new_tokens=3)
    plain = decode(smol_target, [], prompt, max_new_tokens=3)
    assert result.tokens == plain.tokens
    # draft == target: round 1 may verify 2 drafts (+ its own token = 3 = max_new_tokens), so
    # the draft runs twice (prompt + first draft, second draft), not k = 8 times; the target
    # reads the prompt in the same forward
    assert result.stats.rounds == 1 and result.records[0].accepted == 2
    assert counting.extends == 2


def test_stop_string(smol_target, prompt):
    plain = decode(smol_target, [], prompt, max_new_tokens=40)
    text = smol_target.detokenize(plain.tokens)
    word = text.split()[1]
    result = decode(smol_target, [], prompt, max_new_tokens=40, stop_strings=(word,))
    assert result.stop_reason == "stop_string"
    assert word in smol_target.detokenize(result.tokens)
    assert len(result.tokens) < len(plain.tokens)


def test_stop_string_completed_mid_round_cuts_the_rest_of_the_round(smol_target, prompt):
    plain = decode(smol_target, [], prompt, max_new_tokens=40)
    word = smol_target.detokenize(plain.tokens).split()[1]
    plain_stopped = decode(smol_target, [], prompt, max_new_tokens=40, stop_strings=(word,))
    # a perfect lookup: rounds accept up to 6 tokens, so the stop string lands mid-round
    result = decode(smol_target, [ScriptedProposer(len(prompt), plain.tokens)], prompt, max_new_tokens=40,
                    stop_strings=(word,))
    assert max(r.accepted for r in result.records) >= 2
    assert result.tokens == plain_stopped.tokens and result.stop_reason == "stop_string"


def test_cost_gate_is_refused_in_front_of_a_residual_verifier(smol_target, smol_draft):
    """The gate's depth choice reads the proposal's rows, which depend on the drawn tokens:
    fine for greedy and membership, a bias for rejection sampling (refused before any work)."""
    from draftwise.preflight import preflight
    from tests.helpers import make_spec
    from draftwise.runtime.gate import CostGateConfig
    from draftwise.runtime.cost_profile import VerifyCostProfile
    from draftwise.runtime.sampling import SamplingPolicy

    profile = VerifyCostProfile(rows=(1, 2, 3), relative=(1.0, 1.5, 2.0), absolute_s=None, model="smollm2-135m",
                                backend="transformers", threads=2, machine="test")
    sampling = GenerationConfig(policy=SamplingPolicy(temperature=1.0), gate=CostGateConfig(profile))
    draft = DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, DraftConfig(k=2))
    before = smol_target.cached_len
    with pytest.raises(IncompatibleVerifier, match="cost gate"):
        SpeculativeDecoder(smol_target, [draft], RejectionVerifier(), sampling)
    assert smol_target.cached_len == before
    assert SpeculativeDecoder(smol_target, [PromptLookupProposer()], MembershipVerifier(), sampling)
    with pytest.raises(ValueError, match="cost gate"):
        preflight(make_spec(sampling, proposer="draft-model", draft="smollm2-135m", gate="auto"))


def test_context_overflow_is_refused_before_generation(smol_target, prompt):
    with pytest.raises(ContextOverflow, match="max_new_tokens"):
        decode(smol_target, [], prompt, max_new_tokens=smol_target.info.context_length)


def test_manifest_mismatch_is_an_error(smol_target, prompt):
    with pytest.raises(ManifestMismatch):
        decode(smol_target, [ScriptedProposer(len(prompt), [1, 2], manifest_override="0" * 64)], prompt, max_new_tokens=4)
    # the target is left consistent: a normal generation still works
    assert decode(smol_target, [], prompt, max_new_tokens=3).tokens


def test_a_proposal_under_another_contract_than_declared_is_refused(smol_target, prompt):
    from draftwise.runtime.contracts import ContractError, SamplingRelation

    class Relabelling(ScriptedProposer):
        def propose(self, context, manifest_hash, max_depth=None):
            result = super().propose(context, manifest_hash, max_depth)
            return dataclasses.replace(result, contract=dataclasses.replace(result.contract, relation=SamplingRelation.IID))

    with pytest.raises(ContractError, match="declared"):
        decode(smol_target, [Relabelling(len(prompt), [1, 2])], prompt, max_new_tokens=4)
    assert decode(smol_target, [], prompt, max_new_tokens=3).tokens  # the target is left usable


def test_tokenizer_mismatch_is_refused(smol_draft):
    with pytest.raises(TokenizerMismatch, match="tokenizer"):
        DraftModelProposer(smol_draft, "f" * 64, DraftConfig())


def test_incompatible_verifier_refused_before_target_work(smol_target, prompt):
    from draftwise.runtime.sampling import SamplingPolicy

    before = smol_target.cached_len
    with pytest.raises(IncompatibleVerifier):
        SpeculativeDecoder(smol_target, [PromptLookupProposer()], RejectionVerifier(),
                           GenerationConfig(policy=SamplingPolicy(temperature=1.0)))
    with pytest.raises(IncompatibleVerifier, match="temperature"):
        SpeculativeDecoder(smol_target, [PromptLookupProposer()], GreedyVerifier(),
                           GenerationConfig(policy=SamplingPolicy(temperature=1.0)))
    assert smol_target.cached_len == before
    assert SpeculativeDecoder(smol_target, [PromptLookupProposer()], MembershipVerifier(),
                              GenerationConfig(policy=SamplingPolicy(temperature=1.0)))


def test_a_draft_tree_costs_one_draft_pass_per_level_and_reads_each_node_once(smol_target, smol_draft, prompt):
    from draftwise.runtime.contracts import SamplingRelation
    from draftwise.topology.templates import cartesian

    counting = CountingBackend(smol_draft)
    config = DraftConfig(tree=TreeTemplate(cartesian([2, 2, 1])), relation=SamplingRelation.BEAM)
    proposer = DepthRecordingProposer(DraftModelProposer(counting, smol_target.info.tokenizer_hash, config))
    result = decode(smol_target, [proposer], prompt, max_new_tokens=24)
    assert result.tokens == decode(smol_target, [], prompt, max_new_tokens=24).tokens
    levels = [min(3, d) for d in proposer.depths]  # the last rounds may cut the template short
    assert len(levels) >= 3 and max(levels) == 3
    # level 1 comes from the extend that feeds the unseen tokens: no separate pass for it
    assert counting.extends == len(levels)
    assert counting.verifies == sum(level - 1 for level in levels)
    # level 2 reads the pending token and level 1's 2 nodes, level 3 only level 2's 4 nodes
    # (re-reading the tree so far would cost 1 + 2 + 4 more rows at level 3)
    rows_by_level = {1: 0, 2: 1 + 2, 3: 1 + 2 + 4}
    assert counting.verify_rows == sum(rows_by_level[level] for level in levels)
