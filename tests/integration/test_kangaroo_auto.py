"""`--proposer kangaroo` with `eta=auto` / `adapter=auto` on a deep tiny target and random
adapters: the choice is the measured argmin (plain decoding included: then no drafter), it is
cached and reused only for the same configuration and an intact artifact, and greedy decoding
with the resolved spec is plain decoding.  Times are injected (`measure=`) where a test needs
to know which candidate is fastest; one test times the candidates for real."""

import shutil
from pathlib import Path

import pytest
import torch

from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.errors import InputError
from draftwise.optimize.kangaroo_auto import DATA, KangarooAutoSettings, auto_kangaroo
from draftwise.optimize.kangaroo_tune import ETA_GRID
from draftwise.proposers.family import DrafterResources
from draftwise.proposers.kangaroo import AutoAdapter, AutoEta, KangarooConfig, open_kangaroo
from draftwise.plan import check, resolve_kangaroo
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.registry import make_verifier
from tests.helpers import make_spec
from tests.integration.test_kangaroo import random_adapter, saved
from tests.integration.test_layer_skip_backend import deep_tiny
from tests.integration.test_kangaroo import drafts_accepted_as_plain

PROMPTS = [[1, 2, 3], [5, 0, 7, 7]]
GREEDY = SamplingPolicy()


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class KnownTimes:
    """Seconds per token chosen by the test: plain decoding's, and each (exit layer, eta)'s;
    every call is recorded (("plain",) or (exit layer, eta))."""

    def __init__(self, plain: float, candidates: dict[tuple[int, float], float]) -> None:
        self.plain, self.candidates, self.calls = plain, candidates, []

    def __call__(self, target, proposers, prompts, max_new_tokens, policy=GREEDY, verifier="greedy"):
        if not proposers:
            key, f = ("plain",), self.plain
        else:
            identity = proposers[0].identity()
            key = (identity["exit_layer"], identity["eta"])
            f = self.candidates[key]
        self.calls.append(key)
        return f, {"tokens": 10.0, "accepted": 4.0, "rounds": 5.0, "wall_s": 10 * f}


def times_by_eta(plain: float, fastest_eta: float, exit_layer: int = 2) -> KnownTimes:
    """Every grid eta at 0.5 s/token but `fastest_eta`, at 0.3."""
    return KnownTimes(plain, {(exit_layer, eta): 0.3 if eta == fastest_eta else 0.5 for eta in ETA_GRID})


@pytest.fixture(scope="module")
def target():
    return deep_tiny(seed=2)


@pytest.fixture(scope="module")
def adapters(target, tmp_path_factory):
    """Two adapters for the target, exit layers 1 and 2, in one directory (adapter=auto's root)."""
    root = tmp_path_factory.mktemp("adapters")
    return {layer: saved(root, target, random_adapter(target, exit_layer=layer, seed=1), f"l{layer}")
            for layer in (1, 2)}


def kangaroo_spec(adapter, **options):
    return make_spec(GenerationConfig(max_new_tokens=16), proposer="kangaroo", adapter=str(adapter), eta="auto",
                     **options)


def test_the_choice_is_the_fastest_adapter_and_eta_measured(target, adapters, tmp_path):
    times = KnownTimes(1.0, {(1, 0.2): 0.6, (1, 0.4): 0.7, (1, 0.6): 0.5, (1, 0.8): 0.9,
                             (2, 0.2): 0.45, (2, 0.4): 0.35, (2, 0.6): 0.4, (2, 0.8): 0.8})
    config = KangarooConfig(adapter=AutoAdapter(), eta=AutoEta())
    settings = KangarooAutoSettings(adapter_roots=(adapters[1].parent,))
    choice = auto_kangaroo(target, config, GREEDY, "greedy", PROMPTS, tmp_path, settings, measure=times)
    assert (choice.adapter, choice.eta, choice.f, choice.plain) == (adapters[2].resolve(), 0.4, 0.35, 1.0)
    assert not choice.plain_wins
    assert sorted(times.calls[1:]) == sorted(times.candidates) and times.calls[0] == ("plain",)
    assert [(row["exit_layer"], row["eta"], row["f"]) for row in choice.table] == [
        (*key, f) for key, f in times.candidates.items()]
    assert "exit layer 2, eta 0.4: 0.3500 s/token (2.86x plain" in choice.describe()


def test_eta_auto_resolves_to_the_fastest_eta_and_records_the_table(target, adapters, tmp_path):
    spec = kangaroo_spec(adapters[2])
    assert check(spec) == "greedy"  # planned before loading, eta still auto
    resolved, choices = resolve_kangaroo(spec, target, PROMPTS, tmp_path, measure=times_by_eta(1.0, 0.6))
    assert resolved.family_config == KangarooConfig(adapter=str(adapters[2].resolve()), eta=0.6)
    (choice,) = choices
    assert (choice.what, choice.chosen) == ("eta", "0.6") and "plain decoding: 1.0000 s/token" in choice.detail


