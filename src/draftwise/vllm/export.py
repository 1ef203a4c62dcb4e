"""`draftwise export vllm`: the speculative_config that pays on this hardware, from draftwise's
measurements, and (`--verify`) vLLM run with it against its default and against no speculation.

1. The workload's greedy outputs: draftwise's plain decoding (transformers backend, the dtype
   vLLM will run), first turns through the chat template.
2. The verify profile per batch size: the `batch_verify_profile` artifact `gate=auto` with
   `batch=B` measures (cached; or `--profile DIR`).
3. Per batch size, the K whose replayed rounds the profile prices fastest (`predict`); vLLM's
   n-gram drafter with prompt_lookup_min = 1 drafts what the replay drafts.
4. The artifact (kind `vllm_export`): speculative_config.json (vLLM's keys, with
   num_speculative_tokens_per_batch_size where the installed vLLM has it), prediction.json, and
   with `--verify` verification.json / verification.md; its manifest names the profile, the
   workload's hash, the target and the vLLM version.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from draftwise.artifacts import staged_artifact, write_manifest
from draftwise.backends.dtype import CONCRETE_DTYPES, TorchDtype, check_dtype
from draftwise.runtime.cost_profile import BatchCostProfile
from draftwise.errors import InputError
from draftwise.vllm.exported import ARTIFACT_KIND, CONFIG_FILE, CUSTOM_FILE, load_exported_method
from draftwise.vllm.methods import CUSTOM_CLASS, PROPOSER_ENV, CustomDrafterConfig, parse_method
from draftwise.vllm.predict import BatchChoice, Round, choose, replay, schedule
from draftwise.vllm.protocol import BatchResult, VllmMethod, WorkerRequest

log = logging.getLogger(__name__)

PREDICTION_FILE = "prediction.json"
VERIFY_FILE = "verification.json"
VERIFY_REPORT = "verification.md"
PROFILE_ENGINES = ("vllm", "draftwise")
DEFAULT_METHOD = "vllm-ngram"  # vLLM's documented n-gram example (methods.DEFAULT_K, DEFAULT_NGRAM_MAX)


@dataclass(frozen=True)
class ExportConfig:
    target: str = "smollm2-135m"
    workload: str = "humaneval:0-7"
    batches: tuple[int, ...] = (1, 2, 4, 8)
    max_new_tokens: int = 64
    dtype: TorchDtype = "bfloat16"  # vLLM takes a concrete dtype: no `auto`
    max_k: int = 8
    ngram_sizes: tuple[int, ...] = (1, 2, 3, 4)  # prompt_lookup_max candidates (one for every batch size)
    profile: Path | None = None  # a batch_verify_profile artifact; None: measured (gate=auto, batch=max)
    # where t_B(n) is measured: "vllm" (in vLLM's own kernels and scheduler, .venv-vllm) or
    # "draftwise" (gate=auto's batch profile on draftwise's transformers backend)
    profile_engine: str = "vllm"
    vllm_profile_rows: tuple[int, ...] = (1, 2, 3, 5, 9)  # one vLLM engine each; between them interpolated
    # draftwise's torch threads for decoding and profiling: price rows on as many cores as vLLM
    # computes on (its CPU build binds all cores but one: one thread on a 2-core machine)
    threads: int | None = None

    def __post_init__(self) -> None:
        check_dtype(self.dtype, CONCRETE_DTYPES)
        if self.profile_engine not in PROFILE_ENGINES:
            raise InputError(f"profile engine {self.profile_engine!r}: choose one of {', '.join(PROFILE_ENGINES)}")
        if not self.batches or min(self.batches) < 1 or self.max_k < 1 or min(self.ngram_sizes) < 1:
            raise InputError(f"batches, max_k and n-gram sizes must be >= 1, got {self}")


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]  # draftwise's greedy plain decoding of each prompt


def rounds_for(workload: Workload, k: int, max_ngram: int) -> list[Round]:
    return [r for p, o in zip(workload.prompts, workload.outputs) for r in replay(p, o, k, max_ngram)]


def plan_export(workload: Workload, profiles: BatchCostProfile, config: ExportConfig) -> tuple[int, tuple[BatchChoice, ...]]:
    """(prompt_lookup_max, per-batch choices): the n-gram size is one for every batch size (vLLM's
    is), the one that predicts fastest at the smallest batch size, where speculation pays most."""
    best: tuple[float, int, tuple[BatchChoice, ...]] | None = None
    for ngram in config.ngram_sizes:
        choices = choose({k: rounds_for(workload, k, ngram) for k in range(1, config.max_k + 1)}, profiles,
                         sorted(config.batches))
        score = choices[0].predicted
        if best is None or score > best[0]:
            best = (score, ngram, choices)
    assert best is not None
    return best[1], best[2]


def speculative_config(ngram: int, choices: Sequence[BatchChoice], per_batch_schedule: bool) -> dict[str, Any] | None:
    """vLLM's speculative_config; None when no batch size pays (run vLLM without speculation).
    Without a per-batch-size schedule in the installed vLLM, the K of the smallest batch size."""
    top = max(c.k for c in choices)
    if top == 0:
        return None
    body: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": top if per_batch_schedule else choices[0].k,
                            "prompt_lookup_max": ngram, "prompt_lookup_min": 1}
    if per_batch_schedule and len({c.k for c in choices}) > 1:
        body["num_speculative_tokens_per_batch_size"] = schedule(choices)
    return body


def custom_method(ngram: int, choices: Sequence[BatchChoice]) -> VllmMethod:
    """The exported choice as draftwise's prompt lookup inside vLLM (custom_class): the drafter the
    replay priced, with the same K per batch size; for vLLM versions without a per-batch schedule
    (the proposer applies it itself) and for comparison with vLLM's n-gram drafter."""
    top = max(c.k for c in choices)
    config = CustomDrafterConfig(drafter="prompt-lookup", k=choices[0].k, max_ngram=ngram,
                                 schedule=tuple((a, b, k) for a, b, k in schedule(choices)))
    return VllmMethod("vllm-exported-custom", {"method": "custom_class", "model": CUSTOM_CLASS,
                                               "num_speculative_tokens": max(top, 1)}, env={PROPOSER_ENV: config.to_json()})


