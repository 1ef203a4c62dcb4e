"""`draftwise heads ...`: train draft heads for a target, describe a head set, and move Medusa
heads between draftwise and the layouts other projects load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.options import parse_config
from draftwise.cli.common import dim, err, fail as _fail, split_training_settings

def _keys(config: type) -> str:
    from draftwise.options import config_keys

    return ", ".join(k for k in config_keys(config) if k != "family")  # --family sets the family


def _recipe_keys() -> tuple[str, str]:
    from draftwise.training.corpus import CorpusRecipe
    from draftwise.training.train import TrainRecipe

    return _keys(TrainRecipe), _keys(CorpusRecipe)


RECIPE_KEYS, CORPUS_KEYS = _recipe_keys()
heads_app = typer.Typer(help="Draft heads (Medusa, Hydra, Hydra++, Clover): train, info, import, export.",
                        no_args_is_help=True)




@heads_app.command()
def train(
    family: str = typer.Option(..., "--family", help="medusa | hydra | hydra++ | clover"),
    out: Optional[Path] = typer.Option(None, "--out", help="head-set artifact directory to write (default: the cache, "
                                                          "where the family finds it for this target)"),
    target: str = typer.Option("smollm2-135m", "--target", help="target model (the transformers backend loads it)"),
    preset: Optional[str] = typer.Option(None, "--preset", help="a published recipe scaled to a CPU: medusa-1 | hydra | "
                                                                   "hydra++ | clover"),
    settings: List[str] = typer.Option([], "--set", help=f"KEY=VALUE (repeatable) of the recipe ({RECIPE_KEYS}) or the corpus ({CORPUS_KEYS})"),
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
        own, corpus_values = split_training_settings(settings)
        recipe_values = {"family": family}
        if preset is not None:
            if preset not in PRESETS:
                raise InputError(f"unknown preset {preset!r}; choose {', '.join(PRESETS)}")
            recipe_values.update({k if k != "num_heads" else "heads": str(v) for k, v in PRESETS[preset].items()})
            recipe_values["family"] = family
        recipe_values.update(own)
        recipe = parse_config(TrainRecipe, recipe_values, "heads train")
        corpus = parse_config(CorpusRecipe, corpus_values, "heads train corpus")
        if threads:
            import torch

            torch.set_num_threads(threads)
        if out is None:
            from draftwise.heads.defaults import trained_path
            from draftwise.models import resolve

            out = trained_path(recipe.family, resolve(target).checkpoint_id)
        with progress_to(dim):
            provenance = run_training(TrainingRun(target, out, corpus, recipe, work, batch))
        err.print(f"heads written to {out}")
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
    imported = heads.provenance.get("imported")
    print(json.dumps({"arch": heads.arch.as_dict(), "target": heads.target.__dict__,
                      "manifest_hash": heads.manifest_hash,
                      "recipe": heads.provenance.get("recipe"),
                      "validation": heads.provenance.get("metrics", {}).get("validation"),
                      **({"imported": {k: v for k, v in imported.items() if k != "config"}} if imported else {})},
                     indent=2))


@heads_app.command("import")
def import_heads(
    source: Path = typer.Argument(..., help="a Medusa checkpoint directory: FasterDecoding/TGI (config.json, "
                                            "medusa_lm_head.safetensors) or vLLM (config.json, *.safetensors)"),
    out: Optional[Path] = typer.Option(None, "--out", help="head-set artifact directory to write (default: the cache, "
                                                          "where the family finds it for this target)"),
    target: str = typer.Option(..., "--target", help="the model the heads were trained on (the transformers backend "
                                                     "loads it): its checkpoint and tokenizer are bound, its LM head "
                                                     "checked against the heads'"),
    heads: Optional[int] = typer.Option(None, "--heads", help="import the first N heads only (for a config whose "
                                                             "head count is wrong)"),
) -> None:
    """Import Medusa heads from FasterDecoding/Medusa, text-generation-inference or vLLM (safetensors
    only: a .pt/.bin pickle is refused, never loaded)."""
    from draftwise.measure.load import load_backend
    from draftwise.heads.interchange import import_medusa

    try:
        backend = load_backend(target, "transformers")
        manifest = import_medusa(source, backend.info.checkpoint, backend.info.tokenizer_hash, out,
                                 token_weights=backend.token_weights(), num_heads=heads)  # type: ignore[attr-defined]
    except DraftwiseError as exc:
        _fail(str(exc))
    imported = manifest.provenance["imported"]
    print(json.dumps({"out": str(out), "arch": manifest.provenance["arch"], "target": manifest.provenance["target"],
                      "layout": imported["layout"], "lm_head": imported["lm_head"],
                      "source_heads": imported["source_heads"],
                      "source_base_model": imported["config"].get("base_model_name_or_path"),
                      "manifest_hash": manifest.hash}, indent=2))


@heads_app.command("export")
def export_heads(
    directory: Path = typer.Argument(..., help="a draftwise Medusa head set"),
    out: Path = typer.Option(..., "--out", help="directory to write vLLM's layout into (config.json, "
                                                "model.safetensors, medusa_choices.json, manifest.json)"),
    target: Optional[str] = typer.Option(None, "--target", help="the head set's target (the transformers backend "
                                                                "loads it); needed when the heads end in its LM head"),
    tree: Optional[str] = typer.Option(None, "--tree", help="index paths for Medusa-style runtimes (JSON, chain:3, "
                                                            "wbd:2,2,1, cartesian:3,2, or a `tree optimize` "
                                                            "directory); default: a chain through every head"),
) -> None:
    """Export a Medusa head set in vLLM's layout.  vLLM drafts a top-1 chain through the heads;
    the tree (medusa_choices.json) is for runtimes that take Medusa choices."""
    from draftwise.measure.load import load_backend
    from draftwise.heads.interchange import export_vllm
    from draftwise.optimize.select import load_tree_artifact
    from draftwise.topology.tree_spec import TreeArtifact, TreeTemplate, parse_tree

    try:
        paths = None
        if tree is not None:
            spec = parse_tree(tree)
            if isinstance(spec, TreeTemplate):
                paths = spec.paths
            elif isinstance(spec, TreeArtifact):
                paths = load_tree_artifact(spec.directory).choice.paths
            else:
                raise InputError("--tree auto is chosen for a decoding run; give index paths or a `tree optimize` "
                                 "directory")
        backend = load_backend(target, "transformers") if target is not None else None
        manifest = export_vllm(directory, out, paths, target=backend)
    except DraftwiseError as exc:
        _fail(str(exc))
    print(json.dumps({"out": str(out), "layout": "vllm", "tree": manifest.provenance["tree"],
                      "manifest_hash": manifest.hash}, indent=2))
