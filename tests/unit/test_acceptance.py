"""Acceptance calibration math: h -> p, validation, counts -> profile, artifact round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from draftwise.artifacts import ArtifactError, read_manifest
from draftwise.optimize.acceptance import (
    AcceptanceProfile,
    as_depth_matrix,
    row_for_depth,
    selected_child_probs,
    validate_positional,
    wilson_interval,
)


def test_toy_h_to_p_exact():
    p = selected_child_probs([0.82, 0.48, 0.24])
    np.testing.assert_allclose(p, [0.82, 0.0864, 0.022464], rtol=0, atol=1e-15)


def test_h_to_p_keeps_no_child_remainder():
    p = selected_child_probs([0.5, 0.5])
    np.testing.assert_allclose(p, [0.5, 0.25])
    assert p.sum() == pytest.approx(0.75)  # 0.25 "no child selected" is not normalized away


def test_h_of_one_ends_the_slots():
    p = selected_child_probs([1.0, 0.9, 0.7])
    np.testing.assert_array_equal(p, [1.0, 0.0, 0.0])


@pytest.mark.parametrize("h", [[1.2], [-0.1, 0.3], [float("nan")]])
def test_bad_conditional_rates_refused(h):
    with pytest.raises(ValueError):
        selected_child_probs(h)


def test_validate_refuses_sum_over_one():
    with pytest.raises(ValueError, match="sums to"):
        validate_positional([0.82, 0.48, 0.24])  # h passed as p


def test_validate_accepts_sum_within_tolerance_and_matrix():
    validate_positional([0.5, 0.5 + 5e-13])
    out = validate_positional([[0.6, 0.3], [0.5, 0.1]])
    assert out.shape == (2, 2)
    with pytest.raises(ValueError):
        validate_positional([[0.6, 0.3], [0.9, 0.2]])  # second depth row sums to 1.1


@pytest.mark.parametrize("bad", [[], [[]], [0.5, -0.1], [1.5], [[[0.1]]]])
def test_validate_refuses_malformed(bad):
    with pytest.raises(ValueError):
        validate_positional(bad)


def test_row_for_depth_reuses_last_row():
    m = as_depth_matrix([[0.6, 0.2], [0.4, 0.1]])
    np.testing.assert_array_equal(row_for_depth(m, 1), [0.6, 0.2])
    np.testing.assert_array_equal(row_for_depth(m, 5), [0.4, 0.1])
    with pytest.raises(ValueError):
        row_for_depth(m, 0)


def test_wilson_interval_known_value():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4901625, abs=1e-6)
    assert hi == pytest.approx(0.9433178, abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo0, hi0 = wilson_interval(0, 50)
    assert lo0 == 0.0 and 0 < hi0 < 0.1


def test_from_counts_matches_h_to_p():
    profile = AcceptanceProfile.from_counts([820, 86, 22], 1000, provenance={"model": "toy"})
    h = profile.h[0]
    assert h[0] == pytest.approx(0.82)
    assert h[1] == pytest.approx(86 / 180)
    assert h[2] == pytest.approx(22 / 94)
    # p = counts / reached is exactly h_j prod (1 - h_i): the survival product telescopes.
    np.testing.assert_allclose(profile.matrix[0], selected_child_probs(h), atol=1e-15)
    np.testing.assert_allclose(profile.matrix[0], [0.82, 0.086, 0.022])
    for (lo, hi), value in zip(profile.p_interval[0], profile.p[0]):
        assert lo < value < hi
    assert profile.reached_counts == (1000,)


def test_from_counts_per_depth_and_zero_reach():
    profile = AcceptanceProfile.from_counts([[5, 3], [2, 0]], [10, 4])
    assert profile.matrix.shape == (2, 2)
    np.testing.assert_allclose(profile.matrix, [[0.5, 0.3], [0.5, 0.0]])
    empty = AcceptanceProfile.from_counts([4, 0], 4)  # nobody reached slot 1
    assert empty.h[0] == (1.0, 0.0) and empty.h_interval[0][1] == (0.0, 1.0)


@pytest.mark.parametrize(
    "selected, reached",
    [([6, 5], 10), ([-1, 0], 3), ([[1, 1], [1, 1]], 5), ([1, 1], [5, 5]), ([[1, 1], [1]], [5, 5])],
)
def test_from_counts_refuses_inconsistent(selected, reached):
    with pytest.raises(ValueError):
        AcceptanceProfile.from_counts(selected, reached)


def test_profile_refuses_invalid_p():
    with pytest.raises(ValueError):
        AcceptanceProfile(p=((0.8, 0.4),), h=((0.8, 0.4),))


def test_artifact_round_trip(tmp_path):
    profile = AcceptanceProfile.from_counts([820, 86, 22], 1000, provenance={"model": "toy", "width": 3})
    manifest = profile.save(tmp_path / "acc")
    assert manifest.kind == "acceptance"
    loaded = AcceptanceProfile.load(tmp_path / "acc")
    assert loaded == profile
    assert loaded.provenance == {"model": "toy", "width": 3}
    assert read_manifest(tmp_path / "acc").hash == manifest.hash


def test_artifact_without_counts_round_trip(tmp_path):
    profile = AcceptanceProfile.from_conditional([0.82, 0.48, 0.24], provenance={"source": "design toy"})
    profile.save(tmp_path / "acc")
    loaded = AcceptanceProfile.load(tmp_path / "acc")
    assert loaded == profile and loaded.selected_counts is None


def test_artifact_hash_depends_on_counts(tmp_path):
    a = AcceptanceProfile.from_counts([820, 86, 22], 1000).save(tmp_path / "a")
    b = AcceptanceProfile.from_counts([820, 86, 23], 1000).save(tmp_path / "b")
    assert a.hash != b.hash


def test_tampered_artifact_refused(tmp_path):
    AcceptanceProfile.from_counts([820, 86, 22], 1000).save(tmp_path / "acc")
    data = tmp_path / "acc" / "acceptance.json"
    body = json.loads(data.read_text())
    body["selected_counts"][0][0] = 900
    data.write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match="tampered"):
        AcceptanceProfile.load(tmp_path / "acc")


def test_wrong_kind_refused(tmp_path):
    from draftwise.artifacts import write_manifest

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "acceptance.json").write_text("{}")
    write_manifest(tmp_path / "x", "tree", {})
    with pytest.raises(ArtifactError, match="expected 'acceptance'"):
        AcceptanceProfile.load(tmp_path / "x")


def test_resealed_inconsistent_artifact_refused(tmp_path):
    """Someone edits p and re-writes the manifest: the counts no longer produce p."""
    from draftwise.artifacts import write_manifest

    directory = tmp_path / "acc"
    AcceptanceProfile.from_counts([820, 86, 22], 1000).save(directory)
    data = directory / "acceptance.json"
    body = json.loads(data.read_text())
    body["p"][0][0] = 0.9
    data.write_text(json.dumps(body))
    write_manifest(directory, "acceptance", {})
    with pytest.raises(ArtifactError, match="does not follow"):
        AcceptanceProfile.load(directory)
