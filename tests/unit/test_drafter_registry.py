"""A drafter family plugs in as one module plus one registration: parsed from the same keys,
negotiated before loading, built, decoded exactly, and told what each round accepted."""

import pytest

from draftwise.api import open_decoder
from draftwise.bench.methods import MethodDefaults, MethodError, parse_method
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError
from draftwise.proposers.registry import DRAFTERS
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.spec import DecoderSpec
from draftwise.parse import spec_from_options
from tests.integration.tiny_models import PROMPT, tiny_backend
from tests.toy import repeat_last

REGISTRY = DRAFTERS.with_family(repeat_last.FAMILY)
BASE = DecoderSpec(backend="transformers", generation=GenerationConfig(max_new_tokens=12))


def test_the_library_registry_is_unchanged_and_names_are_refused_with_the_choices():
    assert "repeat-last" in REGISTRY.names() and "repeat-last" not in DRAFTERS.names()
    with pytest.raises(InputError, match=r"choose none, prompt-lookup, draft-model, rest, medusa, hydra, hydra\+\+, clover, "
                                         r"layer-skip, kangaroo, auto"):
        DRAFTERS.get("repeat-last")
    with pytest.raises(ValueError, match="twice"):
        REGISTRY.with_family(repeat_last.FAMILY)


def test_keys_come_from_the_config_and_a_wrong_one_lists_the_valid_ones():
    spec = spec_from_options({"proposer": "repeat-last", "repeat": "4"}, BASE, REGISTRY)
    assert spec.family_config.repeat == 4 and spec.proposer == "repeat-last"
    with pytest.raises(InputError, match="lookup configures prompt-lookup, not repeat-last; its keys: repeat"):
        spec_from_options({"proposer": "repeat-last", "lookup": "4"}, BASE, REGISTRY)
    with pytest.raises(InputError, match="repeat must be >= 1"):
        spec_from_options({"proposer": "repeat-last", "repeat": "0"}, BASE, REGISTRY)
    with pytest.raises(InputError, match="not an integer"):
        spec_from_options({"proposer": "repeat-last", "repeat": "many"}, BASE, REGISTRY)


def test_the_bench_parses_the_same_keys_with_the_same_refusals():
    defaults = MethodDefaults("smollm2-135m", None, GenerationConfig())
    with pytest.raises(MethodError, match="unknown key"):
        parse_method("x=dw:proposer=prompt-lookup,lookupp=3", defaults)


def test_negotiation_refuses_a_verifier_before_any_model_is_loaded():
    sampling = BASE.generation.__class__(policy=SamplingPolicy(temperature=1.0))
    spec = spec_from_options({"proposer": "repeat-last", "verifier": "rejection"},
                             DecoderSpec(backend="transformers", generation=sampling), REGISTRY)
    loads = []
    with pytest.raises(Exception, match="cannot verify"):
        open_decoder(spec, loader=lambda *a: loads.append(a))
    assert loads == []


def test_a_new_family_decodes_exactly_and_its_proposer_is_told_what_was_accepted():
    spec = spec_from_options({"proposer": "repeat-last", "repeat": "3"}, BASE, REGISTRY)
    target = tiny_backend(0)
    decoder = open_decoder(spec, loader=lambda model, backend, role: target)
    result = decoder.generate(PROMPT)
    plain = decoder.plain().generate(PROMPT)
    assert result.tokens == plain.tokens
    proposer = decoder.engine.proposers[0]
    assert len(proposer.accepted) == len(result.records)
    assert [r.accepted for r in result.records] == proposer.accepted  # the feedback is the round's own count
