"""`draftwise calibrate` end to end on the embedded model: prompt lookup, width-2 depth-1
trees, real verification; the artifact's counts reproduce its p and its provenance names
the configuration; then `tree optimize` against a profile of another backend is refused."""

from typer.testing import CliRunner

from draftwise.cli import app
from draftwise.optimize.acceptance import AcceptanceProfile
from draftwise.runtime.cost_profile import VerifyCostProfile


def test_calibrate_prompt_lookup_on_the_embedded_model(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Repeat this list twice: apple, pear, plum, fig, apple, pear, plum, fig.\n"
                       "Write the word 'cat' ten times separated by commas.\n")
    out = tmp_path / "acc"
    result = CliRunner().invoke(app, ["calibrate", "--target", "smollm2-135m", "--backend", "transformers",
                                      "--proposer", "prompt-lookup", "--width", "2", "--workload", f"prompts:{prompts}",
                                      "--max-new-tokens", "24", "--out", str(out)])
    assert result.exit_code == 0, result.output
    profile = AcceptanceProfile.load(out)  # verifies checksums and that p follows from the counts
    prov = profile.provenance
    assert prov["backend"] == "transformers" and prov["width"] == 2 and prov["depth"] == 1
    assert prov["proposers"][0]["name"] == "prompt-lookup" and prov["policy"]["temperature"] == 0.0
    assert prov["rounds"] == profile.reached_counts[0] > 0
    assert sum(profile.selected_counts[0]) > 0  # the repetitive prompts make lookup hit
    assert len(prov["workload_hash"]) == 64 and prov["draft_step_seconds"] >= 0

    VerifyCostProfile.from_absolute([1, 2], [0.01, 0.012], model=prov["target"], backend="llamacpp", threads=2,
                                    machine="test").save(tmp_path / "prof")
    refused = CliRunner().invoke(app, ["tree", "optimize", "--acceptance", str(out), "--profile", str(tmp_path / "prof"),
                                       "--out", str(tmp_path / "tree")])
    assert refused.exit_code == 2 and "backend" in refused.output


def test_calibrate_refuses_an_unknown_proposer(tmp_path):
    result = CliRunner().invoke(app, ["calibrate", "--proposer", "rest", "--out", str(tmp_path / "acc")])
    assert result.exit_code == 2 and "calibration measures" in result.output
    assert not (tmp_path / "acc").exists()
