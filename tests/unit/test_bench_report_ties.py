"""The bench report states the invariance probe beside the mismatch counts, and flags a
divergence that is not at a near-tie (ties.json, written by benchmarks/llamacpp_exactness/llamacpp_ties.py)."""

from draftwise.bench.report import _kernel_rounding

PROBE = "exact up to kernel rounding: verify rows differ from plain decoding's by at most 1.2 logits"


def ties(parted: int, near: int) -> dict:
    return {"lookup": {"reference": "plain", "probe": PROBE, "divergent_questions": parted, "near_ties": near,
                       "divergences": []}}


def test_every_divergence_at_a_near_tie_is_stated_with_the_probe():
    lines = _kernel_rounding(ties(3, 3))
    assert any("lookup vs plain: 3 question(s) part, 3 of them at near-ties; " + PROBE in line for line in lines)
    assert not any("not explained" in line for line in lines)


def test_a_divergence_outside_the_bound_is_flagged():
    assert any("the rest are not explained by kernel rounding" in line for line in _kernel_rounding(ties(3, 2)))


def test_no_ties_file_adds_nothing_and_no_divergence_says_so():
    assert _kernel_rounding({}) == []
    assert any("no question parts" in line for line in _kernel_rounding(ties(0, 0)))
