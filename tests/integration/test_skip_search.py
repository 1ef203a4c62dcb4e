"""`draftwise skip search` on a tiny 4-layer Llama: a few optuna trials produce a skip-set
artifact (vector, f, history, provenance) that `--proposer layer-skip skip=DIR` loads; a rerun
resumes the study and only adds the missing trials; another target is refused."""

import json

import pytest
import torch

from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import ArtifactError, InputError
from draftwise.optimize.skip_search import SearchRecipe, search_skip, write_search
from draftwise.proposers.layer_skip import LayerSkipConfig
from draftwise.selfdraft.skipset import SkipSet, SkipSetMismatch, load_skip, resolve_skip
from tests.helpers import make_spec
from tests.integration.test_layer_skip_backend import deep_tiny

pytest.importorskip("optuna")
PROMPTS = [[1, 2, 3], [5, 0, 7, 7]]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_a_tiny_search_writes_a_loadable_artifact_and_resumes(tmp_path):
    target = deep_tiny(seed=4)
    recipe = SearchRecipe(trials=3, max_new_tokens=6, startup=2)
    seen = []
    result = search_skip(target, recipe, LayerSkipConfig(), tmp_path / "work", PROMPTS, on_trial=seen.append)
    assert len(seen) == 3 and len(result.history) == 3
    assert seen[0]["bits"] == SkipSet.every_other(4).bits()  # trial 0: the simple rule
    assert result.f == min(row["f"] for row in result.history) > 0
    assert set(result.baselines) == {"plain", "every-other"}
    manifest = write_search(tmp_path / "skip", target, recipe, LayerSkipConfig(), PROMPTS, result)
    artifact = load_skip(tmp_path / "skip")
    assert artifact.skip == result.skip and artifact.manifest_hash == manifest.hash
    provenance = artifact.provenance
    assert provenance["f"] == result.f and provenance["trials"] == 3 and provenance["threads"] == 1
    assert provenance["target"]["checkpoint"] == target.info.checkpoint and provenance["prompts"]["hash"]
    assert len(json.loads((tmp_path / "skip" / "history.json").read_text())) == 3

    # resumed: the budget counts the stored trials, and the baselines are not measured again
    more = []
    again = search_skip(target, SearchRecipe(trials=5, max_new_tokens=6, startup=2), LayerSkipConfig(),
                        tmp_path / "work", PROMPTS, on_trial=more.append)
    assert len(more) == 2 and len(again.history) == 5 and again.baselines == result.baselines

    # the artifact drives --proposer layer-skip on its own target, and is refused by another
    spec = make_spec(GenerationConfig(max_new_tokens=8), proposer="layer-skip", skip=str(tmp_path / "skip"),
                     verifier="greedy")
    decoder = build_decoder(spec, target)
    assert decoder.proposers[0].identity()["skip"] == result.skip.bits()
    with pytest.raises(SkipSetMismatch, match="search one for this target"):
        build_decoder(spec, deep_tiny(seed=5))


def test_skip_specs_are_parsed_or_refused_clearly(tmp_path):
    assert resolve_skip("every-other", 4, "c", "t")[0].bits() == "00110011"
    assert resolve_skip("empty", 2, "c", "t")[0].bits() == "0000"
    assert resolve_skip("bits:01100110", 4, "c", "t")[0].skipped == 4
    with pytest.raises(InputError, match="the target has 4"):
        resolve_skip("bits:0110", 4, "c", "t")
    with pytest.raises(InputError, match="0 and 1"):
        resolve_skip("bits:0120", 2, "c", "t")
    with pytest.raises(InputError, match="skip search"):
        resolve_skip(str(tmp_path / "missing"), 4, "c", "t")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError):
        resolve_skip(str(tmp_path / "empty"), 4, "c", "t")


def test_skip_info_and_search_refusals_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from draftwise.cli import app
    from draftwise.selfdraft.skipset import SkipTarget, save_skip

    save_skip(tmp_path / "skip", SkipSet.every_other(4), SkipTarget("c", "t"), {"f": 0.5},
              history=[{"trial": 0, "f": 0.5}])
    shown = CliRunner().invoke(app, ["skip", "info", str(tmp_path / "skip")])
    assert shown.exit_code == 0 and '"bits": "00110011"' in shown.output and '"f": 0.5' in shown.output
    drawn = CliRunner().invoke(app, ["skip", "plot", str(tmp_path / "skip")])
    assert drawn.exit_code == 0 and (tmp_path / "skip" / "search.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "skip" / "history.json").write_text("[]")  # tampered: the checksum no longer matches
    refused = CliRunner().invoke(app, ["skip", "plot", str(tmp_path / "skip")])
    assert refused.exit_code != 0 and "history.json" in refused.output
    bad = CliRunner().invoke(app, ["skip", "search", "--out", str(tmp_path / "o"), "--set", "trials=0"])
    assert bad.exit_code == 2 and "trial" in bad.output
    bad = CliRunner().invoke(app, ["skip", "search", "--out", str(tmp_path / "o"), "--set", "nonsense=1"])
    assert bad.exit_code == 2 and "nonsense" in bad.output


def test_proposer_auto_replays_layer_skip_given_a_skip_set_and_says_why_it_skips_the_others(tmp_path):
    from tests.integration.test_auto_proposer import choose

    target = deep_tiny(seed=4)
    skipped_here, _ = choose(target, tmp_path)  # no skip set, no adapter for this target: both said, with reasons
    reasons = dict(skipped_here.skipped)
    assert "skip=DIR" in reasons["layer-skip"] and "adapter" in reasons["kangaroo"]
    given = make_spec(GenerationConfig(max_new_tokens=24), proposer="auto", skip="bits:01100110")
    choice, _ = choose(target, tmp_path, given)
    assert "layer-skip" in {s.name for s in choice.scores}


def test_a_fixed_size_search_skips_exactly_that_many_sublayers(tmp_path):
    target = deep_tiny(seed=4)
    seen = []
    result = search_skip(target, SearchRecipe(trials=4, max_new_tokens=6, startup=1, size=4), LayerSkipConfig(),
                         tmp_path / "work", PROMPTS, on_trial=seen.append)
    assert [row["skipped"] for row in seen] == [4, 4, 4, 4] and result.skip.skipped == 4
    assert seen[0]["bits"] == SkipSet.every_other(4).bits()  # the rule it is compared with, at equal size
    assert len({row["bits"] for row in seen}) > 1
    with pytest.raises(InputError, match="8 sublayers"):
        search_skip(target, SearchRecipe(trials=1, size=9), LayerSkipConfig(), tmp_path / "w2", PROMPTS)
