"""The do-no-harm guard on a request decoded alone (`guard=true`): it makes rounds plain steps
(nothing proposed) while plain steps commit more tokens per second, goes back to speculating
when that pays, and never changes the output."""

from __future__ import annotations

import time

import numpy as np
import pytest

from draftwise.runtime.guard import DoNoHarmConfig
from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.errors import InputError
from draftwise.proposers.prompt_lookup import PromptLookupProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.membership import MembershipVerifier
from tests.helpers import StubProposer, make_spec, result_from_paths
from tests.integration.tiny_models import V, chi_square_p, exact_joint, tiny_backend

PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


@pytest.fixture(scope="module")
def tiny():
    return tiny_backend(3)


class SlowWrongProposer(StubProposer):
    """Proposes a chain that the target mostly does not take, slowly: speculation can only lose."""

    name = "slow-wrong"

    def __init__(self, target, seconds: float) -> None:
        self.target, self.seconds, self.calls = target, seconds, 0

    def propose(self, context, manifest_hash, max_depth=None):
        self.calls += 1
        time.sleep(self.seconds)
        wrong = [(context[-1] + 1 + i) % V for i in range(min(3, max_depth or 3))]
        return result_from_paths([wrong], source=self.name, manifest_hash=manifest_hash, contract=self.contract)


def test_a_losing_proposer_is_asked_only_while_the_guard_explores(tiny):
    plain = SpeculativeDecoder(tiny, [], GreedyVerifier(), GenerationConfig(max_new_tokens=48)).generate(PROMPT)
    proposer = SlowWrongProposer(tiny, 0.05)
    guarded = SpeculativeDecoder(tiny, [proposer], GreedyVerifier(),
                                 GenerationConfig(max_new_tokens=48, guard=DoNoHarmConfig())).generate(PROMPT)
    assert guarded.tokens == plain.tokens
    decoding = guarded.stats.rounds - 1  # round 1 reads the prompt: the guard neither plays nor prices it
    # two rounds of each arm to warm up, then one exploration in 16 at most
    assert proposer.calls <= 1 + 2 + decoding // 16
    assert guarded.stats.guard_plain_rounds == decoding - (proposer.calls - 1)
    unguarded = SlowWrongProposer(tiny, 0.0)
    unguarded_result = SpeculativeDecoder(tiny, [unguarded], GreedyVerifier(),
                                          GenerationConfig(max_new_tokens=48)).generate(PROMPT)
    # without the guard every round with room for a draft asks (the last one, one token left, has none)
    assert unguarded.calls == sum(r.asked for r in unguarded_result.records) >= unguarded_result.stats.rounds - 1


def test_a_paying_proposer_keeps_speculating_under_the_guard(tiny):
    spec = make_spec(GenerationConfig(max_new_tokens=40), proposer="prompt-lookup", guard="true")
    alone = build_decoder(make_spec(GenerationConfig(max_new_tokens=40), proposer="none"), tiny).generate(PROMPT)
    result = build_decoder(spec, tiny).generate(PROMPT)
    assert result.tokens == alone.tokens
    assert result.stats.guard_plain_rounds < result.stats.rounds  # it speculated in some rounds


def test_the_guard_keeps_the_targets_law_at_temperature_one(tiny):
    """Tokens 2 and 3 come from rounds 2 and 3, which a guard exploring every other round plays
    on different arms: their joint law is still the target's (chi-square)."""
    policy = SamplingPolicy(temperature=1.0)
    prompt = [1, 2, 1, 2]
    guard = DoNoHarmConfig(warmup=1, explore_every=2, max_interval=2)
    counts = np.zeros((V, V), dtype=np.int64)
    arms = set()
    for seed in range(1000):
        config = GenerationConfig(max_new_tokens=3, policy=policy, seed=seed, guard=guard)
        result = SpeculativeDecoder(tiny, [PromptLookupProposer()], MembershipVerifier(), config).generate(prompt)
        counts[result.tokens[1], result.tokens[2]] += 1
        arms.update(record.guard_plain for record in result.records[1:])
    assert arms == {True, False}  # both arms played in the rounds the test counts
    first = exact_joint(tiny, policy, prompt).sum(axis=1)  # P(token 1 = x)
    law = sum(first[x] * exact_joint(tiny, policy, [*prompt, x]) for x in range(V))
    assert chi_square_p(counts, law) > 1e-3


def test_guard_words_are_parsed_once_and_bad_ones_refused():
    assert make_spec(proposer="prompt-lookup", guard="on").guard.value == "true"
    assert make_spec(proposer="prompt-lookup").guard.value == "batch"
    with pytest.raises(InputError, match="guard='sometimes'"):
        make_spec(proposer="prompt-lookup", guard="sometimes")


