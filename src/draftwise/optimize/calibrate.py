"""Acceptance calibration: measure positional acceptance with real verification.

The decoder under calibration proposes width-W trees of depth D (a depth-1 set is the common
case) and its own verifier selects; every round's `slot_path` says, at each node the
selection reached, how many children were offered and which slot (if any) was selected.
Counting those gives, per depth, how many parents were reached and how often each slot was
the selected child -> `AcceptanceProfile.from_counts` (h, p, Wilson intervals).

A reached parent that offered fewer than W children (a prompt-lookup miss) still counts as
reached: its missing slots were not selected, which is what the tree will see at decoding time
too.  Depth k > 1 is reached only when the round published k - 1 accepted rows (an EOS among
them ends the count there).  Rounds that could not offer the whole depth D (the last rounds of
a generation, cut by max_new_tokens or the context) and rounds a cost gate cut are left out:
their missing children say nothing about the proposer.

The proposer's cost per depth is measured in the same run: per round, the proposal time over
the levels it drafted (a draft model runs one pass per level), the median over the rounds
after the prompt read, in seconds (the optimizer divides by the profile's t(1)).
"""

from __future__ import annotations

import logging

import datetime
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from draftwise.artifacts import stable_hash
from draftwise.runtime.contracts import SamplingRelation
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.errors import InputError
from draftwise.optimize.acceptance import AcceptanceProfile
from draftwise.proposers.family import DrafterRegistry
from draftwise.proposers.registry import DRAFTERS
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.spec import DecoderSpec, DrafterSpec
from draftwise.runtime.stats import RoundRecord

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)


def relation_for(policy: SamplingPolicy) -> SamplingRelation:
    """Top-k children are what greedy verification can use; sampling needs without-replacement
    draws (verified by Sequoia) to stay exact."""
    return SamplingRelation.BEAM if policy.greedy else SamplingRelation.WITHOUT_REPLACEMENT


def calibrated_families(registry: DrafterRegistry = DRAFTERS) -> list[str]:
    return [f.name for f in registry.families() if f.calibrated is not None]


def calibration_spec(target: str, backend: str, threads: Optional[int], proposer: str, draft: Optional[str],
                     width: int, depth: int, relation: Optional[str], policy: SamplingPolicy,
                     max_new_tokens: int, seed: int, registry: DrafterRegistry = DRAFTERS) -> DecoderSpec:
    """The decoder whose rounds are counted: the family's width-W trees of depth D.  Children
    are top-k under greedy decoding (verified greedily) and drawn without replacement when
    sampling (verified by Sequoia) unless `relation` says otherwise."""
    family = registry.get(proposer)
    if family.calibrated is None:
        raise InputError(f"calibration measures {', '.join(calibrated_families(registry))}, not {proposer!r}")
    if width < 1 or depth < 1:
        raise InputError(f"--width and --depth must be >= 1, got {width} and {depth}")
    try:
        chosen = SamplingRelation(relation) if relation else relation_for(policy)
    except ValueError as exc:
        raise InputError(f"relation {relation!r}: choose one of {', '.join(r.value for r in SamplingRelation)}") from exc
    generation = GenerationConfig(max_new_tokens=max_new_tokens, policy=policy, seed=seed)
    drafter = DrafterSpec(family, family.calibrated(width, depth, chosen))
    return DecoderSpec(target=target, backend=backend, drafter=drafter,
                       draft=draft if family.needs_draft_model else None, threads=threads, generation=generation)


@dataclass(frozen=True)
class CalibrationCounts:
    width: int
    depth: int
    selected: tuple[tuple[int, ...], ...]  # [D][W]: rounds whose depth-(k+1) selection was slot j
    reached: tuple[int, ...]  # [D]: rounds that reached a depth-(k+1) parent
    rounds: int  # rounds that asked the proposer
    new_tokens: int
    propose_seconds_median: float  # per round
    verify_seconds_median: float  # per round (1 + nodes rows)
    draft_step_seconds: float  # proposal cost per drafted level, the optimizer's c before normalization by t(1)


