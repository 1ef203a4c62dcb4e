"""`--tree auto`: a draft-model tree chosen from measured artifacts, computed on first use.

Four artifacts feed the choice, each cached under a directory keyed by the hash of what it
depends on, so another model, tokenizer, draft, backend, thread count or sampling policy
lands in another directory and is never silently reused:

    verify profile   t(n) of the target on this backend and thread count (rows 1..max_nodes)
    draft profiles   the same for the draft model: what each of its forwards costs (a verify
                     of r rows for a level, an extend of r tokens for its catch-up)
    acceptance       positional acceptance of the draft's width-W depth-1 trees under the
                     policy, measured by real verification on the calibration prompts
    tree             `optimize_tree` over all three, bound to their manifest hashes

A cached artifact is reused only if its manifest verifies (checksums) and its provenance
names the same configuration; a tampered or foreign one is measured again.
"""

from __future__ import annotations

import logging

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from draftwise.artifacts import ArtifactError, read_manifest, stable_hash
from draftwise.backends.base import Backend
from draftwise.measure.profile import SAMPLING as PROFILE_SAMPLING, write_profile
from draftwise.measure.row_padding import padded_rows
from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.optimize.calibrate import (
    calibrate,
    calibration_hash,
    calibration_provenance,
    calibration_spec,
    profile_from_counts,
)
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.select import TreeArtifact, load_tree_artifact, optimize_from_artifacts
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.compile import COMPILER_VERSION

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)


@dataclass(frozen=True)
class AutoTreeConfig:
    width: int = 4  # slots calibrated under each parent
    max_nodes: int = 16  # largest tree considered, root included
    max_depth: int = 8
    calibration_tokens: int = 32  # new tokens per calibration prompt
    profile_prefix_len: int = 256
    profile_repeats: int = 3


def configuration_key(target: Backend, draft: Backend, policy: SamplingPolicy, config: AutoTreeConfig,
                      calibration_prompts: Sequence[Sequence[int]]) -> dict:
    return {
        "target": target.info.checkpoint,
        "tokenizer_hash": target.info.tokenizer_hash,
        "draft": draft.info.checkpoint,
        "draft_backend": draft.info.name,
        "draft_tokenizer_hash": draft.info.tokenizer_hash,
        "calibration_prompts": calibration_hash(calibration_prompts),
        "backend": target.info.name,
        "dtype": target.info.dtype,  # the verify costs and the acceptance both change with it
        "padded_rows": padded_rows(target),  # the verify costs change with it
        "draft_dtype": draft.info.dtype,
        "threads": getattr(target, "n_threads", None),
        "policy": policy.as_dict(),
        "compiler": COMPILER_VERSION,
        "config": config.__dict__,
    }


def artifact_matches(directory: Path, kind: str, check: Callable[[dict], bool]) -> bool:
    try:
        return check(dict(read_manifest(directory, kind=kind).provenance))
    except ArtifactError:
        return False


def sampled_as_now(provenance: dict) -> bool:
    """A profile measured here (it records its repeats) must have been sampled the current way,
    on a machine quiet enough for its repeats to agree (`reliable`: one measured while the
    machine was busy is never reused; one of single repeats cannot tell and is); a hand-written one
    (no repeats) has no sampling to check."""
    return "repeats" not in provenance or (provenance.get("sampling") == PROFILE_SAMPLING
                                           and provenance.get("reliable") is not False)


def ensure_profile(target: Backend, directory: Path, rows: Sequence[int], prefix_len: int, repeats: int, *,
                   chain: bool = False, extend: bool = False) -> VerifyCostProfile:
    """The verify profile in `directory`, measured now unless a valid one for this target and
    backend covering `rows` is there already."""
    wanted = [int(n) for n in rows]
    if not artifact_matches(directory, "verify_profile",
                  lambda p: p.get("model") == target.info.checkpoint and p.get("backend") == target.info.name
                  and sampled_as_now(p)):
        shutil.rmtree(directory, ignore_errors=True)
    else:
        profile = VerifyCostProfile.load(directory)
        if set(wanted) <= set(profile.rows):
            return profile
    log.info("measuring the verify cost of %s (rows %d..%d)", target.info.checkpoint, wanted[0], wanted[-1])
    return write_profile(target, directory, prefix_len=prefix_len, rows=wanted, repeats=repeats, chain=chain,
                         extend=extend)


