"""`draftwise generate` and `draftwise proposers`: one generation with its statistics, and the
drafter families' keys."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from draftwise.api import Decoder, open_decoder
from draftwise.cli.common import DecoderOptions, decoder_command, dim, err, fail, quiet_llama_cpp
from draftwise.runtime.round import GenerationConfig, GenerationResult
from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.options import config_help
from draftwise.proposers.registry import DRAFTERS
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.text import check_utf8
from draftwise.runtime.text_stream import TextStream
from draftwise.timing import DEFAULT_REPEATS, Comparison, interleaved, noise_check
from draftwise.workloads import read_prompt_file


@decoder_command
def generate(
    prompt: Optional[str] = typer.Argument(None, help="Prompt text (use --chat to wrap it in the model's chat template); "
                                           "or --prompts FILE."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts", help="Many requests decoded in shared rounds: a .jsonl "
                                                "file of {\"prompt\": ...} objects, or a text file of one prompt per line."),
    batch: int = typer.Option(8, "--batch", help="With --prompts: requests in flight at once (the rest join as others "
                              "finish); --gate auto then measures what rows cost at each batch size (= --set batch=N)."),
    chat: bool = typer.Option(False, "--chat", help="Apply the model's chat template."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0, help="0 disables top-k."),
    seed: int = typer.Option(0),
    max_new_tokens: int = typer.Option(GenerationConfig().max_new_tokens),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    compare_ar: bool = typer.Option(False, "--compare-ar", help="Also run plain decoding and compare: exactness, then "
                                    "speed by warmed-up, interleaved repeats (--repeats) with a noise check."),
    repeats: int = typer.Option(DEFAULT_REPEATS, "--repeats", help="With --compare-ar: timed speculative/plain pairs, "
                                "alternating; the speedup is their median ratio, with its range."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text and stats."),
    *,
    options: DecoderOptions,  # --target, --proposer, ...: added by `decoder_command`
) -> None:
    """Generate text with speculative decoding and print the statistics."""
    try:
        if compare_ar and repeats < 1:  # refused before a model is loaded
            raise InputError(f"--repeats {repeats}: at least one timed pair")
        many = _requests(prompt, prompts_file, batch)
        if many is None:
            assert prompt is not None
            check_utf8(prompt)  # before a model is loaded: the same refusal the backends give (draftwise.runtime.text)
            if not prompt:
                raise InputError("the prompt is empty: give the text to continue (or, with --chat, the message to answer)")
        policy = SamplingPolicy(temperature=temperature, top_k=top_k, top_p=top_p)
        generation = GenerationConfig(max_new_tokens=max_new_tokens, policy=policy, seed=seed, stop_strings=tuple(stop))
        # with --prompts, gate=auto is planned for the batch
        spec = options.spec(generation, batch if prompts_file is not None else None)
        quiet_llama_cpp()
        with progress_to(None if as_json else dim):
            decoder = open_decoder(spec, calibration=options.calibration_workload)
        if many is not None:
            _generate_many(decoder, many, chat, batch, compare_ar, as_json)
            return
        assert prompt is not None
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
        # the runs above were cold (the first forward, the gate's first rounds): time warmed-up pairs
        timing = _timed_pairs(decoder, prompt_ids, repeats, as_json) if compare_ar else None
    except DraftwiseError as exc:
        fail(str(exc))
        return
    report = _report(result, plain, policy, decoder.verifier)
    report.update(exactness)
    if timing is not None:
        report.update(_timing_report(timing))
    if decoder.choices:
        report["auto_choices"] = {c.what: c.chosen for c in decoder.choices}
    if as_json:
        print(json.dumps(report))
    else:
        sys.stdout.write("\n")
        _print_stats(report)


def _requests(prompt: str | None, path: Path | None, batch: int) -> list[str] | None:
    """The prompts of --prompts FILE (None: one prompt, given as the argument)."""
    if path is None:
        if prompt is None:
            raise InputError("give a prompt, or --prompts FILE")
        return None
    if prompt is not None:
        raise InputError("give a prompt or --prompts FILE, not both")
    if batch < 1:
        raise InputError(f"--batch {batch}: at least 1 request in flight")
    try:
        prompts = read_prompt_file(path)
    except InputError as exc:
        raise InputError(f"--prompts: {exc}") from None
    return prompts


def _generate_many(decoder: Decoder, prompts: list[str], chat: bool, batch: int, compare_ar: bool,
                   as_json: bool) -> None:
    """Every prompt decoded in shared rounds, a line (or JSON object) per request, then the batch's figures."""
    start = time.perf_counter()
    results = decoder.generate_many(prompts, chat=chat, max_batch=batch)
    wall = time.perf_counter() - start
    plain: list[GenerationResult | BaseException] | None = None
    plain_wall = 0.0
    if compare_ar:
        start = time.perf_counter()
        plain = decoder.plain().generate_many(prompts, chat=chat, max_batch=batch)
        plain_wall = time.perf_counter() - start
    rows = []
    for i, result in enumerate(results):
        if isinstance(result, BaseException):
            rows.append({"request": i, "error": str(result)})
            continue
        row = {"request": i, "text": result.text, "new_tokens": result.stats.new_tokens,
               "stop_reason": result.stop_reason, "rounds": result.stats.rounds,
               "mean_accepted": round(result.stats.mean_accepted, 4), "tokens_per_s": round(result.stats.tokens_per_s, 3)}
        if plain is not None and isinstance(plain[i], GenerationResult):
            row["identical_to_ar"] = result.tokens == plain[i].tokens if decoder.spec.generation.policy.greedy else None
        rows.append(row)
    summary = _batch_summary(results, wall, batch, plain, plain_wall, decoder.spec.generation.policy.greedy)
    if as_json:
        print(json.dumps({"requests": rows, "summary": summary}))
        return
    for row in rows:
        head = f"[request {row['request']}]"
        print(f"{head} error: {row['error']}" if "error" in row else f"{head} {row['text']}")
    table = Table(title="draftwise (batch)", show_header=False)
    for key, value in summary.items():
        table.add_row(key, str(value))
    err.print(table)


