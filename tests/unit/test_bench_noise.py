"""The bench's noise verdict: the report says when the machine was too busy for its ratios."""

from draftwise.bench.report import _noise_lines


def check(reliable: bool, cv: float) -> dict:
    verdict = ("ok" if reliable else "UNRELIABLE (the machine was busy: repeat on an idle machine)") + f": {cv}"
    return {"method": "plain", "cv": cv, "load_per_core": 0.5, "reliable": reliable, "verdict": verdict}


def test_a_steady_run_reports_its_noise_check():
    lines = _noise_lines({"start": check(True, 0.03), "end": check(True, 0.05)})
    assert len(lines) == 1 and lines[0].startswith("Noise check (plain") and "end: ok" in lines[0]


def test_a_busy_start_or_end_marks_the_run():
    for noise in ({"start": check(False, 0.3), "end": check(True, 0.02)},
                  {"start": check(True, 0.02), "end": check(False, 0.3)}):
        (line,) = _noise_lines(noise)
        assert line.startswith("**Measured on a busy machine**") and "UNRELIABLE" in line


def test_runs_without_a_check_say_nothing():
    assert _noise_lines({}) == []
    assert _noise_lines({"start": {"method": "plain", "error": "ContextOverflow: x"}}) == []
