"""Per-round records and the generation summary built from them (the round-cost ledger)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# prefill: round 1's forward, prompt included; retrieval: a datastore proposer's whole proposal
PHASES = ("prefill", "propose", "retrieval", "compile", "verify", "select", "commit")


@dataclass(frozen=True)
class RoundRecord:
    nodes: int  # candidate rows verified (after merging and limits)
    proposal_depth: int  # deepest candidate row
    accepted: int  # accepted candidate rows that were published (those after an EOS are not)
    emitted: int  # tokens published this round (accepted + bonus, cut by stop rules)
    fallback: bool  # the proposers returned nothing: one ordinary target step
    kv_bytes: int  # KV bytes held once the round's rows were written: committed + provisional
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    # (children offered, slot selected or -1) at each node the selection reached that had
    # children: the frontier first, then every accepted row.  What calibration counts.
    slot_path: tuple[tuple[int, int], ...] = ()
    # the proposers were asked for candidates: not in a round with room for its own target
    # token only
    asked: bool = True
    gated: bool = False  # the cost gate verified less of the proposal than was offered
    # round 1: its forward also read the prompt (timed as "prefill"), so it is no steady-state round
    reads_prompt: bool = False
    provisional_kv_bytes: int = 0  # KV bytes of the round's provisional rows (pending + candidates)
    depth_limit: int = 0  # the deepest candidate this round could verify (context and max_new_tokens); 0 if not asked
    # the proposers' own split of their phase (a head stage per level): inside `seconds`, not added to it
    detail: dict[str, float] = field(default_factory=dict)
    guard_plain: bool = False  # the do-no-harm guard made this round a plain step (nothing verified)
    shadowed: bool = False  # that plain step carried a shadow proposal (`draftwise.runtime.shadow`): proposed, never verified
    # per proposer, in the engine's order: (its name, verified rows it proposed, accepted rows it
    # proposed); a row two sources proposed (merged by full prefix) counts for both
    by_source: tuple[tuple[str, int, int], ...] = ()
    # the union's sources not asked this round: their drafting was predicted not to pay (`gate.SourceGate.ask`)
    unasked: tuple[str, ...] = ()

    @property
    def total_seconds(self) -> float:
        return float(sum(self.seconds.values()))


@dataclass(frozen=True)
class GenerationStats:
    new_tokens: int
    rounds: int
    mean_accepted: float  # mean accepted candidate tokens per round (the bonus not counted)
    mean_emitted: float  # tokens per round, bonus included
    # P(depth d accepted | a depth-d candidate was offered and d - 1 accepted); None where no round offered
    # one (a rate of 0.0 there would read as "offered and always rejected")
    acceptance_by_depth: list[float | None]
    accepted_histogram: list[int]  # rounds by accepted length
    fallbacks: int
    gated_rounds: int  # rounds the cost gate cut (to a plain step or a shallower tree)
    rows_verified_mean: float
    wall_seconds: float
    tokens_per_s: float
    time_split: dict[str, float]  # phase -> seconds per committed token
    max_kv_bytes: int  # the most KV any round held, committed rows included
    max_provisional_kv_bytes: int  # the most KV a round held provisionally (the verify's own rows)
    # mean seconds per round that asked, of each part of the proposers' time (e.g. head1, head2)
    detail_per_round: dict[str, float] = field(default_factory=dict)
    guard_plain_rounds: int = 0  # rounds the do-no-harm guard made plain steps
    shadow_rounds: int = 0  # of those, the ones that carried a shadow proposal
    # proposer -> {"rounds": rounds it proposed in, "rows": verified rows it proposed,
    # "accepted": accepted rows it proposed, "accepted_per_round": accepted / rounds, "unasked":
    # rounds a union's gate did not ask it}: which source of a union pays (a row two sources
    # proposed counts for both)
    by_source: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: list[RoundRecord], new_tokens: int, wall_seconds: float) -> GenerationStats:
    rounds = len(records)
    accepted = np.array([r.accepted for r in records], dtype=np.int64)
    max_depth = max((r.proposal_depth for r in records), default=0)
    by_depth = []
    for d in range(1, max_depth + 1):
        offered = [r for r in records if r.proposal_depth >= d and r.accepted >= d - 1]
        by_depth.append(round(sum(r.accepted >= d for r in offered) / len(offered), 4) if offered else None)
    histogram = np.bincount(accepted, minlength=1).tolist() if rounds else []
    per_token = max(new_tokens, 1)
    split = {phase: sum(r.seconds.get(phase, 0.0) for r in records) / per_token for phase in PHASES}
    return GenerationStats(
        new_tokens=new_tokens,
        rounds=rounds,
        mean_accepted=float(accepted.mean()) if rounds else 0.0,
        mean_emitted=new_tokens / rounds if rounds else 0.0,
        acceptance_by_depth=by_depth,
        accepted_histogram=histogram,
        fallbacks=sum(r.fallback for r in records),
        gated_rounds=sum(r.gated for r in records),
        rows_verified_mean=float(np.mean([1 + r.nodes for r in records])) if rounds else 0.0,
        wall_seconds=wall_seconds,
        tokens_per_s=new_tokens / wall_seconds if wall_seconds > 0 else 0.0,
        time_split=split,
        max_kv_bytes=max((r.kv_bytes for r in records), default=0),
        max_provisional_kv_bytes=max((r.provisional_kv_bytes for r in records), default=0),
        detail_per_round=_detail(records),
        guard_plain_rounds=sum(r.guard_plain for r in records),
        shadow_rounds=sum(r.shadowed for r in records),
        by_source=_by_source(records),
    )


def _by_source(records: list[RoundRecord]) -> dict[str, dict[str, float]]:
    totals: dict[str, list[int]] = {}
    for record in records:
        for name, rows, accepted in record.by_source:
            total = totals.setdefault(name, [0, 0, 0, 0])
            total[0] += rows > 0
            total[1] += rows
            total[2] += accepted
            total[3] += name in record.unasked
    return source_summary(totals)


def source_summary(totals: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """proposer -> [rounds it proposed in, rows, accepted rows, rounds it was not asked (a
    union's gate skipped it; absent in answers saved before)] as the ledger reports it (the
    engine's per-generation stats and the bench's per-method totals alike)."""
    return {name: {"rounds": counts[0], "rows": counts[1], "accepted": counts[2],
                   "accepted_per_round": round(counts[2] / counts[0], 4) if counts[0] else 0.0,
                   "unasked": counts[3] if len(counts) > 3 else 0}
            for name, counts in totals.items()}


def _detail(records: list[RoundRecord]) -> dict[str, float]:
    asked = [r for r in records if r.asked] or records
    keys = sorted({k for r in asked for k in r.detail})
    return {k: sum(r.detail.get(k, 0.0) for r in asked) / len(asked) for k in keys}
