"""Greedy identity of a heterogeneous round on the embedded model: `prompt-lookup+hydra` (copied
n-grams and the shipped Hydra heads merged by full prefix into one tree, verified greedily) emits
exactly what plain decoding emits on Spec-Bench development prompts, alone and in a batch of
three, and the ledger shows rows from both sources in the rounds."""

import pytest

from draftwise.backends.load import open_batch
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from tests.helpers import make_spec
from tests.integration.conftest import GREEDY_NEW

pytestmark = pytest.mark.model
CONFIG = GenerationConfig(max_new_tokens=GREEDY_NEW)
UNION = {"proposer": "prompt-lookup+hydra", "ngram": 1}  # 1-grams: lookup proposes in short answers too


def test_union_is_token_identical_to_plain_decoding(smol_target, smol_chat_and_plain):
    spec = make_spec(CONFIG, **UNION)
    assert spec.proposer == "prompt-lookup+hydra"
    decoder = build_decoder(spec, smol_target)
    assert decoder.verifier.capabilities.name == "greedy"
    rows = {"prompt-lookup": 0, "hydra": 0}
    for prompt, reference in smol_chat_and_plain:
        result = decoder.generate(prompt)
        assert result.tokens == reference
        for name, source in result.stats.by_source.items():
            rows[name] += int(source["rows"])
    assert rows["prompt-lookup"] > 0 and rows["hydra"] > 0, rows


def test_union_in_a_batch_is_token_identical_to_plain_decoding(smol_target, smol_chat_and_plain):
    spec = make_spec(CONFIG, **UNION)
    prompts = [p for p, _ in smol_chat_and_plain[:5]]
    results = batch_decoder(spec, open_batch(smol_target, 3)).generate_many(prompts)
    for result, (_, reference) in zip(results, smol_chat_and_plain):
        assert not isinstance(result, BaseException), result
        assert result.tokens == reference
