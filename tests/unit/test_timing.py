"""Interleaved, warmed-up comparisons with a noise check (`draftwise.timing`)."""

from __future__ import annotations

import time

import pytest

from draftwise.errors import InputError
from draftwise.timing import Spread, interleaved, noise_check


def test_runs_alternate_with_the_order_rotated_and_warmups_first():
    calls: list[str] = []
    runs = {"spec": lambda: calls.append("spec") or 2.0, "plain": lambda: calls.append("plain") or 1.0}
    warm = {"spec": lambda: calls.append("warm-spec"), "plain": lambda: calls.append("warm-plain")}
    comparison = interleaved(runs, repeats=4, warmups=warm)
    assert calls == ["warm-spec", "warm-plain", "spec", "plain", "plain", "spec", "spec", "plain", "plain", "spec"]
    assert comparison.values == {"spec": (2.0,) * 4, "plain": (1.0,) * 4}
    assert comparison.ratio("spec", "plain").median == 2.0


def test_a_slow_spell_on_one_pair_moves_the_median_ratio_little():
    """Pairs run back to back share a slow spell: per-pair ratios stay, a one-off timing would not."""
    spell = iter([1.0, 1.0, 0.3, 0.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # the second pair ran at 0.3x speed
    comparison = interleaved({"spec": lambda: 30.0 * next(spell), "plain": lambda: 10.0 * next(spell)}, repeats=5)
    ratio = comparison.ratio("spec", "plain")
    assert ratio.median == pytest.approx(3.0)
    assert comparison.spread("plain").low == pytest.approx(3.0)  # the slow spell is in the spread, not the ratio


def test_spread_median_range_and_description():
    spread = Spread.of([3.0, 1.0, 2.0])
    assert (spread.median, spread.low, spread.high) == (2.0, 1.0, 3.0)
    assert spread.relative_range == pytest.approx(1.0)
    assert "2.00x (range 1.00-3.00x, 3 runs)" == spread.describe("x")


def test_noise_check_flags_a_step_that_varies():
    delays = iter([0.0, 0.002, 0.02, 0.002, 0.02, 0.002])  # the first call is the untimed warm-up
    unsteady = noise_check(lambda: time.sleep(next(delays)), repeats=5)
    assert not unsteady.reliable and "UNRELIABLE" in unsteady.describe()
    steady = noise_check(lambda: time.sleep(0.01), repeats=5, max_cv=0.5)
    assert steady.reliable and steady.describe().startswith("ok")


@pytest.mark.parametrize("call", [lambda: interleaved({}, 3), lambda: interleaved({"a": lambda: 1.0}, 0),
                                  lambda: noise_check(lambda: None, repeats=2), lambda: Spread.of([])])
def test_bad_settings_are_refused(call):
    with pytest.raises(InputError):
        call()