def _batch_summary(results: list[GenerationResult | BaseException], wall: float, batch: int,
                   plain: list[GenerationResult | BaseException] | None, plain_wall: float, greedy: bool) -> dict:
    done = [r for r in results if isinstance(r, GenerationResult)]
    tokens = sum(r.stats.new_tokens for r in done)
    summary: dict = {"requests": len(results), "failed": len(results) - len(done), "batch": batch,
                     "new_tokens": tokens, "wall_s": round(wall, 3),
                     "tokens_per_s": round(tokens / wall, 3) if wall else None}
    if done:
        per_request = sorted(r.stats.tokens_per_s for r in done)
        summary["request_tokens_per_s_median"] = round(per_request[len(per_request) // 2], 3)
        summary["mean_accepted"] = round(sum(r.stats.mean_accepted for r in done) / len(done), 4)
    if plain is not None:
        plain_tokens = sum(r.stats.new_tokens for r in plain if isinstance(r, GenerationResult))
        summary["ar_tokens_per_s"] = round(plain_tokens / plain_wall, 3) if plain_wall else None
        if summary["tokens_per_s"] and summary["ar_tokens_per_s"]:
            summary["speedup"] = round(summary["tokens_per_s"] / summary["ar_tokens_per_s"], 3)
        pairs = [(r, p) for r, p in zip(results, plain) if isinstance(r, GenerationResult) and isinstance(p, GenerationResult)]
        if greedy:
            summary["identical_to_ar"] = f"{sum(r.tokens == p.tokens for r, p in pairs)}/{len(pairs)}"
    return summary


def _exactness(target, prompt_ids: list[int], result: GenerationResult, plain: GenerationResult,
               policy: SamplingPolicy) -> dict:
    """On llama.cpp, what `identical_to_ar` can be expected to be (the target's invariance probe,
    measured once per model, kernels, threads and machine) and, for a greedy output that parts
    from plain decoding, whether it parts at a near-tie within the probe's bound."""
    if target.info.name != "llamacpp":
        return {}
    from draftwise.measure.invariance import cached_probe, find_divergence

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


def _timed_pairs(decoder: Decoder, prompt_ids: list[int], repeats: int, quiet: bool) -> Comparison:
    """Speculative and plain decoding of the prompt, `repeats` pairs back to back (order rotated),
    after a noise check: a short plain generation repeated (its spread is the machine's)."""
    plain = decoder.plain()
    if not quiet:
        dim(f"timing {repeats} interleaved speculative/plain pairs")
    return interleaved({"speculative": lambda: decoder.generate(prompt_ids).stats.tokens_per_s,
                        "plain": lambda: plain.generate(prompt_ids).stats.tokens_per_s},
                       repeats, noise=lambda: noise_check(lambda: plain.sized(8).generate(prompt_ids)))


def _timing_report(timing: Comparison) -> dict:
    """The timed pairs' figures (they replace the cold single runs' tokens_per_s and speedup)."""
    speedup, spec, plain = timing.ratio("speculative", "plain"), timing.spread("speculative"), timing.spread("plain")
    assert timing.noise is not None
    return {"tokens_per_s": round(spec.median, 3), "ar_tokens_per_s": round(plain.median, 3),
            "speedup": round(speedup.median, 3),
            "speedup_range": [round(speedup.low, 3), round(speedup.high, 3)], "timed_pairs": len(speedup.samples),
            "noise": timing.noise.describe(), "measurement_reliable": timing.noise.reliable}


def _report(result: GenerationResult, plain: GenerationResult | None, policy: SamplingPolicy, verifier: str) -> dict:
    s = result.stats
    report = {
        "text": result.text,
        "new_tokens": s.new_tokens,
        "rounds": s.rounds,
        "mean_accepted": round(s.mean_accepted, 4),
        "mean_emitted": round(s.mean_emitted, 4),
        "acceptance_by_depth": s.acceptance_by_depth,
        **({"acceptance_by_source": {name: f"{int(v['accepted'])}/{int(v['rows'])} rows accepted, "
                                           f"{v['accepted_per_round']} per round"
                                     for name, v in s.by_source.items()}} if len(s.by_source) > 1 else {}),
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
    for key in ("new_tokens", "rounds", "mean_accepted", "acceptance_by_depth", "acceptance_by_source", "fallbacks",
                "gated_rounds",
                "tokens_per_s", "time_split_ms_per_token", "verifier", "stop_reason", "ar_tokens_per_s", "speedup",
                "speedup_range", "timed_pairs", "noise", "identical_to_ar", "exactness", "divergence", "warning"):
        if key in report:
            table.add_row(key, str(report[key]))
    err.print(table)
