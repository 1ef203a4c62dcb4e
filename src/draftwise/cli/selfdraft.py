"""`draftwise skip ...` (Draft & Verify's skip-set search) and `draftwise adapter ...`
(Kangaroo's adapter): the self-speculative drafters' artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.options import config_keys, parse_config
from draftwise.cli.common import dim as _dim, err, fail as _fail, split_settings as _split, split_training_settings

skip_app = typer.Typer(help="Draft & Verify skip sets: search, info.", no_args_is_help=True)


@skip_app.command()
def search(
    out: Path = typer.Option(..., "--out", help="skip-set artifact directory to write"),
    target: str = typer.Option("smollm2-135m", "--target", help="target model (the transformers backend loads it)"),
    settings: List[str] = typer.Option([], "--set", help="KEY=VALUE of the search (trials, prompts, max_new_tokens, "
                                                         "seed, startup) or of the layer-skip drafter (gamma, k, ...)"),
    work: Optional[Path] = typer.Option(None, "--work", help="working directory (the optuna study: a rerun resumes "
                                                             "it); default: OUT.work beside the artifact"),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (part of the objective's provenance)"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16"),
) -> None:
    """Search the skip set minimizing measured seconds per committed token (optuna TPE); resumable."""
    from draftwise.measure.load import load_backend
    from draftwise.optimize.skip_search import SearchRecipe, development_prompts, search_skip, write_search
    from draftwise.workloads import parse_workload
    from draftwise.proposers.layer_skip import LayerSkipConfig

    try:
        values = _split(settings)
        recipe_keys = set(config_keys(SearchRecipe))
        recipe = parse_config(SearchRecipe, {k: v for k, v in values.items() if k in recipe_keys}, "skip search")
        drafter = parse_config(LayerSkipConfig, {k: v for k, v in values.items() if k not in recipe_keys},
                               "skip search drafter")
        with progress_to(_dim):
            backend = load_backend(target, "transformers", threads, dtype=dtype)  # type: ignore[arg-type]
            prompts = development_prompts(backend, recipe)  # type: ignore[arg-type]
            result = search_skip(backend, recipe, drafter, work or out.with_name(out.name + ".work"),  # type: ignore[arg-type]
                                 prompts)
            questions = [q.question_id for q in parse_workload(recipe.prompts).questions]
            manifest = write_search(out, backend, recipe, drafter, prompts, result, questions)  # type: ignore[arg-type]
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    _plot_search(out)
    err.print(f"skip set written to {out}")
    print(json.dumps({"out": str(out), "bits": result.skip.bits(), "skipped": result.skip.skipped, "f": result.f,
                      "baselines": result.baselines, "trials": len(result.history), "manifest_hash": manifest.hash},
                     indent=2))


def _plot_search(directory: Path) -> Path:
    """`search.png` beside the artifact's files: a picture derived from its checksummed history."""
    from draftwise.bench.plots import plot_search_history
    from draftwise.selfdraft.skipset import load_skip

    artifact = load_skip(directory)
    history = json.loads((directory / "history.json").read_text())
    target = artifact.provenance.get("target", {}).get("checkpoint", "?")
    title = f"Skip-set search: {target}, {artifact.provenance.get('threads', '?')} threads"
    return plot_search_history(history, artifact.provenance.get("baselines", {}), directory / "search.png", title)


@skip_app.command()
def plot(directory: Path = typer.Argument(..., help="a skip-set artifact")) -> None:
    """Draw the search's f over trials (search.png in the artifact's directory; checksums verified)."""
    try:
        path = _plot_search(directory)
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    print(path)


@skip_app.command()
def info(directory: Path = typer.Argument(..., help="a skip-set artifact")) -> None:
    """The skip vector, its target, f and the objective's provenance (checksums verified)."""
    from draftwise.selfdraft.skipset import load_skip

    try:
        artifact = load_skip(directory)
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    shown = {k: v for k, v in artifact.provenance.items() if k != "drafter"}
    print(json.dumps({"bits": artifact.skip.bits(), "skipped": artifact.skip.skipped, "layers": artifact.skip.layers,
                      "manifest_hash": artifact.manifest_hash, **shown}, indent=2, default=str))


