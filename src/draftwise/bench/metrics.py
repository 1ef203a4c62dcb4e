"""Metrics over answers: speed, speedup, the round-cost ledger, acceptance, latency, exactness.

Definitions (the report repeats them):
- tokens/s follows Spec-Bench: per question, its new tokens over its wall time (all turns),
  then the mean over questions.  speedup = that mean / the same mean of the method's plain
  reference (same backend, same target), over the questions both answered.
- time per committed token = total wall / total new tokens; draftwise methods split it into
  the engine's phases (prefill = round 1's forward, prompt included; retrieval = a REST
  datastore's whole proposal), plus "other" (stop checks, callbacks: wall minus the phases).
- mean accepted = accepted draft tokens per verification step (bonus token not counted),
  pooled over every step; acceptance by depth, fallbacks and rows verified are pooled the
  same way with `draftwise.runtime.stats.summarize`, so they mean what the engine's stats mean.
  fallback rate = rounds whose proposers returned nothing / all rounds.
- first-child coverage = of the rounds whose frontier offered candidates, the share where the
  target's next token was the FIRST candidate (what a one-candidate proposer would have got);
  any-child coverage = the share where it was any of them.  Their gap is what the siblings
  add.  Counted over the rounds that recorded the frontier (`coverage_rounds`).
- provisional KV = the KV rows a round holds only until its commit (the pending token and
  every candidate), (1 + candidate rows) x the target's bytes per KV row, the most of any
  round; max KV adds the committed rows: the most KV the cache held during a round.
- inter-token latency = gap between consecutive emit events; a round that publishes several
  tokens is one event, as a streaming reader sees it.  TTFT = start to the first event.
- a mismatch is a (question, turn) whose tokens differ from the reference's; it is reported
  with the first differing position (temperature 0 only: sampled outputs legitimately differ).
  `compared_turns` says how many turns had a reference answer to compare with; with none,
  mismatches is None (unchecked), never 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from draftwise.bench.outputs import ROUND_FIELDS
from draftwise.bench.store import Answer
from draftwise.runtime.stats import PHASES, RoundRecord, source_summary, summarize


@dataclass(frozen=True)
class Mismatch:
    question_id: str
    turn: int
    first_difference: int  # first position where the tokens differ (or where the shorter one ends)
    length: int
    reference_length: int


@dataclass(frozen=True)
class Latency:
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    ttft_median_ms: float | None


@dataclass(frozen=True)
class MethodMetrics:
    questions: int
    errors: int
    new_tokens: int
    wall_time: float
    tokens_per_s: float
    speedup: float | None  # None for a method without a reference (or the reference itself: 1.0)
    speedup_per_prompt_median: float | None
    ms_per_token: float
    time_split_ms: dict[str, float] | None  # phase -> ms per committed token (draftwise methods)
    propose_ms_per_round: float | None  # the proposer's time per round (a head set's cost per round)
    mean_accepted: float | None
    accepted_histogram: list[int] | None
    acceptance_by_depth: list[float | None] | None  # None inside: that depth was never offered
    fallback_rate: float | None
    rows_verified_mean: float | None
    first_child_coverage: float | None
    any_child_coverage: float | None
    coverage_rounds: int  # rounds whose frontier offered candidates and recorded which was taken
    max_provisional_kv_bytes: int | None
    max_kv_bytes: int | None
    latency: Latency
    mismatches: int | None  # None: not checked (no reference answers to compare, or sampling)
    compared_turns: int  # (question, turn) pairs compared with the reference
    mismatch_examples: list[Mismatch]
    # proposer -> {rounds, rows, accepted, accepted_per_round}: which source of a union pays
    acceptance_by_source: dict[str, dict[str, float]] | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def find_mismatches(answers: list[Answer], reference: dict[str, Answer]) -> tuple[list[Mismatch], int]:
    """(the mismatches, how many (question, turn) pairs had a reference to compare with)."""
    found = []
    compared = 0
    for answer in answers:
        ref = reference.get(answer.question_id)
        if ref is None or ref.error or answer.error:
            continue
        for turn, (mine, theirs) in enumerate(zip(answer.turns, ref.turns)):
            compared += 1
            at = first_difference(mine.tokens, theirs.tokens)
            if at is not None:
                found.append(Mismatch(answer.question_id, turn, at, len(mine.tokens), len(theirs.tokens)))
    return found, compared


def mean_tokens_per_s(answers: list[Answer]) -> float:
    speeds = [a.tokens_per_s for a in answers if not a.error]
    return float(np.mean(speeds)) if speeds else 0.0


def _speedups(answers: list[Answer], reference: dict[str, Answer] | None) -> tuple[float | None, float | None]:
    if reference is None:
        return None, None
    shared = [a for a in answers if not a.error and a.question_id in reference and not reference[a.question_id].error]
    if not shared:
        return None, None
    ref_answers = [reference[a.question_id] for a in shared]
    ref_mean = mean_tokens_per_s(ref_answers)
    per_prompt = [a.tokens_per_s / r.tokens_per_s for a, r in zip(shared, ref_answers) if r.tokens_per_s > 0]
    overall = mean_tokens_per_s(shared) / ref_mean if ref_mean > 0 else None
    return overall, (float(np.median(per_prompt)) if per_prompt else None)


def _latency(answers: list[Answer]) -> Latency:
    gaps: list[float] = []
    firsts: list[float] = []
    for answer in answers:
        for turn in answer.turns:
            offsets = np.asarray(turn.emit_offsets, dtype=np.float64)
            if offsets.size:
                firsts.append(float(offsets[0]))
                gaps.extend(np.diff(offsets).tolist())
    if not gaps:
        return Latency(None, None, None, None, float(np.median(firsts)) * 1e3 if firsts else None)
    ms = np.asarray(gaps) * 1e3
    return Latency(*(round(float(np.percentile(ms, q)), 3) for q in (50, 90, 99)), round(float(ms.max()), 3),
                   round(float(np.median(firsts)) * 1e3, 3))


def _round_records(answers: list[Answer]) -> list[RoundRecord] | None:
    turns = [t for a in answers for t in a.turns]
    if not turns or any(t.rounds is None for t in turns):
        return None
    return [RoundRecord(nodes=r[0], proposal_depth=r[1], accepted=r[2], emitted=r[3], fallback=bool(r[4]), kv_bytes=0)
            for t in turns for r in t.rounds]


_OFFERED, _TAKEN = ROUND_FIELDS.index("frontier_children"), ROUND_FIELDS.index("frontier_slot")


def _coverage(answers: list[Answer]) -> tuple[float | None, float | None, int]:
    """(first-child coverage, any-child coverage, rounds counted) over the rounds that recorded
    their frontier (answers written before that have five fields) and offered candidates there."""
    frontier = [(r[_OFFERED], r[_TAKEN]) for a in answers for t in a.turns for r in (t.rounds or ())
                if len(r) > _TAKEN and r[_OFFERED] > 0]
    if not frontier:
        return None, None, 0
    first = sum(slot == 0 for _, slot in frontier) / len(frontier)
    any_child = sum(slot >= 0 for _, slot in frontier) / len(frontier)
    return round(first, 4), round(any_child, 4), len(frontier)


def _max_provisional_kv(answers: list[Answer], kv_row_bytes: int | None) -> int | None:
    rows = [1 + r[0] for a in answers for t in a.turns for r in (t.rounds or ())]
    return max(rows) * kv_row_bytes if rows and kv_row_bytes else None


def _acceptance(answers: list[Answer], tokens: int, wall: float) -> dict:
    """Acceptance from draftwise rounds, or from per-step accept lengths (transformers peers)."""
    records = _round_records(answers)
    if records:
        stats = summarize(records, tokens, wall)
        return {"mean_accepted": round(stats.mean_accepted, 4), "accepted_histogram": stats.accepted_histogram,
                "acceptance_by_depth": stats.acceptance_by_depth,
                "fallback_rate": round(stats.fallbacks / stats.rounds, 4) if stats.rounds else 0.0,
                "rows_verified_mean": round(stats.rows_verified_mean, 3)}
    steps = [n for a in answers for t in a.turns for n in (t.accept_lengths or ())]
    known = all(t.accept_lengths is not None for a in answers for t in a.turns)
    if not steps or not known:
        return {}
    accepted = np.asarray(steps, dtype=np.int64) - 1  # the step's own target token is not an accepted draft
    return {"mean_accepted": round(float(accepted.mean()), 4), "accepted_histogram": np.bincount(accepted).tolist()}


def _time_split(answers: list[Answer], tokens: int, wall: float) -> dict[str, float] | None:
    turns = [t for a in answers for t in a.turns]
    if not turns or any(t.phase_seconds is None for t in turns) or tokens == 0:
        return None
    totals = {p: sum(t.phase_seconds.get(p, 0.0) for t in turns) for p in PHASES}
    totals["other"] = max(0.0, wall - sum(totals.values()))
    return {p: round(s / tokens * 1e3, 4) for p, s in totals.items()}


def _propose_per_round(answers: list[Answer]) -> float | None:
    turns = [t for a in answers for t in a.turns]
    if not turns or any(t.phase_seconds is None or t.rounds is None for t in turns):
        return None
    rounds = sum(len(t.rounds) for t in turns)
    seconds = sum(t.phase_seconds.get("propose", 0.0) + t.phase_seconds.get("retrieval", 0.0) for t in turns)
    return round(seconds / rounds * 1e3, 4) if rounds else None


def method_metrics(answers: list[Answer], reference: dict[str, Answer] | None, check_exact: bool,
                   is_reference: bool = False, kv_row_bytes: int | None = None) -> MethodMetrics:
    """`kv_row_bytes`: the target's KV bytes per token row, for the provisional KV (None: unknown)."""
    good = [a for a in answers if not a.error]
    tokens = sum(a.new_tokens for a in good)
    wall = sum(a.wall_time for a in good)
    speedup, per_prompt = (1.0, 1.0) if is_reference else _speedups(good, reference)
    acceptance = _acceptance(good, tokens, wall)
    compare = check_exact and reference is not None and not is_reference
    mismatches, compared = find_mismatches(good, reference) if compare else ([], 0)
    if is_reference and check_exact:
        compared = sum(len(a.turns) for a in good)  # identical to itself
    checked = compared > 0
    kv = [t.max_kv_bytes for a in good for t in a.turns if t.max_kv_bytes is not None]
    first_child, any_child, coverage_rounds = _coverage(good)
    return MethodMetrics(
        questions=len(good),
        errors=len(answers) - len(good),
        new_tokens=tokens,
        wall_time=round(wall, 4),
        tokens_per_s=round(mean_tokens_per_s(good), 3),
        speedup=None if speedup is None else round(speedup, 4),
        speedup_per_prompt_median=None if per_prompt is None else round(per_prompt, 4),
        ms_per_token=round(wall / tokens * 1e3, 4) if tokens else 0.0,
        time_split_ms=_time_split(good, tokens, wall),
        propose_ms_per_round=_propose_per_round(good),
        mean_accepted=acceptance.get("mean_accepted"),
        accepted_histogram=acceptance.get("accepted_histogram"),
        acceptance_by_depth=acceptance.get("acceptance_by_depth"),
        fallback_rate=acceptance.get("fallback_rate"),
        rows_verified_mean=acceptance.get("rows_verified_mean"),
        first_child_coverage=first_child,
        any_child_coverage=any_child,
        coverage_rounds=coverage_rounds,
        max_provisional_kv_bytes=_max_provisional_kv(good, kv_row_bytes),
        max_kv_bytes=max(kv) if kv else None,
        latency=_latency(good),
        mismatches=len(mismatches) if checked else None,
        compared_turns=compared,
        mismatch_examples=mismatches[:20],
        acceptance_by_source=_by_source(good),
    )


def _by_source(answers: list[Answer]) -> dict[str, dict[str, float]] | None:
    totals: dict[str, list[int]] = {}
    for turn in (t for a in answers for t in a.turns):
        for name, counts in (turn.by_source or {}).items():
            total = totals.setdefault(name, [0, 0, 0, 0])
            for i, n in enumerate(counts):
                total[i] += int(n)
    return source_summary(totals) or None
