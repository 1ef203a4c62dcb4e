"""The row-padding plan: which count a forward of M rows (or a batch's B x R) runs as, from
measured seconds, and its cached artifact (reused only for its own key)."""

from __future__ import annotations

import pytest

from draftwise.backends.row_padding import RowPadding
from draftwise.measure.row_padding import cached_row_padding
from draftwise.artifacts import staged_artifact, write_manifest
from draftwise.errors import InputError

# the AMD EPYC's LM-head shape: 2, 3, 6, 7 and 11 rows slow
MEASURED = RowPadding((10.1, 23.7, 34.0, 16.5, 16.9, 21.7, 22.0, 16.2, 17.5, 18.0, 33.1, 18.4))


def test_a_slow_count_runs_as_the_narrowest_of_the_fastest_larger_ones():
    # 2 rows -> 4, not 8: 8 rows' 16.2 is within the margin of 4 rows' 16.5
    assert [MEASURED.rows_for(m) for m in range(1, 13)] == [1, 4, 4, 4, 5, 8, 8, 8, 9, 10, 12, 12]


def test_padding_must_be_worth_the_margin():
    close = RowPadding((1.0, 1.0, 0.97), margin=0.05)  # 3 rows 3% faster than 2: within the margin
    assert close.rows_for(2) == 2
    assert RowPadding((1.0, 1.0, 0.94), margin=0.05).rows_for(2) == 3
    assert RowPadding((1.0, 1.0, 0.97), margin=0.0).rows_for(2) == 3


def test_nothing_past_the_measured_counts_is_padded():
    assert MEASURED.rows_for(13) == 13 and MEASURED.rows_for(40) == 40
    assert MEASURED.width_for(4, 4) == 4  # 16 rows: not measured


def test_a_batch_width_is_padded_by_its_total_rows():
    assert MEASURED.width_for(2, 1) == 2  # 2 rows -> 4
    assert MEASURED.width_for(3, 1) == 3  # 3 rows -> 9 (17.5 against 34.0; 12 rows no faster)
    assert MEASURED.width_for(2, 2) == 2  # 4 rows: already the fastest
    assert MEASURED.width_for(1, 11) == 12


def test_describe_and_refusals():
    assert MEASURED.describe().startswith("rows padded 2->4, 3->4, 6->8, 7->8, 11->12")
    assert "no row count" in RowPadding((1.0, 2.0, 3.0)).describe()
    with pytest.raises(InputError, match="positive time"):
        RowPadding(())
    with pytest.raises(InputError, match="positive time"):
        RowPadding((1.0, 0.0))
    with pytest.raises(InputError, match="margin"):
        RowPadding((1.0,), margin=1.0)


def test_the_cached_plan_is_reused_only_for_its_key(tmp_path):
    key = {"checkpoint": "c", "threads": 2}
    directory = tmp_path / "plan"
    with staged_artifact(directory, "row_padding") as staging:
        write_manifest(staging, "row_padding", {"key": key, **MEASURED.as_dict(), "noise_cv": 0.01})
    assert cached_row_padding(directory, key) == MEASURED
    assert cached_row_padding(directory, {**key, "threads": 4}) is None  # another machine's or thread count's
    assert cached_row_padding(tmp_path / "absent", key) is None
    manifest = directory / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"seconds"', '"second"'))  # tampered
    assert cached_row_padding(directory, key) is None