adapter_app = typer.Typer(help="Kangaroo adapters: train, info.", no_args_is_help=True)


@adapter_app.command("train")
def adapter_train(
    out: Optional[Path] = typer.Option(None, "--out", help="adapter artifact directory (default: the cache, where "
                                                          "--proposer kangaroo finds it for this target)"),
    target: str = typer.Option("smollm2-135m", "--target", help="target model (the transformers backend loads it)"),
    settings: List[str] = typer.Option([], "--set", help="KEY=VALUE of the recipe (exit_layer, epochs, lr, tau, ...) "
                                                         "or of the corpus (mode, prompts, ...)"),
    work: Optional[Path] = typer.Option(None, "--work", help="working directory (corpus, hidden states, checkpoints; "
                                                             "shared with `heads train` by default)"),
    batch: int = typer.Option(32, "--distill-batch", help="prompts answered together in self-distillation"),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: torch's)"),
) -> None:
    """Train a Kangaroo adapter by distillation from the frozen target (KD loss); resumable."""
    from draftwise.training.adapter import AdapterRecipe, AdapterRun, run_adapter_training
    from draftwise.training.corpus import CorpusRecipe

    try:
        own, corpus_values = split_training_settings(settings)
        recipe = parse_config(AdapterRecipe, own, "adapter train")
        corpus = parse_config(CorpusRecipe, corpus_values, "adapter train corpus")
        if threads:
            import torch

            torch.set_num_threads(threads)
        if out is None:
            from draftwise.models import resolve
            from draftwise.selfdraft.adapter import trained_path

            out = trained_path(resolve(target).checkpoint_id)
        with progress_to(_dim):
            provenance = run_adapter_training(AdapterRun(target, out, corpus, recipe, work, batch))
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    err.print(f"adapter written to {out}")
    print(json.dumps(provenance["metrics"], indent=2))


@adapter_app.command("info")
def adapter_info(directory: Path = typer.Argument(..., help="a Kangaroo adapter artifact")) -> None:
    """The architecture, target, recipe and validation metrics of an adapter (checksums verified)."""
    from draftwise.selfdraft.adapter import load_adapter

    try:
        adapter = load_adapter(directory)
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    print(json.dumps({"arch": adapter.arch.as_dict(), "target": adapter.target.__dict__,
                      "manifest_hash": adapter.manifest_hash, "recipe": adapter.provenance.get("recipe"),
                      "metrics": {k: v for k, v in adapter.provenance.get("metrics", {}).items() if k != "history"}},
                     indent=2))


@adapter_app.command("tune")
def adapter_tune(
    adapters: List[Path] = typer.Option(..., "--adapter", help="an adapter per exit layer to compare (repeatable)"),
    target: str = typer.Option("smollm2-135m", "--target", help="target model (the transformers backend loads it)"),
    etas: Optional[str] = typer.Option(None, "--etas", help="early-exit thresholds to measure, comma-separated "
                                                             "(default: the grid that eta=auto measures)"),
    prompts: str = typer.Option("spec-bench:all:6", "--prompts", help="development workload (disjoint from the "
                                                                       "evaluation's)"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens"),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads"),
) -> None:
    """Choose the exit layer (adapter) and eta by measured seconds per committed token."""
    from draftwise.measure.load import load_backend
    from draftwise.optimize.kangaroo_tune import ETA_GRID, tune_kangaroo
    from draftwise.workloads import first_turn_prompts

    try:
        try:
            grid = list(ETA_GRID) if etas is None else [float(e) for e in etas.split(",") if e.strip()]
        except ValueError as exc:
            raise InputError(f"--etas {etas!r}: expected comma-separated numbers") from exc
        with progress_to(_dim):
            backend = load_backend(target, "transformers", threads)
            ids = first_turn_prompts(backend.chat_prompt, prompts)
            choice = tune_kangaroo(backend, adapters, grid, ids, max_new_tokens)  # type: ignore[arg-type]
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    print(json.dumps({"adapter": str(choice.adapter), "eta": choice.eta, "f": choice.f, "plain_f": choice.plain,
                      "speedup": choice.plain / choice.f, "threads": backend.n_threads, "prompts": prompts,
                      "table": list(choice.table)}, indent=2))
