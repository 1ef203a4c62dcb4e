"""`generate --compare-ar` on the embedded model: exactness from the cold runs, speed from
warmed-up interleaved pairs with a median ratio, its range and a noise verdict."""

import json

import pytest
from typer.testing import CliRunner

from draftwise.cli import app

pytestmark = pytest.mark.model
COMPARE = ["generate", "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n", "--backend", "transformers",
           "--proposer", "prompt-lookup", "--max-new-tokens", "12", "--compare-ar"]


def test_compare_ar_times_interleaved_pairs_and_reports_the_spread_and_the_noise():
    out = CliRunner().invoke(app, [*COMPARE, "--repeats", "3", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["identical_to_ar"] is True and report["timed_pairs"] == 3
    low, high = report["speedup_range"]
    assert low <= report["speedup"] <= high
    # the speedup is the median of the pairs' ratios, not the ratio of the medians: under noise the
    # two may differ by any factor, so only their signs are comparable
    assert report["tokens_per_s"] > 0 and report["ar_tokens_per_s"] > 0 and report["speedup"] > 0
    assert isinstance(report["measurement_reliable"], bool)
    assert report["noise"].startswith("ok" if report["measurement_reliable"] else "UNRELIABLE")


def test_compare_ar_refuses_no_timed_pair():
    out = CliRunner().invoke(app, [*COMPARE, "--repeats", "0"])
    assert out.exit_code == 2 and "--repeats 0" in out.stderr