def test_plain_decoding_measured_faster_than_every_eta_means_no_drafter(target, adapters, tmp_path):
    spec = kangaroo_spec(adapters[2])
    resolved, (choice,) = resolve_kangaroo(spec, target, PROMPTS, tmp_path, measure=times_by_eta(0.2, 0.6))
    assert resolved.drafter is None and resolved.proposer == "none"
    assert (choice.what, choice.chosen) == ("eta", "none (plain decoding)")
    assert resolved.generation == spec.generation and resolved.target == spec.target


def test_the_measurements_are_reused_only_for_the_same_configuration_and_an_intact_artifact(target, adapters,
                                                                                          tmp_path):
    config = KangarooConfig(adapter=str(adapters[2]), eta=AutoEta())

    def choose(times, policy=GREEDY, prompts=PROMPTS):
        return auto_kangaroo(target, config, policy, "auto", prompts, tmp_path, measure=times)

    first_times = times_by_eta(1.0, 0.4)
    first = choose(first_times)
    assert len(first_times.calls) == 1 + len(ETA_GRID) and first.eta == 0.4

    unused = times_by_eta(1.0, 0.8)
    assert choose(unused) == first and unused.calls == []  # reused: nothing timed

    sampled = times_by_eta(1.0, 0.8)
    other_policy = choose(sampled, policy=SamplingPolicy(temperature=1.0))
    assert sampled.calls and other_policy.eta == 0.8 and other_policy.directory != first.directory

    other_prompts = times_by_eta(1.0, 0.2)
    assert choose(other_prompts, prompts=[[7, 6, 5]]).eta == 0.2 and other_prompts.calls

    data = first.directory / DATA
    data.write_text(data.read_text().replace("{", "{ ", 1))  # the same JSON, other bytes: not trusted
    after_tampering = times_by_eta(1.0, 0.8)
    redone = choose(after_tampering)
    assert after_tampering.calls and redone.eta == 0.8 and redone.directory == first.directory
    assert choose(times_by_eta(1.0, 0.2)).eta == 0.8  # the fresh artifact is the one reused

    # a foreign artifact in this configuration's place (intact, measured for another policy) is not reused
    shutil.rmtree(first.directory)
    shutil.copytree(other_policy.directory, first.directory)
    foreign = times_by_eta(1.0, 0.6)
    assert choose(foreign).eta == 0.6 and foreign.calls


def test_greedy_decoding_with_the_resolved_spec_is_plain_decoding(target, adapters, tmp_path):
    resolved, _ = resolve_kangaroo(kangaroo_spec(adapters[2], verifier="greedy"), target, PROMPTS, tmp_path,
                                   measure=times_by_eta(1.0, 0.4))
    assert resolved.family_config.eta == 0.4
    config = GenerationConfig(max_new_tokens=16)
    plain = SpeculativeDecoder(target, [], make_verifier("greedy", [], config.policy), config)
    assert drafts_accepted_as_plain(build_decoder(resolved, target), plain) > 0


def test_the_candidates_are_timed_by_decoding_them(target, adapters, tmp_path):
    settings = KangarooAutoSettings(etas=(0.2, 0.8), max_new_tokens=6)
    choice = auto_kangaroo(target, KangarooConfig(adapter=str(adapters[1]), eta=AutoEta()), GREEDY, "greedy",
                           PROMPTS, tmp_path, settings)
    assert [row["eta"] for row in choice.table] == [0.2, 0.8] and choice.plain > 0
    assert all(row["f"] > 0 and row["tokens"] == 12 for row in choice.table)
    assert choice.plain_wins or (choice.eta in (0.2, 0.8) and choice.f == min(row["f"] for row in choice.table))


def test_eta_and_adapter_auto_parse_and_the_old_refusals_stand(target, adapters):
    from draftwise.spec import DecoderSpec
    from draftwise.parse import spec_from_options

    assert KangarooConfig().eta == 0.6 and KangarooConfig().adapter is None  # auto is never the default
    spec = kangaroo_spec(adapters[2])
    assert spec.family_config.eta == AutoEta() and "eta=auto" in spec.describe()
    assert make_spec(proposer="kangaroo", adapter="auto").family_config.adapter == AutoAdapter()
    with pytest.raises(InputError, match=r"confidence threshold must be in \[0, 1\), got 1.5"):
        make_spec(proposer="kangaroo", eta="1.5")
    with pytest.raises(InputError, match="a tree never does"):
        make_spec(proposer="kangaroo", eta="auto", tree="chain:3")
    with pytest.raises(InputError, match="eta=auto is not resolved yet"):
        open_kangaroo(spec.family_config, DrafterResources(target))
    with pytest.raises(InputError, match="replays fixed configurations; eta=auto"):
        check(spec_from_options({"proposer": "auto", "eta": "auto"}, DecoderSpec(backend="transformers")))


def test_adapter_auto_finds_every_adapter_bound_to_the_target(target, adapters, tmp_path):
    from draftwise.selfdraft.adapter import adapters_for

    assert adapters_for(target.info.checkpoint, (adapters[1].parent,)) == [adapters[1], adapters[2]]
    other = deep_tiny(seed=5)
    with pytest.raises(InputError, match="no Kangaroo adapter ships or was trained for"):
        adapters_for(other.info.checkpoint, (adapters[1].parent, Path(tmp_path)))
