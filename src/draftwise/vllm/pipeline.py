"""The whole `draftwise export vllm` pass: decode the workload, profile, choose, write, verify."""

from __future__ import annotations

import logging
from pathlib import Path

from draftwise.api import Decoder, open_decoder
from draftwise.artifacts import read_manifest, stable_hash
from draftwise.runtime.cost_profile import BATCH_ARTIFACT_KIND, BatchCostProfile
from draftwise.runtime.round import GenerationConfig
from draftwise.optimize.auto import artifact_matches, auto_batch_gate_profile
from draftwise.optimize.calibrate import calibration_hash
from draftwise.measure import auto_cache_root
from draftwise.spec import DecoderSpec
from draftwise.vllm.checkpoint import vllm_checkpoint
from draftwise.vllm.export import (DEFAULT_METHOD, ExportConfig, Workload, plan_export, speculative_config,
                                   verification_request, verify_methods, verify_rows, write_export)
from draftwise.vllm.protocol import ProfileRequest
from draftwise.vllm.runner import VllmEnvironment, has_batch_schedule, installed_version, run_profile, run_worker
from draftwise.workloads import first_turn_prompts

log = logging.getLogger(__name__)


def decode_workload(config: ExportConfig) -> tuple[Decoder, Workload]:
    """(decoder, Workload): draftwise's greedy plain outputs of the workload's first turns."""
    spec = DecoderSpec(target=config.target, backend="transformers", dtype=config.dtype, threads=config.threads,
                       generation=GenerationConfig(max_new_tokens=config.max_new_tokens))
    decoder = open_decoder(spec, proposer="none")
    prompts = first_turn_prompts(decoder.target.chat_prompt, config.workload)
    log.info("decoding %d workload prompts plainly (%d new tokens each)", len(prompts), config.max_new_tokens)
    results = decoder.generate_many(prompts, max_batch=max(config.batches))
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    outputs = tuple(tuple(r.tokens) for r in results if not isinstance(r, BaseException))
    return decoder, Workload(tuple(tuple(p) for p in prompts), outputs)


def vllm_profile(config: ExportConfig, eager: bool, environment: VllmEnvironment) -> Path:
    """t_B(n) measured in vLLM (one engine per row count), cached per model, dtype, batches, rows,
    compilation and thread binding."""
    rows = tuple(n for n in config.vllm_profile_rows if n <= config.max_k + 1)
    request = ProfileRequest(model=str(vllm_checkpoint(config.target)), dtype=config.dtype,
                             batch_sizes=tuple(sorted(config.batches)), rows=rows, enforce_eager=eager)
    key = {**request.to_json(), "threads_bind": environment.threads_bind, "iomp": environment.iomp}
    directory = auto_cache_root() / "vllm_profile" / stable_hash(key)[:20]
    if artifact_matches(directory, BATCH_ARTIFACT_KIND, lambda p: p.get("engine") == "vllm"):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    log.info("measuring t_B(n) in vLLM: %d engines (n = %s), B = %s", len(rows), rows, request.batch_sizes)
    profile = run_profile(request, environment, log_path=directory.with_name(directory.name + ".log"))
    for batch, by_rows in sorted(profile.by_batch.items()):
        log.info("vLLM B=%d: %s", batch, ", ".join(f"t({n})={t:.2f}" for n, t in zip(by_rows.rows, by_rows.relative)))
    profile.save(directory)
    return directory


def batch_profile(decoder: Decoder, config: ExportConfig, eager: bool, environment: VllmEnvironment) -> Path:
    if config.profile is not None:
        return config.profile
    if config.profile_engine == "vllm":
        return vllm_profile(config, eager, environment)
    log.info("measuring t_B(n) for B up to %d, rows up to %d (gate=auto's batch profile; cached)",
             max(config.batches), config.max_k + 1)
    return auto_batch_gate_profile(decoder.target, max(config.batches), config.max_k + 1, auto_cache_root())


def export_vllm(config: ExportConfig, out: Path, verify: bool = False, eager: bool = False,
                environment: VllmEnvironment = VllmEnvironment()) -> Path:
    decoder, workload = decode_workload(config)
    profile_dir = batch_profile(decoder, config, eager, environment)
    profiles = BatchCostProfile.load(profile_dir)
    ngram, choices = plan_export(workload, profiles, config)
    version = installed_version(environment)
    # without .venv-vllm here, written for the version setup_vllm.sh installs (0.32.0 has the schedule)
    per_batch = has_batch_schedule(environment) is not False
    spec = speculative_config(ngram, choices, per_batch_schedule=per_batch)
    provenance = {"target": config.target, "checkpoint": decoder.target.info.checkpoint, "dtype": config.dtype,
                  "workload": config.workload, "workload_hash": calibration_hash(workload.prompts),
                  "profile": str(profile_dir), "profile_hash": read_manifest(profile_dir, kind=BATCH_ARTIFACT_KIND).hash,
                  "vllm_version": ".".join(map(str, version)) if version else None,
                  "per_batch_schedule": "num_speculative_tokens_per_batch_size" if spec and per_batch else None}
    write_export(out, config, ngram, choices, spec, provenance)
    if not verify:
        return out
    methods = verify_methods(out, DEFAULT_METHOD)
    request = verification_request(workload, config, vllm_checkpoint(config.target), methods, eager)
    outcome = run_worker(request, environment, log_path=out.parent / f"{out.name}.vllm.log")
    for name, error in outcome.errors.items():
        log.warning("vLLM refused %s: %s", name, error)
    rows = verify_rows(choices, outcome.results, "vllm-exported", DEFAULT_METHOD)
    write_export(out, config, ngram, choices, spec, {**provenance, "verified_eager": eager}, rows, DEFAULT_METHOD)
    return out
