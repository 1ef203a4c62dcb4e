"""`draftwise bench compare`: per-method ratios between two summary.json files, and the CLI."""

import json

from typer.testing import CliRunner

from draftwise.cli.bench import bench_app
from draftwise.bench.compare import compare, method_differences, settings_differences


def summary(tps, speedup, accepted, mismatches=0, max_new_tokens=128, methods=("dw", "hf-plain")):
    def m(scale):
        block = {"questions": 2, "tokens_per_s": tps * scale, "speedup": speedup * scale, "mean_accepted": accepted,
                 "ms_per_token": 1000 / (tps * scale), "mismatches": mismatches}
        return {"overall": block, "categories": {"qa": dict(block)}}
    return {"settings": {"max_new_tokens": max_new_tokens, "methods": list(methods)},
            "methods": {name: m(1.0 if name != "hf-plain" else 0.5) for name in methods}}


def test_ratios_are_b_over_a():
    a, b = summary(10.0, 2.0, 1.5), summary(15.0, 2.5, 2.0, mismatches=1)
    changes, only_a, only_b = compare(a, b)
    dw = next(c for c in changes if c.method == "dw")
    assert dw.ratio["tokens_per_s"] == 1.5 and dw.ratio["speedup"] == 1.25
    assert dw.ratio["ms_per_token"] == round(1 / 1.5, 4)
    assert dw.mismatches == (0, 1)
    assert only_a == only_b == []
    with_categories, _, _ = compare(a, b, categories=True)
    assert {c.scope for c in with_categories} == {"overall", "qa"}


def test_added_removed_and_settings():
    a = summary(10.0, 2.0, 1.5, methods=("dw", "old"))
    b = summary(10.0, 2.0, 1.5, methods=("dw", "new"), max_new_tokens=64)
    changes, only_a, only_b = compare(a, b)
    assert [c.method for c in changes] == ["dw"] and only_a == ["old"] and only_b == ["new"]
    assert settings_differences(a, b) == ["max_new_tokens: 128 -> 64"]


def test_partial_runs_and_changed_references_are_flagged():
    a, b = summary(10.0, 2.0, 1.5), summary(10.0, 2.0, 1.5)
    assert method_differences(a, b) == []
    b["methods"]["dw"]["overall"]["questions"] = 60
    b["methods"]["hf-plain"]["reference"] = "dw-plain"
    assert method_differences(a, b) == [
        "dw: 2 questions in A, 60 in B (the ratios compare different question sets)",
        "hf-plain: speedup over None in A, over dw-plain in B",
    ]


def test_cli_compare(tmp_path):
    for name, s in (("a", summary(10.0, 2.0, 1.5)), ("b", summary(20.0, 3.0, 1.5))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    result = CliRunner().invoke(bench_app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["changes"][0]["ratio"]["tokens_per_s"] == 2.0
    missing = CliRunner().invoke(bench_app, ["compare", str(tmp_path / "a"), str(tmp_path / "nowhere")])
    assert missing.exit_code == 2


def test_cli_run_reports_config_errors_before_loading(tmp_path):
    result = CliRunner().invoke(bench_app, ["--workload", "humaneval:0-1", "--method", "x=dw:proposer=magic",
                                            "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "unknown proposer" in result.output
    assert not (tmp_path / "o").exists()
