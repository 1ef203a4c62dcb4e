"""What every CLI module shares: the error exit, dim progress lines, and `--set KEY=VALUE` parsing."""

from __future__ import annotations

import typer
from rich.console import Console

from draftwise.errors import InputError

err = Console(stderr=True)


def fail(message: str) -> None:
    """Print the error and exit with status 2 (bad input)."""
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def dim(message: str) -> None:
    """A progress line on stderr."""
    err.print(message, style="dim", markup=False, highlight=False)


def split_settings(settings: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` options as a dict; a malformed one is refused by name."""
    values: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        values[key.strip()] = value.strip()
    return values


def split_training_settings(settings: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """A training command's `--set` options: (the recipe's keys, the corpus recipe's keys)."""
    from draftwise.options import config_keys
    from draftwise.training.corpus import CorpusRecipe

    values = split_settings(settings)
    corpus_keys = set(config_keys(CorpusRecipe))
    return ({k: v for k, v in values.items() if k not in corpus_keys},
            {k: v for k, v in values.items() if k in corpus_keys})
