"""Self-drafters in a batch (transformers): each request drafts on a draft pass of its own over
the model the batch's slots share (the same weights, its own draft cache), and its rows are
verified in the batch's shared forward.  Each request's output, and its drafts round by round,
are the ones it has decoded alone, whoever shared its rounds."""

from __future__ import annotations

import pytest

from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.build import batch_decoder, build_decoder
from draftwise.engine import GenerationConfig
from draftwise.errors import InputError
from tests.helpers import make_spec
from tests.integration.test_batch_engine import PROMPTS, accepted_per_round
from tests.integration.test_kangaroo import random_adapter, saved
from tests.integration.test_layer_skip_backend import deep_tiny

CONFIG = GenerationConfig(max_new_tokens=12)


@pytest.fixture(scope="module")
def target():
    return deep_tiny(seed=2)  # 4 layers: a skip set and Kangaroo's exit both leave some to run


def options_for(family: str, tmp_path, target, tree: str | None) -> dict[str, str]:
    shape = {"tree": tree, "relation": "beam"} if tree else {}
    if family == "layer-skip":
        return {"proposer": "layer-skip", "skip": "every-other", "verifier": "greedy", "guard": "false",
                "adaptive": "false", **shape}
    directory = saved(tmp_path, target, random_adapter(target, seed=1))
    return {"proposer": "kangaroo", "adapter": str(directory), "verifier": "greedy", "eta": "0.3", "guard": "false",
            **shape}


@pytest.mark.parametrize("tree", [None, "cartesian:2,2"], ids=["chain", "tree"])
@pytest.mark.parametrize("family", ["layer-skip", "kangaroo"])
def test_each_request_drafts_on_a_pass_of_its_own_and_decodes_as_alone(target, tmp_path, family, tree):
    spec = make_spec(CONFIG, **options_for(family, tmp_path, target, tree))
    alone = [build_decoder(spec, target).generate(p) for p in PROMPTS[:5]]
    batch = batch_decoder(spec, TransformersBatch.from_backend(target, 2))  # 5 requests through 2 slots
    results = batch.generate_many(PROMPTS[:5])
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert [accepted_per_round(r) for r in results] == [accepted_per_round(a) for a in alone]
    assert sum(sum(r.from_draft) for r in results) > 0  # drafts were accepted
    assert max(len(r.requests) for r in batch.rounds) == 2


def test_a_draft_pass_over_another_model_would_be_caught(target, tmp_path):
    """Planted fault: the batch hands its self-drafters another model than the one its slots
    verify with.  Output stays exact (the verify is the slots' own), but the drafts round by round
    must part from the ones each request makes alone - what the comparison above rests on."""
    spec = make_spec(CONFIG, **options_for("layer-skip", tmp_path, target, None))
    alone = [build_decoder(spec, target).generate(p) for p in PROMPTS[:4]]
    batch_target = TransformersBatch.from_backend(target, 4)
    batch_target.backend = deep_tiny(seed=7)  # the fault
    results = batch_decoder(spec, batch_target).generate_many(PROMPTS[:4])
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert [accepted_per_round(r) for r in results] != [accepted_per_round(a) for a in alone]


def test_a_self_drafter_is_refused_where_the_batch_cannot_compose_its_layers(target):
    fake = type("OtherBatch", (), {"info": target.info, "max_slots": 2})()  # no transformers model behind it
    with pytest.raises(InputError, match="runs the target's own layers as its draft, which this backend cannot "
                                         "compose per request; batched decoding on transformers runs prompt-lookup"):
        batch_decoder(make_spec(CONFIG, proposer="layer-skip", skip="every-other"), fake)
