"""Self-drafters in a batch (transformers): every request drafts on ONE composed pass over the
model the batch's slots share (`LayerSkipBatch`: the same weights, a draft slot per request), so
a round's draft steps cost one composed forward per level for the whole batch, and its rows are
verified in the batch's shared forward.  Each request's output, and its drafts round by round,
are the ones it has decoded alone, whoever shared its rounds.

Planted faults these checks must catch: a pass over another model than the slots verify with,
and a composed batch whose cache layers are handed back to the wrong layers between forwards."""

from __future__ import annotations

import pytest

from draftwise.backends.layer_skip import LayerSkipBackend
from draftwise.backends.layer_skip_batch import LayerSkipBatch
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.selfdraft.skipset import SkipSet
from draftwise.build import batch_decoder, build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError
from tests.helpers import make_spec
from tests.integration.test_batch_drafting import draft_many_scenario, shared_draft_rounds
from tests.integration.test_batch_engine import PROMPTS, accepted_per_round
from tests.integration.test_kangaroo import random_adapter, saved
from tests.integration.test_transformers_batch import solo_of
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
    assert max(len(r.requests) for r in batch.forwards) == 2
    # one composed forward per draft level for the whole round, several requests drafting in it
    assert shared_draft_rounds(batch, results) >= 3


def test_a_draft_pass_over_another_model_would_be_caught(target, tmp_path, monkeypatch):
    """Planted fault: the batch hands its self-drafters another model than the one its slots
    verify with.  Output stays exact (the verify is the slots' own), but the drafts round by round
    must part from the ones each request makes alone - what the comparison above rests on."""
    spec = make_spec(CONFIG, **options_for("layer-skip", tmp_path, target, None))
    alone = [build_decoder(spec, target).generate(p) for p in PROMPTS[:4]]
    from draftwise.backends import layer_skip

    batch_target = TransformersBatch.from_backend(target, 4)
    other, host = deep_tiny(seed=7), layer_skip.draft_pass_host
    monkeypatch.setattr(layer_skip, "draft_pass_host",
                        lambda t: other if host(t) is batch_target else host(t))  # the fault
    results = batch_decoder(spec, batch_target).generate_many(PROMPTS[:4])
    assert [r.tokens for r in results] == [a.tokens for a in alone]
    assert [accepted_per_round(r) for r in results] != [accepted_per_round(a) for a in alone]


def test_a_self_drafter_is_refused_where_the_batch_cannot_compose_its_layers(target):
    fake = type("OtherBatch", (), {"info": target.info, "max_slots": 2})()  # no transformers model behind it
    with pytest.raises(InputError, match="runs the target's own layers as its draft, which this backend cannot "
                                         "compose per request; batched decoding on transformers runs prompt-lookup"):
        batch_decoder(make_spec(CONFIG, proposer="layer-skip", skip="every-other"), fake)


# ---- the composed batch: draft_many against lone passes -----------------------------------------
def lone_pass(target, family: str) -> LayerSkipBackend:
    if family == "layer-skip":
        return LayerSkipBackend(target, SkipSet.every_other(4))
    return LayerSkipBackend(target, SkipSet.shallow(4, 2), exit=random_adapter(target, exit_layer=2, seed=1),
                            label="kangaroo", exit_key="test")


def fresh_passes(target):
    """A pass of its own (its own cache) over the same model, skip set and exit as `draft`."""
    return lambda draft: LayerSkipBackend(solo_of(target), draft.skip, draft.exit)


@pytest.mark.parametrize("family", ["layer-skip", "kangaroo"])
def test_a_composed_batch_gives_every_slot_what_a_lone_pass_gives(target, family):
    """Extends (short and prompt-long), a tree's levels, a commit, a leave and a join in shared
    composed forwards: every call's logits are a lone pass's."""
    assert draft_many_scenario(LayerSkipBatch, lone_pass(target, family), fresh_passes(target)) == 21


class SwappedLayers(LayerSkipBatch):
    """Planted fault: the cache layers come back from a forward in the wrong order."""

    def _unwrap_cache(self, cache):
        keys, values = super()._unwrap_cache(cache)
        return keys[::-1], values[::-1]


@pytest.mark.parametrize("family", ["layer-skip", "kangaroo"])
def test_a_composed_batch_with_its_layers_swapped_is_caught(target, family):
    with pytest.raises(AssertionError, match="logits differ|argmax"):
        draft_many_scenario(SwappedLayers, lone_pass(target, family), fresh_passes(target))


class Recorded(LayerSkipBatch):
    made: list[LayerSkipBatch] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


class NeverFreed(Recorded):
    """Planted fault: a leaving request's draft slot is never closed."""

    def close(self, slot):
        pass


@pytest.mark.parametrize("kind", [Recorded, NeverFreed], ids=["freed", "planted-never-freed"])
def test_a_batch_shares_one_composed_pass_and_frees_each_requests_slot(target, tmp_path, monkeypatch, kind):
    """5 requests through 2 slots: one composed batch for all of them, every slot closed as its
    request leaves (a slot never freed fills the pass: the third request cannot open one)."""
    from draftwise.backends import layer_skip_batch

    Recorded.made = []
    monkeypatch.setattr(layer_skip_batch, "LayerSkipBatch", kind)
    spec = make_spec(CONFIG, **options_for("kangaroo", tmp_path, target, None))
    results = batch_decoder(spec, TransformersBatch.from_backend(target, 2)).generate_many(PROMPTS[:5])
    freed = (len(Recorded.made) == 1 and Recorded.made[0].open_slots() == ()
             and all(hasattr(r, "tokens") for r in results))
    assert freed == (kind is Recorded)