def verify_rows(choices: Sequence[BatchChoice], results: Sequence[BatchResult], exported: str,
                default: str) -> list[dict[str, Any]]:
    """Per batch size: measured tok/s of plain, default and exported, and the exported config's
    predicted vs measured speedup over plain."""
    find = {(r.method, r.batch): r for r in results}
    rows = []
    for choice in choices:
        plain, mine, base, custom = (find.get((m, choice.batch)) for m in ("vllm-plain", exported, default,
                                                                            "vllm-exported-custom"))
        if plain is None or mine is None:
            continue
        measured = mine.tokens_per_s / plain.tokens_per_s
        rows.append({"batch": choice.batch, "k": choice.k, "plain_tok_s": plain.tokens_per_s,
                     "exported_tok_s": mine.tokens_per_s, "default_tok_s": base.tokens_per_s if base else None,
                     "predicted": choice.predicted, "measured": measured,
                     "default_vs_plain": base.tokens_per_s / plain.tokens_per_s if base else None,
                     "custom_vs_plain": custom.tokens_per_s / plain.tokens_per_s if custom else None,
                     "error": measured / choice.predicted - 1.0,
                     "identical_to_plain": sum(a == b for a, b in zip(mine.tokens, plain.tokens)),
                     "requests": len(plain.tokens)})
    return rows


def verify_report(rows: Sequence[dict[str, Any]], default: str) -> str:
    lines = ["| B | K | plain tok/s | exported tok/s | predicted x plain | measured x plain | error "
             f"| {default} x plain | as custom_class x plain | exported greedy = plain |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        default_ratio, custom_ratio = (f"{r[key]:.2f}" if r.get(key) is not None else ""
                                       for key in ("default_vs_plain", "custom_vs_plain"))
        lines.append(f"| {r['batch']} | {r['k']} | {r['plain_tok_s']:.1f} | {r['exported_tok_s']:.1f} "
                     f"| {r['predicted']:.2f} | {r['measured']:.2f} | {r['error']:+.0%} | {default_ratio} "
                     f"| {custom_ratio} | {r['identical_to_plain']}/{r['requests']} |")
    return "\n".join(lines) + "\n"


def write_export(out: Path, config: ExportConfig, ngram: int, choices: Sequence[BatchChoice],
                 spec: dict[str, Any] | None, provenance: dict[str, Any],
                 verification: list[dict[str, Any]] | None = None, default: str = DEFAULT_METHOD) -> Path:
    with staged_artifact(out, ARTIFACT_KIND) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps({"speculative_config": spec}, indent=1) + "\n")
        custom = custom_method(ngram, choices)
        (staging / CUSTOM_FILE).write_text(json.dumps({"speculative_config": custom.speculative_config,
                                                       "env": dict(custom.env)}, indent=1) + "\n")
        (staging / PREDICTION_FILE).write_text(json.dumps(
            {"prompt_lookup_max": ngram, "choices": [asdict(c) | {"by_k": {str(k): v for k, v in c.by_k.items()}}
                                                     for c in choices]}, indent=1) + "\n")
        if verification is not None:
            (staging / VERIFY_FILE).write_text(json.dumps(verification, indent=1) + "\n")
            (staging / VERIFY_REPORT).write_text(verify_report(verification, default))
        write_manifest(staging, ARTIFACT_KIND, {**provenance, "config": {k: str(v) for k, v in asdict(config).items()}})
    return out


def verify_methods(out: Path, default: str) -> tuple[VllmMethod, ...]:
    """No speculation, vLLM's default n-gram, the exported configuration, and its custom_class form."""
    native, custom = load_exported_method(out), load_exported_method(out, custom=True)
    return (parse_method("vllm-plain"), parse_method(default), VllmMethod("vllm-exported", native.speculative_config),
            VllmMethod("vllm-exported-custom", custom.speculative_config, env=custom.env))


def verification_request(workload: Workload, config: ExportConfig, model_dir: Path, methods: tuple[VllmMethod, ...],
                         eager: bool) -> WorkerRequest:
    return WorkerRequest(model=str(model_dir), dtype=config.dtype, prompts=workload.prompts,
                         max_tokens=config.max_new_tokens, batch_sizes=tuple(sorted(config.batches)),
                         methods=methods, enforce_eager=eager)
