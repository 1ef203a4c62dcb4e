"""Bad input never reaches a traceback: every row of `table.ROWS` on its surface.

CLI: exit code 2, one `error:` line holding what the row mentions, no traceback, and an output
path left as it was.  API: the row's DraftwiseError subclass with those words, and the loaded
model still decodes afterwards (a failed call leaves no state behind).  HTTP: the row's status
and an OpenAI-style error naming it, and the server still answers a good request."""

from __future__ import annotations

import pytest

from tests.regression.conftest import SHORT
from tests.regression.table import ROWS, SURFACES, Row


def _marks(row: Row) -> list:
    marks = []
    if row.backend is not None or row.surface == "cli" and "generate" in row.call:
        marks.append(pytest.mark.model)
    if row.backend == "llamacpp" or row.surface == "cli" and "llamacpp" in row.call:
        marks.append(pytest.mark.llamacpp)
    return marks


PARAMS = [pytest.param(row, id=f"{row.surface}:{row.id}", marks=_marks(row)) for row in ROWS]


def test_table_is_wide_enough():
    assert len(ROWS) >= 40
    assert {row.surface for row in ROWS} <= set(SURFACES)
    ids = [f"{row.surface}:{row.id}" for row in ROWS]
    assert len(ids) == len(set(ids)), "row ids repeat"


@pytest.mark.parametrize("row", PARAMS)
def test_bad_input(row: Row, context, request, tmp_path):
    if row.surface == "api":
        _api(row, context)
    elif row.surface == "cli":
        request.getfixturevalue("cli_on_shared")
        _cli(row, context, tmp_path)
    else:
        _http(row, context, request.getfixturevalue("served"))


def _api(row: Row, context) -> None:
    with pytest.raises(row.error) as caught:
        row.call(context)
    message = str(caught.value)
    for words in row.mentions:
        assert words in message, f"{words!r} not in {message!r}"
    if row.backend is not None:  # the same loaded model, right after the failure, still decodes
        result = context.decoder(row.backend).generate("The capital of France is")
        assert 1 <= len(result.tokens) <= SHORT


def _http(row: Row, context, served) -> None:
    path, body = row.call(context)
    response = served(path, body)
    assert response.status_code == row.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    for words in row.mentions:
        assert words in error["message"], f"{words!r} not in {error['message']!r}"
    good = served("completions", b'{"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 4}')
    assert good.status_code == 200 and 1 <= good.json()["usage"]["completion_tokens"] <= SHORT, good.text


def _cli(row: Row, context, tmp_path) -> None:
    from typer.testing import CliRunner

    from draftwise.cli import app

    out_absent, out_file = tmp_path / "out", tmp_path / "existing.txt"
    out_file.write_text("keep me\n")
    paths = {**context.paths, "out_absent": str(out_absent), "out_file": str(out_file)}
    args = [arg.format(**paths) if "{" in arg and not arg.startswith("[") else arg for arg in row.call]
    result = CliRunner().invoke(app, args)
    output = result.output + (result.stderr if result.stderr_bytes is not None and result.stderr not in result.output
                              else "")
    assert "Traceback" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one error line, got {output!r}"
    for words in row.mentions:
        assert words in errors[0], f"{words!r} not in {errors[0]!r}"
    if row.out == "absent":
        assert not out_absent.exists(), f"{out_absent} was created by a failed command"
    if row.out == "file":
        assert out_file.read_text() == "keep me\n", f"{out_file} was changed by a failed command"
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("existing.txt",))
    assert not leftovers, f"a failed command left {leftovers} behind"
