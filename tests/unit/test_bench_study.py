"""`bench.study.write_study`: what every study script under benchmarks/ writes."""

from __future__ import annotations

import json

import pytest

from draftwise.bench.study import read_noise, write_study
from draftwise.timing import Spread


def test_a_study_writes_its_results_with_spreads_as_fields_and_its_report(tmp_path, capsys):
    spread = Spread.of([1.0, 3.0, 2.0])
    write_study(tmp_path, {"rows": [{"method": "plain", "tok_s": spread}], "nested": {"ratio": spread}},
                ["# title", "", "| a |"])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["rows"][0] == {"method": "plain", "tok_s": {"median": 2.0, "low": 1.0, "high": 3.0,
                                                                "samples": [1.0, 3.0, 2.0]}}
    assert results["nested"]["ratio"]["median"] == 2.0
    assert (tmp_path / "report.md").read_text() == "# title\n\n| a |\n"
    assert capsys.readouterr().out == "# title\n\n| a |\n"


def test_a_study_refuses_what_json_cannot_write(tmp_path):
    with pytest.raises(TypeError, match="set"):
        write_study(tmp_path, {"rows": {1, 2}}, [])
    with pytest.raises(TypeError, match="type"):
        write_study(tmp_path, {"rows": Spread}, [])  # a dataclass class, not an instance


def test_the_noise_probe_reads_the_same_tokens_afresh_each_time():
    calls: list[tuple] = []

    class Reads:
        def reset(self) -> None:
            calls.append(("reset",))

        def extend(self, tokens) -> None:
            calls.append(("extend", tuple(tokens)))

    described = read_noise(Reads(), (4, 5, 6))
    assert described.startswith(("ok", "UNRELIABLE"))
    assert len(calls) >= 4 and calls[::2] == [("reset",)] * (len(calls) // 2)
    assert set(calls[1::2]) == {("extend", (4, 5, 6))}
