"""Calibration by real verification on tiny random models: a draft identical to the target
puts all the greedy mass on slot 0; a different draft spreads it, and the slot probabilities
add up to exactly the rounds that accepted a depth-1 child."""

import dataclasses

import numpy as np
import pytest

from draftwise.runtime.contracts import SamplingRelation
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.optimize.calibrate import calibrate, profile_from_counts
from draftwise.proposers.draft_model import calibrated_config
from draftwise.proposers.draft_model import DraftModelProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.greedy import GreedyVerifier
from draftwise.verify.sequoia import SequoiaVerifier
from tests.integration.tiny_models import tiny_backend

PROMPTS = [[1, 2, 3], [4, 5], [6, 0, 7, 1]]
WIDTH = 3


def decoder(draft_seed: int, policy: SamplingPolicy, relation: SamplingRelation, verifier) -> SpeculativeDecoder:
    config = dataclasses.replace(calibrated_config(WIDTH, 1, relation), confidence_threshold=0.0)
    proposer = DraftModelProposer(tiny_backend(draft_seed), "tiny", config)
    return SpeculativeDecoder(tiny_backend(0), [proposer], verifier, GenerationConfig(max_new_tokens=24, policy=policy))


def test_identical_draft_selects_slot_zero_every_round():
    counts = calibrate(decoder(0, SamplingPolicy(), SamplingRelation.BEAM, GreedyVerifier()), PROMPTS, WIDTH, 1)
    assert counts.reached[0] == counts.rounds > 0
    assert counts.selected[0][0] == counts.rounds and sum(counts.selected[0][1:]) == 0
    assert profile_from_counts(counts, {}).p[0] == pytest.approx((1.0, 0.0, 0.0))


def test_greedy_slot_counts_match_accepted_rounds():
    dec = decoder(1, SamplingPolicy(), SamplingRelation.BEAM, GreedyVerifier())
    records = [r for prompt in PROMPTS for r in dec.generate(prompt).records if r.asked]
    counts = calibrate(dec, PROMPTS, WIDTH, 1)
    assert counts.rounds == len(records)
    assert sum(counts.selected[0]) == sum(r.accepted >= 1 for r in records)
    assert 0 < sum(counts.selected[0]) < counts.rounds  # the tiny draft is sometimes right, sometimes not


def test_sampled_calibration_with_sequoia_is_a_valid_profile():
    dec = decoder(1, SamplingPolicy(temperature=1.0), SamplingRelation.WITHOUT_REPLACEMENT, SequoiaVerifier())
    counts = calibrate(dec, PROMPTS, WIDTH, 1)
    profile = profile_from_counts(counts, {"policy": dec.manifest.sampling_policy})
    p = np.array(profile.p[0])
    assert np.all((p >= 0) & (p <= 1)) and p.sum() <= 1
    assert counts.draft_step_seconds > 0
