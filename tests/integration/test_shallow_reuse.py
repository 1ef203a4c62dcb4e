"""Kangaroo's shallow-feature reuse: a chain verify that starts at the exit layer for the rows
the draft already computed gives the target's logits (as a verify without reuse does), commits
a cache that equals a fresh prefill, and any mismatching metadata field disables it."""

import dataclasses

import numpy as np
import pytest
import torch

from draftwise.backends.shallow_reuse import ShallowReuseBackend
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.proposers.family import DrafterResources
from draftwise.proposers.kangaroo import KangarooConfig, open_kangaroo
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import compile_round
from draftwise.verify.registry import make_verifier
from tests.helpers import assert_rows_close
from tests.integration.test_kangaroo import random_adapter, saved
from tests.integration.test_layer_skip_backend import PREFIX, deep_tiny, rows_of

GREEDY = SamplingPolicy()


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def setup(tmp_path):
    base = deep_tiny(seed=2)
    target = ShallowReuseBackend.of(base)
    directory = saved(tmp_path, base, random_adapter(base, seed=1))
    proposer = open_kangaroo(KangarooConfig(adapter=str(directory), eta=0.0, k=4), DrafterResources(target))
    proposer.begin(GREEDY, np.random.default_rng(0))
    return target, proposer


def drafted_round(target, proposer, context):
    """Commit context[:-1] on the target, draft a chain after it (offering the shallow rows)."""
    target.reset()
    target.extend(context[:-1])
    result = proposer.propose(context, "m")
    return result, compile_round(len(context), [result])


def test_a_verify_reusing_the_shallow_rows_gives_the_targets_logits(setup):
    target, proposer = setup
    result, round_ = drafted_round(target, proposer, PREFIX)
    reused = target.verify(PREFIX[-1], round_).logits.clone()
    assert target.last_reused == len(result.nodes)  # the pending row and every drafted token the draft fed
    target.rollback()
    plain = target.verify(PREFIX[-1], round_).logits.clone()
    assert target.last_reused == 0  # the offer is one-shot
    assert_rows_close(reused, plain)


def test_the_reused_rows_commit_into_a_cache_that_equals_a_fresh_prefill(setup):
    target, proposer = setup
    result, round_ = drafted_round(target, proposer, PREFIX)
    logits = target.verify(PREFIX[-1], round_)
    accepted = list(range(2))
    target.commit(accepted)
    bonus = int(logits.argmax()[2])
    committed = PREFIX + [int(round_.token_ids[r]) for r in accepted] + [bonus]
    got = target.verify(bonus, None).logits[0].clone()
    target.rollback()
    assert_rows_close(got, rows_of(target, committed, None)[0])


@pytest.mark.parametrize("field", ["checkpoint", "boundary", "token", "position", "ancestry", "dtype", "generation"])
def test_any_metadata_mismatch_disables_reuse(setup, field):
    target, proposer = setup
    _, round_ = drafted_round(target, proposer, PREFIX)
    plain = rows_of(ShallowReuseBackend.of(target), PREFIX, None)  # (a fresh backend: the offer stays)
    changed = {"checkpoint": "other", "boundary": 3, "token": 7, "position": -1, "ancestry": "0" * 64,
               "dtype": "bfloat16", "generation": -1}[field]
    target._offered = [dataclasses.replace(row, meta=dataclasses.replace(row.meta, **{field: changed}))
                       for row in target._offered]
    logits = target.verify(PREFIX[-1], round_).logits.clone()
    assert target.last_reused == 0
    target.rollback()
    assert_rows_close(logits[0], plain[0])


def test_a_cut_cache_bumps_the_generation_so_an_older_offer_is_refused(setup):
    target, proposer = setup
    _, round_ = drafted_round(target, proposer, PREFIX)
    target.truncate(len(PREFIX) - 2)
    target.extend(PREFIX[-3:-1])  # the same tokens again, but the cache was cut in between
    target.verify(PREFIX[-1], round_)
    assert target.last_reused == 0


def test_greedy_kangaroo_with_reuse_is_plain_decoding(setup):
    target, proposer = setup
    config = GenerationConfig(max_new_tokens=16)
    plain = SpeculativeDecoder(target, [], make_verifier("greedy", [], config.policy), config)
    decoder = SpeculativeDecoder(target, [proposer], make_verifier("greedy", [proposer.contract], config.policy), config)
    before = target.reused_total
    for prompt in ([1, 2, 3], [5, 0, 7, 7], [2, 6, 1, 3, 0]):
        assert decoder.generate(prompt).tokens == plain.generate(prompt).tokens
    assert target.reused_total > before  # rounds after the first reused rows
    # the draft keeps rows from the pending position on only (a chain of k = 4): memory does not grow with the text
    assert len(proposer.draft.batch._shallow) <= 4 + 1


def test_the_decoder_verifies_with_the_reusing_view_of_the_target(tmp_path):
    from draftwise.build import build_decoder
    from tests.helpers import make_spec

    base = deep_tiny(seed=2)
    directory = saved(tmp_path, base, random_adapter(base, seed=1))
    config = GenerationConfig(max_new_tokens=16)
    options = {"proposer": "kangaroo", "adapter": str(directory), "verifier": "greedy", "eta": "0.0"}
    decoder = build_decoder(make_spec(config, **options), base)
    view = decoder.target
    assert isinstance(view, ShallowReuseBackend) and view.model is base.model  # no second copy of the weights
    plain = SpeculativeDecoder(base, [], make_verifier("greedy", [], config.policy), config)
    for prompt in ([1, 2, 3], [5, 0, 7, 7]):
        assert decoder.generate(prompt).tokens == plain.generate(prompt).tokens
    assert view.reused_total > 0
    without = build_decoder(make_spec(config, **options, reuse="false"), base)
    assert without.target is base


def test_reuse_on_qwen2_gives_the_targets_logits(tmp_path):
    from tests.integration.test_layer_skip_backend import tiny_qwen2

    base = tiny_qwen2(seed=1)
    target = ShallowReuseBackend.of(base)
    directory = saved(tmp_path, base, random_adapter(base, seed=1))
    proposer = open_kangaroo(KangarooConfig(adapter=str(directory), eta=0.0, k=4), DrafterResources(target))
    proposer.begin(GREEDY, np.random.default_rng(0))
    result, round_ = drafted_round(target, proposer, PREFIX)
    reused = target.verify(PREFIX[-1], round_).logits.clone()
    assert target.last_reused == len(result.nodes)
    target.rollback()
    assert_rows_close(reused, target.verify(PREFIX[-1], round_).logits)