def gate_rows(max_rows: int) -> tuple[int, ...]:
    """Row counts measured for the cost gate: every count up to 16 (where a CPU's cost steps
    lie), then a coarser grid the profile interpolates between."""
    dense = range(1, min(max_rows, 16) + 1)
    coarse = [n for n in (24, 32, 48, 64, 96, 128) if 16 < n < max_rows]
    return tuple(sorted({*dense, *coarse, max_rows}))


def auto_gate_profile(target: Backend, max_rows: int, cache_root: Path, config: AutoTreeConfig = AutoTreeConfig(),
                      chain: bool = False) -> VerifyCostProfile:
    """`--gate auto`: the target's verify profile over 1..max_rows, of chains or of trees (the
    shape the configuration verifies: llama.cpp runs chains on a cheaper path, and a chain-only
    context cannot verify a tree), cached per target, backend, thread count and shape."""
    directory = auto_gate_directory(target, max_rows, cache_root, config, chain)
    return ensure_profile(target, directory, gate_rows(max_rows), config.profile_prefix_len, config.profile_repeats,
                          chain=chain)


def auto_gate_directory(target: Backend, max_rows: int, cache_root: Path, config: AutoTreeConfig = AutoTreeConfig(),
                        chain: bool = False) -> Path:
    """Where `auto_gate_profile` keeps the profile: per target, backend, dtype, thread count and shape."""
    key = {"target": target.info.checkpoint, "tokenizer_hash": target.info.tokenizer_hash, "backend": target.info.name,
           "dtype": target.info.dtype, "threads": getattr(target, "n_threads", None), "prefix_len": config.profile_prefix_len,
           "shape": "chain" if chain else "tree", "padded_rows": padded_rows(target)}
    return Path(cache_root) / "gate" / stable_hash(key)[:20] / f"rows-{max_rows}"


BATCH_GATE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # t_B(n) between them is interpolated


