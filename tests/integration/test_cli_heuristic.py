"""`--allow-heuristic` on the embedded model: the run goes ahead, and both the text output and
the JSON report say that the output is not distributed as the target alone."""

import json

import pytest
from typer.testing import CliRunner

from draftwise.cli import app

pytestmark = pytest.mark.model
HEURISTIC = ["generate", "def fib(n):", "--backend", "transformers", "--proposer", "prompt-lookup",
             "--lookup-candidates", "2", "--verifier", "typical", "--allow-heuristic", "--temperature", "1",
             "--max-new-tokens", "4"]


def test_a_heuristic_run_says_so_before_its_text_and_in_its_json():
    text = CliRunner().invoke(app, HEURISTIC)
    assert text.exit_code == 0, text.output
    assert "heuristic verifier makes this output" in text.stderr and "NOT distributed" in text.stderr

    report = CliRunner().invoke(app, [*HEURISTIC, "--json"])
    assert report.exit_code == 0, report.output
    payload = json.loads(report.stdout)
    assert payload["exact"] is False and "heuristic" in payload["warning"]


def test_an_exact_run_carries_no_warning():
    report = CliRunner().invoke(app, [*HEURISTIC[:6], "--verifier", "membership", "--temperature", "1",
                                      "--max-new-tokens", "4", "--json"])
    assert report.exit_code == 0, report.output
    payload = json.loads(report.stdout)
    assert payload["exact"] is True and "warning" not in payload
