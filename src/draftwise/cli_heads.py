"""`draftwise heads ...`: train draft heads for a target, describe a head set, and move Medusa
heads between draftwise and the layouts other projects load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.options import config_keys, parse_config

heads_app = typer.Typer(help="Draft heads (Medusa, Hydra): train, info, import, export.", no_args_is_help=True)
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def _split(settings: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        values[key.strip()] = value.strip()
    return values


@heads_app.command()
def train(
    family: str = typer.Option(..., "--family", help="medusa | hydra"),
    out: Path = typer.Option(..., "--out", help="head-set artifact directory to write"),
    target: str = typer.Option("smollm2-135m", "--target", help="target model (the transformers backend loads it)"),
    preset: Optional[str] = typer.Option(None, "--preset", help="a published recipe scaled to a CPU: medusa-1 | hydra"),
    settings: List[str] = typer.Option([], "--set", help="KEY=VALUE of the recipe or the corpus (see --help-keys)"),
    work: Optional[Path] = typer.Option(None, "--work", help="working directory (corpus, hidden states, checkpoints); "
                                                             "default: a folder in the cache keyed by target and corpus"),
    batch: int = typer.Option(32, "--distill-batch", help="prompts answered together in self-distillation"),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: torch's)"),
) -> None:
    """Train heads on ShareGPT (self-distilled by default) with the target frozen; resumable."""
    from draftwise.training.corpus import CorpusRecipe
    from draftwise.training.pipeline import TrainingRun, run_training
    from draftwise.training.train import PRESETS, TrainRecipe

    try:
        values = _split(settings)
        corpus_keys = set(config_keys(CorpusRecipe))
        recipe_values = {"family": family}
        if preset is not None:
            if preset not in PRESETS:
                raise InputError(f"unknown preset {preset!r}; choose {', '.join(PRESETS)}")
            recipe_values.update({k if k != "num_heads" else "heads": str(v) for k, v in PRESETS[preset].items()})
            recipe_values["family"] = family
        recipe_values.update({k: v for k, v in values.items() if k not in corpus_keys})
        recipe = parse_config(TrainRecipe, recipe_values, "heads train")
        corpus = parse_config(CorpusRecipe, {k: v for k, v in values.items() if k in corpus_keys}, "heads train corpus")
        if threads:
            import torch

            torch.set_num_threads(threads)
        with progress_to(lambda line: err.print(line, style="dim", markup=False, highlight=False)):
            provenance = run_training(TrainingRun(target, out, corpus, recipe, work, batch))
    except DraftwiseError as exc:
        _fail(str(exc))
    print(json.dumps(provenance["metrics"], indent=2))


@heads_app.command()
def info(directory: Path = typer.Argument(..., help="a head-set artifact")) -> None:
    """The architecture, target, recipe and validation accuracy of a head set (checksums verified)."""
    from draftwise.heads.artifact import load_heads

    try:
        heads = load_heads(directory)
    except DraftwiseError as exc:
        _fail(str(exc))
    print(json.dumps({"arch": heads.arch.as_dict(), "target": heads.target.__dict__,
                      "manifest_hash": heads.manifest_hash,
                      "recipe": heads.provenance.get("recipe"),
                      "validation": heads.provenance.get("metrics", {}).get("validation")}, indent=2))
