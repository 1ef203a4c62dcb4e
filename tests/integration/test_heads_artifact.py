"""Head-set artifacts: a saved set loads back whole; a set is refused for another tokenizer or
another checkpoint (HeadsMismatch), a tampered weights file or manifest is refused naming it,
and a family mismatch (medusa heads given to proposer hydra, hydra heads to hydra++, ...) or a
width mismatch is refused before the target runs a single forward; every family, Hydra++'s
prefix layer and Clover's augmenting block included, round-trips; a set with a context layer
is refused by a backend that keeps no committed hidden states; an artifact written before the
Hydra++ fields existed (the shipped Hydra set) still loads."""

import json
import re
import shutil

import numpy as np
import pytest
import torch

from draftwise.backends.base import BackendError
from draftwise.build import build_decoder
from draftwise.errors import ArtifactError, InputError
from draftwise.heads.arch import HeadArch, make_heads
from draftwise.heads.artifact import WEIGHTS, HeadSet, HeadsMismatch, load_heads
from draftwise.heads.defaults import default_heads
from draftwise.proposers.heads import HeadsConfig, HeadsProposer
from draftwise.topology.templates import chain
from draftwise.topology.tree_spec import TreeTemplate
from tests.helpers import make_spec
from tests.integration.tiny_heads import random_headset, save_headset
from tests.integration.tiny_models import tiny_backend

FORWARDS = ("extend", "verify", "verify_more", "commit", "reset", "rollback", "truncate", "prefill")


class Spy:
    """The target as it is, recording every call that would run or change it."""

    def __init__(self, backend) -> None:
        self._backend = backend
        self.calls: list[str] = []

    def __getattr__(self, name):
        value = getattr(self._backend, name)
        if name in FORWARDS:
            def recorded(*args, **kwargs):
                self.calls.append(name)
                return value(*args, **kwargs)
            return recorded
        return value


@pytest.fixture(scope="module")
def target():
    return tiny_backend(3)


@pytest.fixture(scope="module", params=["medusa", "hydra", "hydra++", "clover"])
def saved(request, target, tmp_path_factory):
    context = request.param in ("hydra++", "clover")  # with the prefix layer / augmenting block
    headset = random_headset(request.param, target, seed=1, num_heads=3, draft_vocab=6,
                             layers=2 if request.param == "hydra++" else 1, prefix=context)
    return headset, save_headset(tmp_path_factory.mktemp(request.param) / "heads", headset)


def test_a_saved_head_set_loads_back_whole(saved):
    headset, directory = saved
    loaded = load_heads(directory)
    assert loaded.arch == headset.arch
    assert torch.equal(loaded.token_map, headset.token_map)
    assert loaded.target == headset.target
    want, got = headset.heads.state_dict(), loaded.heads.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert loaded.provenance["family"] == headset.arch.family
    assert load_heads(directory).manifest_hash == loaded.manifest_hash


def test_another_tokenizer_or_checkpoint_is_refused(saved, target):
    loaded = load_heads(saved[1])
    loaded.check_target(target.info.checkpoint, target.info.tokenizer_hash)  # its own target: fine
    with pytest.raises(HeadsMismatch, match="tokenizer"):
        loaded.check_target(target.info.checkpoint, "another-tokenizer")
    with pytest.raises(HeadsMismatch, match="tiny-llama-seed3"):
        loaded.check_target("tiny-llama-seed4", target.info.tokenizer_hash)


def test_a_proposer_refuses_heads_of_another_checkpoint_before_any_forward(saved):
    _, directory = saved
    family = load_heads(directory).arch.family
    other = Spy(tiny_backend(4))  # same tokenizer, another checkpoint
    with pytest.raises(HeadsMismatch, match="tiny-llama-seed3"):
        build_decoder(make_spec(proposer=family, heads=directory), other)
    assert other.calls == []


def test_a_tampered_weights_file_is_refused_by_name(saved, tmp_path):
    directory = tmp_path / "heads"
    shutil.copytree(saved[1], directory)
    data = bytearray((directory / WEIGHTS).read_bytes())
    data[-3] ^= 0x01  # one bit of one weight
    (directory / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=WEIGHTS):
        load_heads(directory)


