"""The README's Python example runs as written (on the embedded model, transformers backend)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.model
def test_the_readme_python_example_runs(capsys):
    (example,) = python_blocks()
    exec(compile(example, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "tok/s" in out and "exact True" in out and "verifier greedy" in out
