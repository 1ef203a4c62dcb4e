"""Replaying rounds on a plain trace: hand-worked prompt-lookup rounds, the generation limit,
an EOS accepted from a proposal, the gate, and the time prediction's arithmetic."""

import pytest

from draftwise.runtime.gate import CostGateConfig
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.replay import ReplayedRound, Trace, predicted_seconds, replay, trace_from_records
from draftwise.proposers.prompt_lookup import PromptLookupProposer
from draftwise.topology.compile import TreeLimits

PROMPT = (1, 2, 3, 4, 5, 1, 2)
TOKENS = (3, 4, 5, 9, 1, 2, 3, 8, 8, 8)


def trace(tokens=TOKENS):
    return Trace(PROMPT, tuple(tokens), first_round_s=2.0, step_s=0.5)


def profile(relative):
    return VerifyCostProfile(rows=tuple(range(1, len(relative) + 1)), relative=tuple(relative), absolute_s=None,
                             model="m", backend="transformers", threads=2, machine="test")


def shape(rounds):
    return [(r.nodes, r.accepted, r.emitted, r.gated) for r in rounds]


def run(tokens=TOKENS, max_new_tokens=10, gate=None):
    return replay(trace(tokens), PromptLookupProposer(), max_new_tokens=max_new_tokens, limits=TreeLimits(),
                  context_length=100, gate=gate)


def test_prompt_lookup_rounds_worked_by_hand():
    # round 1: [1, 2] first occurs at 0 -> [3, 4, 5, 1, 2] (the prompt ends there); the trace
    #   takes 3, 4, 5, then 9 (bonus)
    # round 2: neither [5, 9] nor [9] occurred before -> a one-row step (token 1)
    # round 3: [9, 1] no, [1] first at 0 -> [2, 3, 4, 5] (depth cut to 10 - 5 - 1 = 4); 2, 3 accepted, 8 bonus
    # round 4: [3, 8] and [8] never occurred -> one row; round 5: one token left, nothing can be verified
    assert shape(run()) == [(5, 3, 4, False), (0, 0, 1, False), (4, 2, 3, False), (0, 0, 1, False), (0, 0, 1, False)]


def test_a_replay_never_passes_the_generation_limit():
    rounds = run(tokens=TOKENS[:5], max_new_tokens=5)
    assert shape(rounds) == [(4, 3, 4, False), (0, 0, 1, False)]  # round 1's depth cut to 5 - 0 - 1 = 4
    with pytest.raises(ValueError, match="more than max_new_tokens"):
        run(max_new_tokens=9)


def test_an_eos_accepted_from_the_proposal_ends_the_replay_there():
    eos_trace = (3, 4, 5)  # the target ended after 3 tokens (say 5 is EOS); the proposal offered 3, 4, 5, 1, 2
    assert shape(run(tokens=eos_trace)) == [(5, 3, 3, False)]


def test_the_gate_is_replayed_cutting_where_no_round_pays():
    steep = run(gate=CostGateConfig(profile([1.0] + [100.0] * 15)))
    assert steep[0].nodes == 5  # round 1 reads the prompt: never gated
    assert all(r.nodes == 0 for r in steep[1:]) and any(r.gated for r in steep)
    assert sum(r.emitted for r in steep) == len(TOKENS)
    flat = run(gate=CostGateConfig(profile([1.0] * 16)))
    assert shape(flat) == shape(run())


def test_predicted_seconds_add_round_one_the_profile_and_the_proposer():
    rounds = [ReplayedRound(4, 3, 4, False, 0.01), ReplayedRound(0, 0, 1, False, 0.0),
              ReplayedRound(2, 1, 2, True, 0.02)]
    # 2.0 (round 1 as measured) + 0.5 * t(1) + 0.5 * t(3) + proposing
    assert predicted_seconds(trace(), rounds, profile([1.0, 1.5, 2.0, 2.5, 3.0])) == pytest.approx(
        2.0 + 0.5 * 1.0 + 0.5 * 2.0 + 0.03)
    with pytest.raises(ValueError):  # a round wider than the profile measured is refused, not extrapolated
        predicted_seconds(trace(), [rounds[0], ReplayedRound(9, 0, 1, False, 0.0)], profile([1.0, 1.5]))


