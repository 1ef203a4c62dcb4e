"""`draftwise generate` and `draftwise proposers`: one generation with its statistics, and the
drafter families' keys."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from draftwise.api import open_decoder
from draftwise.cli.common import DEFAULTS, DTYPE_HELP, dim, err, fail, quiet_llama_cpp, split_settings
from draftwise.engine import GenerationConfig, GenerationResult
from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.options import config_help
from draftwise.proposers.registry import DRAFTERS
from draftwise.sampling import SamplingPolicy
from draftwise.spec import CALIBRATION_WORKLOAD, DecoderSpec
from draftwise.parse import spec_from_options
from draftwise.text import check_utf8
from draftwise.text_stream import TextStream
from draftwise.verify.registry import VERIFIERS



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
        check_utf8(prompt)  # before a model is loaded: the same refusal the backends give (draftwise.text)
        if not prompt:
            raise InputError("the prompt is empty: give the text to continue (or, with --chat, the message to answer)")
        policy = SamplingPolicy(temperature=temperature, top_k=top_k, top_p=top_p)
        base = DecoderSpec(target=target, backend=backend, draft=draft, verifier=verifier, threads=threads, dtype=dtype,
                           generation=GenerationConfig(max_new_tokens=max_new_tokens, policy=policy, seed=seed,
                                                       stop_strings=tuple(stop), exact=not allow_heuristic))
        options = {k: str(v) for k, v in named.items() if v is not None}
        for key, value in split_settings(settings).items():
            if key in options and key != "proposer":
                raise InputError(f"{key} is given twice (an option and --set {key}=...)")
            options[key] = value
        spec = spec_from_options(options, base)
        quiet_llama_cpp()
        with progress_to(None if as_json else dim):
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
        fail(str(exc))
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