def test_an_edited_manifest_is_refused(saved, tmp_path):
    directory = tmp_path / "heads"
    shutil.copytree(saved[1], directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["provenance"]["target"]["checkpoint"] = "tiny-llama-seed4"  # rebinding by hand
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="edited"):
        load_heads(directory)


@pytest.mark.parametrize("given, asked", [("medusa", "hydra"), ("hydra", "medusa"), ("hydra", "hydra++"),
                                          ("hydra++", "clover"), ("clover", "hydra")])
def test_a_family_mismatch_is_refused_before_any_target_work(given, asked, target, tmp_path):
    directory = save_headset(tmp_path / "heads", random_headset(given, target, seed=2))
    spy = Spy(target)
    with pytest.raises(InputError, match=re.escape(f"{given} heads given to proposer {asked}")):
        build_decoder(make_spec(proposer=asked, heads=directory), spy)
    assert spy.calls == []
    # and through the proposer itself, without the builder
    with pytest.raises(InputError, match=re.escape(f"{given} heads given to proposer {asked}")):
        HeadsProposer(asked, spy, load_heads(directory), HeadsConfig())
    assert spy.calls == []


def test_heads_for_another_width_are_refused(target, tmp_path):
    headset = random_headset("medusa", target, seed=3)
    arch = HeadArch(**{**headset.arch.as_dict(), "hidden_size": 32})  # the tiny model's d is 16
    wide = HeadSet(arch, make_heads(arch), headset.token_map, headset.target, "wide", {"family": "medusa"})
    with pytest.raises(InputError, match="LM head"):
        HeadsProposer("medusa", target, wide, HeadsConfig())


def test_a_tree_deeper_than_the_heads_is_refused(target):
    headset = random_headset("hydra", target, seed=3, num_heads=2)
    with pytest.raises(InputError, match="depth 3 for 2 heads"):
        HeadsProposer("hydra", target, headset, HeadsConfig(tree=TreeTemplate(chain(3))))


def test_a_backend_without_hidden_states_is_refused(target):
    class NoHidden:
        info = target.info

    with pytest.raises(BackendError, match="hidden states"):
        HeadsProposer("medusa", NoHidden(), random_headset("medusa", target, seed=3), HeadsConfig())


def test_no_shipped_heads_for_an_unknown_checkpoint_is_a_clear_error(target):
    with pytest.raises(InputError, match="no medusa heads ship for tiny-llama-seed3"):
        default_heads("medusa", target.info.checkpoint)
    spy = Spy(target)
    with pytest.raises(InputError, match="heads=DIR"):
        build_decoder(make_spec(proposer="medusa"), spy)
    assert spy.calls == []


def test_the_proposer_identity_names_the_head_set(saved, target):
    headset, directory = saved
    loaded = load_heads(directory)
    proposer = HeadsProposer(loaded.arch.family, target, loaded, HeadsConfig())
    identity = proposer.identity()
    assert identity["heads"] == loaded.manifest_hash and identity["arch"] == loaded.arch.as_dict()
    assert np.array_equal(proposer.token_map, headset.token_map.numpy())


class WithoutContext:
    """The target without `track_context` / `context_hidden` (as the llama.cpp backend)."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def __getattr__(self, name):
        if name in ("track_context", "context_hidden"):
            raise AttributeError(name)
        return getattr(self._backend, name)


@pytest.mark.parametrize("family", ["hydra++", "clover"])
def test_a_context_layer_needs_a_backend_that_keeps_committed_states(family, target):
    with_layer = random_headset(family, target, seed=4, prefix=True)
    with pytest.raises(BackendError, match="every committed row's hidden state"):
        HeadsProposer(family, WithoutContext(target), with_layer, HeadsConfig())
    HeadsProposer(family, WithoutContext(target), random_headset(family, target, seed=4), HeadsConfig())  # no layer: fine


def test_the_shipped_hydra_set_written_before_hydra_plus_plus_still_loads():
    from draftwise.heads.defaults import SHIPPED

    loaded = load_heads(SHIPPED / "hydra-smollm2-135m")
    assert loaded.arch.family == "hydra" and not loaded.arch.prefix
    assert "prefix" not in loaded.arch.as_dict()