def test_a_trace_from_records_takes_round_one_and_the_median_step():
    made = trace_from_records([1, 2], [5, 6, 7, 8], [3.0, 0.5, 0.7, 0.6])
    assert (made.first_round_s, made.step_s) == (3.0, 0.6)
    assert Trace.from_dict(made.as_dict()) == made
    with pytest.raises(ValueError):
        Trace((1,), (), 1.0, 1.0)


def test_auto_skips_candidates_a_trace_cannot_replay_and_says_why_when_nothing_fits():
    from dataclasses import replace as _replace

    from draftwise.runtime.round import GenerationConfig

    from draftwise.optimize.auto_proposer import auto_preflight, candidate_specs
    from draftwise.runtime.sampling import SamplingPolicy
    from tests.helpers import make_spec

    sampling = GenerationConfig(policy=SamplingPolicy(temperature=0.8), exact=False)
    typical = make_spec(sampling, proposer="auto", verifier="typical", candidates=4)
    kept, skipped = candidate_specs(typical, has_draft=False)
    assert [name for name, _ in kept] == ["plain"]
    assert any(name == "prompt-lookup" and "its own rule" in why for name, why in skipped)
    # exact mode refuses the heuristic verifier for every candidate, plain included: said, not a crash
    with pytest.raises(ValueError, match="no proposer fits"):
        auto_preflight(_replace(typical, generation=_replace(sampling, exact=True)))


def test_a_one_token_prompt_reads_nothing_in_round_one_so_the_gate_may_cut_it_as_the_engine_does():
    from tests.helpers import result_from_paths

    class Fixed:  # proposes [3, 4] after any context
        name, phase = "fixed", "propose"
        contract = PromptLookupProposer().contract

        def identity(self):
            return {"name": self.name}

        def begin(self, policy, rng):
            pass

        def observe(self, feedback):
            pass

        def propose(self, context, manifest_hash, max_depth=None):
            return result_from_paths([[3, 4][:max_depth]], source="fixed", manifest_hash=manifest_hash,
                                     contract=self.contract)

    one_token = Trace((1,), (3, 4, 5), first_round_s=2.0, step_s=0.5)
    steep = CostGateConfig(profile([1.0] + [100.0] * 15))
    rounds = replay(one_token, Fixed(), max_new_tokens=3, limits=TreeLimits(), context_length=100, gate=steep)
    # the engine's round 1 has no unread prompt token to read here: it is gated like any other
    assert rounds[0].gated and rounds[0].nodes == 0


def test_the_gate_learns_nothing_from_the_round_that_reads_the_prompt():
    # round 1 reads the prompt and offers [3, 4, 5, 6, 1, 2] (after [1, 2]); the trace opens with 9: rejected.
    # round 2: nothing to copy after [2, 9] -> one row (3); round 3: [3] -> [4, 5, 6, 1, 2], 4, 5, 6 accepted.
    # On this step profile the prior (h1 0.5, hc 0.8) verifies depth 5 (2.68 tokens for 2.5 steps); had
    # round 1's rejection counted, h1 would be 1/3 at round 3 (2.12 tokens for 2.5 steps): a plain step.
    step = CostGateConfig(profile([1.0] + [2.5] * 15))
    rounds = replay(Trace((1, 2, 3, 4, 5, 6, 1, 2), (9, 3, 4, 5, 6, 7, 7, 7), 1.0, 0.5), PromptLookupProposer(),
                    max_new_tokens=8, limits=TreeLimits(), context_length=100, gate=step)
    assert shape(rounds)[:3] == [(6, 0, 1, False), (0, 0, 1, False), (5, 3, 4, False)]
