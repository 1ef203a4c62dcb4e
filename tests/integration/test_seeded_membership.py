"""At temperature 1, a seeded request verified by target-sample membership publishes plain
decoding's text at the same seed (`sampling.PositionDraws`): the target's sample at each position
takes that position's draw, whatever was proposed, gated, guarded or shadowed, and whoever shared
the batch.  On a tiny float32 model every row is computed alike, so the texts are token-identical."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.membership import MembershipVerifier
from tests.helpers import make_spec
from tests.integration.tiny_models import tiny_backend

T1 = SamplingPolicy(temperature=1.0)
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6], [2, 3, 2, 3, 2, 3, 2, 3, 1]]
SEEDS = range(6)


@pytest.fixture(scope="module")
def pair():
    """A tiny target and a tiny draft model of its vocabulary."""
    return tiny_backend(3), tiny_backend(5)


def config(seed: int, tokens: int = 24) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=tokens, policy=T1, seed=seed)


def plain(tiny, prompt, seed):
    return build_decoder(make_spec(config(seed), proposer="none"), tiny).generate(prompt).tokens


@pytest.mark.parametrize("options", [dict(proposer="prompt-lookup", lookup=3, guard="false"),
                                     dict(proposer="prompt-lookup", lookup=2, candidates=3, guard="false"),
                                     dict(proposer="prompt-lookup", lookup=3, guard="true"),
                                     dict(proposer="draft-model", draft="tiny", k=3, guard="false"),
                                     dict(proposer="draft-model", draft="tiny", tree="wbd:2,1", guard="false")],
                         ids=["lookup-chain", "lookup-tree", "lookup-guarded", "draft-chain", "draft-tree"])
def test_a_seeded_membership_decode_is_plain_decodings_text(pair, options):
    """A draft model samples its drafts from the request's generator at temperature 1, so the
    draft families would move a sequential stream's draws; the prompt lookup ones check the
    position arithmetic on chains and trees."""
    tiny, draft = pair
    accepted = 0
    for prompt in PROMPTS:
        for seed in SEEDS:
            decoder = build_decoder(make_spec(config(seed), verifier="membership", **options), tiny, draft)
            result = decoder.generate(prompt)
            assert result.tokens == plain(tiny, prompt, seed), (prompt, seed)
            accepted += sum(r.accepted for r in result.records)
    assert accepted > 0  # drafts were accepted: the equality is not plain decoding's by default


def test_in_a_batch_too_whoever_the_batch_mates(pair):
    tiny, draft = pair
    spec = make_spec(config(0), proposer="draft-model", draft="tiny", k=3, verifier="membership", guard="false")
    batch = batch_decoder(spec, TransformersBatch.from_backend(tiny, 3), draft)
    jobs = [(prompt, seed) for prompt in PROMPTS for seed in (11, 12)]
    results = batch.generate_many([p for p, _ in jobs], [config(seed) for _, seed in jobs])
    assert [r.tokens for r in results] == [plain(tiny, p, s) for p, s in jobs]


def test_without_position_draws_the_texts_part(pair):
    """The planted contrast: the same membership verifier drawing from the request's sequential
    generator, which the draft model's sampling advances, publishes other texts."""
    tiny, draft = pair

    class Sequential(MembershipVerifier):
        def select(self, round_, target, policy, rng, draws=None):
            return super().select(round_, target, policy, rng)

    spec = make_spec(config(0), proposer="draft-model", draft="tiny", k=3, guard="false")
    differ = 0
    for seed in SEEDS:
        drafting = build_decoder(replace(spec, generation=config(seed)), tiny, draft)
        sequential = SpeculativeDecoder(tiny, drafting.proposers, Sequential(), drafting.config)
        alone = SpeculativeDecoder(tiny, [], Sequential(), drafting.config)
        differ += sequential.generate(PROMPTS[0]).tokens != alone.generate(PROMPTS[0]).tokens
    assert differ > 0