def batch_sizes_up_to(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `max_batch`, and `max_batch` itself."""
    return tuple(sorted({*(2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch), max_batch}))


def auto_batch_gate_profile(target: Backend, max_batch: int, max_rows: int, cache_root: Path,
                            config: AutoTreeConfig = AutoTreeConfig()) -> Path:
    """`gate=auto` with `batch=B`: t_B(n) of this target for batch sizes 1, 2, 4, ... B and rows
    per request up to `max_rows`, measured on a batch backend over the loaded model on first use
    and cached per target, backend, dtype, threads and batch regime; returns its directory."""
    from draftwise.backends.load import open_batch
    from draftwise.measure.profile import profile_batch_verify_cost
    from draftwise.runtime.cost_profile import BATCH_ARTIFACT_KIND, BatchCostProfile

    batches = batch_sizes_up_to(max_batch)
    rows = tuple(n for n in BATCH_GATE_ROWS if n < max_rows) + (max_rows,)
    key = {"target": target.info.checkpoint, "tokenizer_hash": target.info.tokenizer_hash, "backend": target.info.name,
           "dtype": target.info.dtype, "threads": getattr(target, "n_threads", None), "batches": list(batches),
           "rows": list(rows), "shape": "chain", "padded_rows": padded_rows(target),
           "padded_batches": "one sequence"}  # a batch pads its one-sequence forwards only (transformers_batch)
    directory = Path(cache_root) / "batch_gate" / stable_hash(key)[:20]
    if artifact_matches(directory, BATCH_ARTIFACT_KIND,
                        lambda p: p.get("model") == target.info.checkpoint and p.get("backend") == target.info.name
                        and p.get("batch_sizes") == list(batches) and sampled_as_now(p)):
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    batch = open_batch(target, max(batches))
    try:
        profile: BatchCostProfile = profile_batch_verify_cost(batch, batches, rows, repeats=config.profile_repeats)
    finally:
        free = getattr(batch, "free", None)  # llama.cpp: the batch's own context
        if callable(free):
            free()
    profile.save(directory)
    return directory


def auto_tree(
    target: Backend,
    draft: Backend,
    policy: SamplingPolicy,
    calibration_prompts: Sequence[Sequence[int]],
    cache_root: Path,
    config: AutoTreeConfig = AutoTreeConfig(),
) -> TreeArtifact:
    """The tree to decode with, from cached artifacts or measured now."""
    key = configuration_key(target, draft, policy, config, calibration_prompts)
    root = Path(cache_root) / stable_hash(key)[:20]
    profile_dir, acceptance_dir, tree_dir = root / "profile", root / "acceptance", root / "tree"
    draft_profile_dir, draft_catch_up_dir = root / "draft_profile", root / "draft_catch_up"

    ensure_profile(target, profile_dir, tuple(range(1, config.max_nodes + 1)), config.profile_prefix_len,
                   config.profile_repeats)
    # the draft's own forwards price the drafting (`select.draft_round_steps`): a level of the
    # widest tree re-reads up to max_nodes rows (timed as chains, which any draft context holds:
    # a chain-only llama.cpp draft has no tree sequences), a catch-up extends up to max_depth + 2.
    ensure_profile(draft, draft_profile_dir, tuple(range(1, config.max_nodes + 1)),
                   config.profile_prefix_len, config.profile_repeats, chain=True)
    ensure_profile(draft, draft_catch_up_dir, tuple(range(1, config.max_depth + 3)),
                   config.profile_prefix_len, config.profile_repeats, extend=True)
    if not artifact_matches(acceptance_dir, "acceptance",
                  lambda p: p.get("policy") == policy.as_dict() and p.get("target") == target.info.checkpoint
                  and p.get("workload_hash") == key["calibration_prompts"]):
        log.info("calibrating %s on %d prompts (width %d)", draft.info.checkpoint, len(calibration_prompts), config.width)
        shutil.rmtree(acceptance_dir, ignore_errors=True)
        spec = calibration_spec(target.info.checkpoint, target.info.name, None, "draft-model", draft.info.checkpoint,
                                config.width, 1, None, policy, config.calibration_tokens, GenerationConfig().seed)
        decoder = build_decoder(spec, target, draft)
        counts = calibrate(decoder, calibration_prompts, config.width, 1)
        provenance = calibration_provenance(decoder, counts, "auto", calibration_prompts, key["threads"])
        profile_from_counts(counts, provenance).save(acceptance_dir)
    hashes = {"acceptance_manifest_hash": read_manifest(acceptance_dir).hash,
              "hardware_manifest_hash": read_manifest(profile_dir).hash,
              "draft_hardware_manifest_hash": read_manifest(draft_profile_dir).hash,
              "draft_catch_up_manifest_hash": read_manifest(draft_catch_up_dir).hash}
    try:
        return load_tree_artifact(tree_dir, **hashes)
    except ArtifactError:
        pass
    log.info("optimizing the tree for predicted time per committed token")
    shutil.rmtree(tree_dir, ignore_errors=True)
    optimize_from_artifacts(acceptance_dir, profile_dir, tree_dir, max_depth=config.max_depth, max_nodes=config.max_nodes,
                            draft_profile_dir=draft_profile_dir, draft_catch_up_dir=draft_catch_up_dir)
    return load_tree_artifact(tree_dir, **hashes)


def auto_head_tree(
    spec,
    target: Backend,
    calibration_prompts: Sequence[Sequence[int]],
    cache_root: Path,
    config: AutoTreeConfig = AutoTreeConfig(),
) -> TreeArtifact:
    """`tree=auto` for a head family: the heads' slot acceptance per depth, counted on combs
    (width W at every level, the first slot continuing) through every head, the target's t(n),
    and Sequoia's DP over the depth-dependent acceptance; the heads' measured time per level
    prices the drafting.  Keyed by the head set's manifest hash as well as the target's."""
    from dataclasses import replace

    from draftwise.heads.artifact import KIND as HEADS_KIND
    from draftwise.heads.defaults import default_heads

    drafter = spec.drafter
    if drafter.config.tree_nodes is not None:
        config = replace(config, max_nodes=drafter.config.tree_nodes)
    heads_dir = Path(drafter.config.heads) if drafter.config.heads else default_heads(drafter.family.name,
                                                                                   target.info.checkpoint)
    heads_manifest = read_manifest(heads_dir, kind=HEADS_KIND)
    depth = int(heads_manifest.provenance["arch"]["num_heads"])
    policy = spec.generation.policy
    key = {"target": target.info.checkpoint, "tokenizer_hash": target.info.tokenizer_hash,
           "family": drafter.family.name, "heads": heads_manifest.hash, "backend": target.info.name,
           "dtype": target.info.dtype, "threads": getattr(target, "n_threads", None), "policy": policy.as_dict(),
           "calibration_prompts": calibration_hash(calibration_prompts), "compiler": COMPILER_VERSION,
           "config": {k: v for k, v in config.__dict__.items() if k != "max_nodes"}, "padded_rows": padded_rows(target)}
    # the acceptance does not depend on the node budget: one calibration serves every budget,
    # each budget keeps its own tree
    root = Path(cache_root) / "heads" / stable_hash(key)[:20]
    acceptance_dir, tree_dir = root / "acceptance", root / f"tree-n{config.max_nodes}"
    # the verify cost is the target's alone: every head family, set and policy shares one profile
    profile_key = {k: key[k] for k in ("target", "tokenizer_hash", "backend", "dtype", "threads", "padded_rows")}
    profile_key["config"] = {"profile_prefix_len": config.profile_prefix_len, "profile_repeats": config.profile_repeats}
    profile_dir = Path(cache_root) / "heads-profile" / stable_hash(profile_key)[:20]
    ensure_profile(target, profile_dir, tuple(range(1, max(config.max_nodes, AutoTreeConfig.max_nodes) + 1)),
                   config.profile_prefix_len, config.profile_repeats)
    if not artifact_matches(acceptance_dir, "acceptance",
                            lambda p: p.get("policy") == policy.as_dict() and p.get("target") == target.info.checkpoint
                            and p.get("workload_hash") == key["calibration_prompts"]):
        log.info("calibrating %s heads on %d prompts (width %d, depth %d)", drafter.family.name,
                 len(calibration_prompts), config.width, depth)
        shutil.rmtree(acceptance_dir, ignore_errors=True)
        calibration = calibration_spec(target.info.checkpoint, target.info.name, None, drafter.family.name, None,
                                       config.width, depth, None, policy, config.calibration_tokens,
                                       GenerationConfig().seed)
        assert calibration.drafter is not None
        calibration = replace(calibration, drafter=replace(calibration.drafter, config=replace(
            calibration.drafter.config, heads=str(heads_dir))))
        decoder = build_decoder(calibration, target)
        counts = calibrate(decoder, calibration_prompts, config.width, depth)
        provenance = calibration_provenance(decoder, counts, "auto", calibration_prompts, key["threads"])
        profile_from_counts(counts, provenance).save(acceptance_dir)
    hashes = {"acceptance_manifest_hash": read_manifest(acceptance_dir).hash,
              "hardware_manifest_hash": read_manifest(profile_dir).hash}
    try:
        return load_tree_artifact(tree_dir, **hashes)
    except ArtifactError:
        pass
    log.info("optimizing the head tree for predicted time per committed token")
    shutil.rmtree(tree_dir, ignore_errors=True)
    optimize_from_artifacts(acceptance_dir, profile_dir, tree_dir, max_depth=depth, max_nodes=config.max_nodes)
    return load_tree_artifact(tree_dir, **hashes)