class SlowLookup(PromptLookupProposer):
    """Prompt lookup made slow enough that speculation loses: the guard plays plain steps."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.calls = seconds, 0

    def propose(self, context, manifest_hash, max_depth=None):
        self.calls += 1
        time.sleep(self.seconds)
        return super().propose(context, manifest_hash, max_depth)


def test_plain_rounds_carry_shadow_proposals_within_budget_and_never_verify_them(tiny):
    plain = SpeculativeDecoder(tiny, [], GreedyVerifier(), GenerationConfig(max_new_tokens=48)).generate(PROMPT)
    proposer = SlowLookup(0.02)
    guarded = SpeculativeDecoder(tiny, [proposer], GreedyVerifier(),
                                 GenerationConfig(max_new_tokens=48, guard=DoNoHarmConfig())).generate(PROMPT)
    assert guarded.tokens == plain.tokens
    shadowed = [r for r in guarded.records if r.shadowed]
    assert shadowed and guarded.stats.shadow_rounds == len(shadowed)
    assert all(r.guard_plain and r.nodes == 0 and not r.asked for r in shadowed)  # proposed, never verified
    assert proposer.calls == sum(r.asked for r in guarded.records) + len(shadowed)
    # a 20 ms proposal against the tiny model's ~1 ms step: shadows are spaced far beyond this answer
    assert len(shadowed) <= 2
    cheap = PromptLookupProposer()
    free = SpeculativeDecoder(tiny, [cheap], GreedyVerifier(),
                              GenerationConfig(max_new_tokens=48, guard=DoNoHarmConfig())).generate(PROMPT)
    assert free.tokens == plain.tokens


def test_a_proposer_with_state_gets_no_shadow_proposals(tiny):
    proposer = SlowWrongProposer(tiny, 0.01)  # not marked `proposes_without_state`
    result = SpeculativeDecoder(tiny, [proposer], GreedyVerifier(),
                                GenerationConfig(max_new_tokens=32, guard=DoNoHarmConfig())).generate(PROMPT)
    assert result.stats.guard_plain_rounds > 0 and result.stats.shadow_rounds == 0


def test_a_decoders_next_request_starts_from_its_last_guard_without_warm_up(tiny):
    """A request that ended on plain steps leaves its guard's estimates to the decoder's next
    request: that one reads its prompt without candidates and plays no warm-up rounds (only the
    scheduled explorations ask the proposer), and decodes plain decoding's tokens.  A paying
    proposer's next request speculates from its prompt round on."""
    plain = SpeculativeDecoder(tiny, [], GreedyVerifier(), GenerationConfig(max_new_tokens=48)).generate(PROMPT)
    proposer = SlowWrongProposer(tiny, 0.05)
    decoder = SpeculativeDecoder(tiny, [proposer], GreedyVerifier(),
                                 GenerationConfig(max_new_tokens=48, guard=DoNoHarmConfig()))
    first = decoder.generate(PROMPT)
    assert first.records[0].asked and first.records[-1].guard_plain
    proposer.calls = 0
    second = decoder.generate(PROMPT)
    assert second.tokens == first.tokens == plain.tokens
    assert not second.records[0].asked and second.records[0].guard_plain  # the prompt read: no candidates
    decoding = second.stats.rounds - 1
    assert proposer.calls == sum(r.asked for r in second.records) <= decoding // DoNoHarmConfig().explore_every
    assert not any(r.asked for r in second.records[1:DoNoHarmConfig().explore_every])  # no warm-up
    oracle = OracleProposer(PROMPT, plain.tokens)
    paying = SpeculativeDecoder(tiny, [oracle], GreedyVerifier(),
                                GenerationConfig(max_new_tokens=48, guard=DoNoHarmConfig()))
    paying.generate(PROMPT)
    again = paying.generate(PROMPT)
    assert again.tokens == plain.tokens
    assert again.records[0].asked and again.records[0].accepted > 0  # round 1 verified its candidates
    assert all(r.asked for r in again.records[1:3])


class OracleProposer(StubProposer):
    """Proposes the next 6 tokens of a known answer: speculation commits 7 tokens a round."""

    name = "oracle"

    def __init__(self, prompt, answer) -> None:
        self.text = [*prompt, *answer]

    def propose(self, context, manifest_hash, max_depth=None):
        ahead = self.text[len(context):len(context) + min(6, max_depth or 6)]
        return result_from_paths([ahead] if ahead else [], source=self.name, manifest_hash=manifest_hash,
                                 contract=self.contract)
