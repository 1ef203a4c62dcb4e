"""Relative links in the front door, the docs and the study READMEs point at files that exist.

Runs and their files leave the tree when superseded (git keeps them); a link into one would
dangle silently.  Web links and links inside fenced code are not checked; an anchor is dropped
before the path is resolved (a link to a heading checks the file only).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: ...


def documents(root: Path) -> list[Path]:
    """README.md, docs/*.md and every README.md under benchmarks/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            *sorted((root / "benchmarks").rglob("README.md"))]


def dangling_links(document: Path, root: Path) -> list[str]:
    """The relative link targets of `document` (outside fenced code) that name no file or folder."""
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    missing = []
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if not path or EXTERNAL.match(path):
            continue
        resolved = (root / path.lstrip("/")) if path.startswith("/") else (document.parent / path)
        if not resolved.exists():
            missing.append(target)
    return missing


def test_every_relative_link_in_the_docs_resolves():
    assert (ROOT / "README.md").is_file() and (ROOT / "benchmarks" / "README.md").is_file()
    broken = {str(doc.relative_to(ROOT)): links for doc in documents(ROOT) if (links := dangling_links(doc, ROOT))}
    assert broken == {}


def test_a_link_to_a_missing_file_is_caught_and_code_web_and_anchor_links_are_not(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n")
    readme = tmp_path / "README.md"
    readme.write_text("[ok](docs/here.md#here) [top](#top) [web](https://example.com/x.md)\n"
                      "![plot](runs/gone/plot.png) [gone](docs/gone.md \"title\")\n"
                      "```\n[in code](docs/not-checked.md)\n```\n")
    assert dangling_links(readme, tmp_path) == ["runs/gone/plot.png", "docs/gone.md"]