def count_slots(records: Sequence[RoundRecord], width: int, depth: int) -> tuple[list[list[int]], list[int]]:
    """Selected-slot counts [D][W] and reached-parent counts [D] from the round ledger."""
    if width < 1 or depth < 1:
        raise InputError(f"width and depth must be >= 1, got width={width}, depth={depth}")
    selected = [[0] * width for _ in range(depth)]
    reached = [0] * depth
    for record in records:
        if not record.asked or record.gated or 0 < record.depth_limit < depth:
            continue  # nothing offered, or less than the whole depth could be: not the proposer's doing
        levels = min(depth, record.accepted + 1)  # the slot path beyond an EOS was never published
        for k in range(levels):
            reached[k] += 1
        for k, (offered, slot) in enumerate(record.slot_path[:levels]):
            if offered > width:
                raise InputError(f"a round offered {offered} children at depth {k + 1}, more than the width {width}")
            if slot >= 0:
                selected[k][slot] += 1
    return selected, reached


def calibrate(
    decoder: SpeculativeDecoder,
    prompts: Sequence[Sequence[int]],
    width: int,
    depth: int,
) -> CalibrationCounts:
    """Run `decoder` on every prompt and count slot selections (a progress line per prompt)."""
    if not prompts:
        raise InputError("calibration needs at least one prompt")
    records: list[RoundRecord] = []
    new_tokens = 0
    for i, prompt in enumerate(prompts):
        result = decoder.generate(prompt)
        records.extend(result.records)
        new_tokens += len(result.tokens)
        log.info("  %d/%d prompts", i + 1, len(prompts))
    selected, reached = count_slots(records, width, depth)
    asked = [r for r in records if r.asked]
    if not asked:
        raise InputError("no calibration round asked the proposer (max_new_tokens too small?)")
    # per-round costs: round 1's forward reads the prompt too, and its proposal includes the
    # draft's own prompt prefill; neither is what a round costs afterwards
    steady = [r for r in asked if not r.reads_prompt] or asked
    drafted = [r for r in steady if r.proposal_depth > 0] or steady
    return CalibrationCounts(
        width=width, depth=depth,
        selected=tuple(tuple(row) for row in selected), reached=tuple(reached),
        rounds=len(asked), new_tokens=new_tokens,
        propose_seconds_median=float(np.median([r.seconds.get("propose", 0.0) + r.seconds.get("retrieval", 0.0)
                                                for r in steady])),
        verify_seconds_median=float(np.median([r.seconds.get("verify", 0.0) for r in steady])),
        # per level drafted: a without-replacement calibration tree [W, 1] costs two draft passes
        draft_step_seconds=float(np.median([(r.seconds.get("propose", 0.0) + r.seconds.get("retrieval", 0.0))
                                            / max(1, r.proposal_depth) for r in drafted])),
    )


def calibration_provenance(decoder: SpeculativeDecoder, counts: CalibrationCounts, workload: str,
                           prompts: Sequence[Sequence[int]], threads: int | None) -> dict:
    """What the profile was measured on: enough to refuse it for another configuration."""
    manifest = decoder.manifest
    return {
        "target": manifest.target_checkpoint,
        "tokenizer_hash": manifest.tokenizer_hash,
        "backend": manifest.backend,
        "threads": threads,
        "proposers": [dict(p) for p in manifest.proposers],
        "proposer_hash": stable_hash([dict(p) for p in manifest.proposers]),
        "verifier": manifest.verifier,
        "policy": dict(manifest.sampling_policy),
        "workload": workload,
        "workload_hash": calibration_hash(prompts),
        "width": counts.width,
        "depth": counts.depth,
        "rounds": counts.rounds,
        "new_tokens": counts.new_tokens,
        "draft_step_seconds": counts.draft_step_seconds,
        "verify_seconds_median": counts.verify_seconds_median,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def calibration_hash(prompts: Sequence[Sequence[int]]) -> str:
    """sha256 of the calibration prompts' token ids: a profile measured on others is another profile."""
    return stable_hash([[int(t) for t in p] for p in prompts])


def profile_from_counts(counts: CalibrationCounts, provenance: dict) -> AcceptanceProfile:
    return AcceptanceProfile.from_counts([list(row) for row in counts.selected], list(counts.reached), provenance)
