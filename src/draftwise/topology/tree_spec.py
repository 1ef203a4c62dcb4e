"""What a `tree` option names, typed: a template, a `tree optimize` artifact, or `auto`.

Parsed once from the user's text (`parse_tree`); everything after reads the type.  Only a
`TreeTemplate` is drawn from: `draftwise.plan` turns an artifact into its template (after
checking the sampling policy it was optimized for) and `auto` into the artifact it chooses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import InputError
from draftwise.paths import is_dir
from draftwise.topology.templates import Template, max_depth, parse_template


@dataclass(frozen=True)
class TreeTemplate:
    paths: Template

    @property
    def depth(self) -> int:
        return max_depth(self.paths)

    def __str__(self) -> str:
        return json.dumps([list(p) for p in self.paths], separators=(",", ":"))


@dataclass(frozen=True)
class TreeArtifact:
    directory: Path  # written by `draftwise tree optimize`

    def __str__(self) -> str:
        return str(self.directory)


@dataclass(frozen=True)
class AutoTree:
    """Chosen on first use from measured artifacts (`optimize.auto`)."""

    def __str__(self) -> str:
        return "auto"


TreeSpec = TreeTemplate | TreeArtifact | AutoTree


def parse_tree(text: str) -> TreeSpec:
    """'auto'; a template ('chain:4', 'wbd:2,2,1', 'cartesian:3,2,2', JSON paths); or a directory."""
    stripped = text.strip()
    if stripped == "auto":
        return AutoTree()
    if stripped.startswith("["):  # a JSON list of paths is a template, never a directory
        return TreeTemplate(parse_template(stripped))
    if is_dir(stripped):
        return TreeArtifact(Path(stripped))
    if "/" in stripped or stripped.startswith("."):
        raise InputError(f"tree {text!r}: no such tree directory (from `draftwise tree optimize`)")
    return TreeTemplate(parse_template(stripped))


def show_tree(tree: TreeSpec | None) -> str:
    return "none" if tree is None else str(tree)


def resolved_template(tree: TreeSpec | None) -> Template | None:
    """A config's template (None: no tree); an artifact or `auto` must have been resolved first."""
    if tree is None or isinstance(tree, TreeTemplate):
        return None if tree is None else tree.paths
    raise InputError(f"tree {tree} is not resolved to a template yet (draftwise.open_decoder resolves it)")
