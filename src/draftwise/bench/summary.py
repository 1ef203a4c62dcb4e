"""summary.json: the metrics of every method, overall and per category, from the answer files.

Built from disk, not from memory, so a resumed run summarizes every question it ever
finished, and `draftwise bench` can re-summarize a directory without running anything.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from draftwise.bench.cells import CellStore
from draftwise.bench.concurrency_summary import concurrency_summary, first_turn_tokens
from draftwise.bench.methods import references
from draftwise.bench.metrics import method_metrics
from draftwise.bench.runner import BenchSettings, make_plan
from draftwise.bench.store import Answer, ResultStore

SUMMARY_VERSION = 1


def load_settings(root: Path) -> BenchSettings:
    raw = json.loads((root / "run.json").read_text())
    return BenchSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def build_summary(root: Path) -> dict:
    settings = load_settings(root)
    plan = make_plan(settings)
    store = ResultStore(root)
    session = json.loads((root / "session.json").read_text()) if (root / "session.json").is_file() else {}
    order = [q.question_id for q in plan.workload.questions]
    answers = {m.name: _in_order(store.load(m.name), order) for m in plan.methods}
    by_id = {name: {a.question_id: a for a in rows} for name, rows in answers.items()}
    # each family's reference among the methods that answered: a plain method that was skipped
    # or failed everywhere hands the role to the family's other plain method
    answered = [m for m in plan.methods if any(not a.error for a in answers[m.name])]
    refs = references(answered)
    checkpoints = session.get("checkpoints", {})
    # texts are compared at every temperature: at temperature 0 a difference disqualifies the
    # speedup; when sampling, target-sample membership publishes plain decoding's text at the same
    # seed (`sampling.PositionDraws`) and residual verifiers other texts of the same law, so the
    # count says which cells compare the same answers
    methods = {}
    for method in plan.methods:
        ref_name = refs.get(method.name)
        reference = by_id.get(ref_name) if ref_name else None
        is_ref = ref_name == method.name
        rows = answers[method.name]
        if method.kind == "dw" and method.decoder.proposer == "rest":
            rows = [_retrieval_split(a) for a in rows]
        row_bytes = checkpoints.get(method.name, {}).get("kv_row_bytes")
        overall = method_metrics(rows, reference, True, is_ref, row_bytes).as_dict()
        categories = {c: method_metrics([a for a in rows if a.category == c], reference, True, is_ref, row_bytes).as_dict()
                      for c in plan.workload.categories}
        methods[method.name] = {
            "config": method.describe(),
            "backend": method.backend,
            "family": " ".join(method.family),  # methods whose greedy tokens must agree (kernels included)
            "target": method.target,
            "draft": method.draft,
            "reference": ref_name,
            "plain": method.is_plain,
            "heuristic": method.heuristic,  # never ranked as exact; labelled in the report
            "skipped": session.get("skipped", {}).get(method.name),  # in the latest session
            "rss_after_load_mb": session.get("rss_after_load_mb", {}).get(method.name),
            "overall": overall,
            "categories": categories,
        }
    concurrency = None
    if settings.concurrency:
        single = {name: first_turn_tokens(by_id[name]) for name in by_id}
        concurrency = concurrency_summary(CellStore(root).load(), [m.name for m in plan.methods],
                                          settings.concurrency, single, refs)
    return {
        "version": SUMMARY_VERSION,
        "settings": settings.as_dict(),
        "workload": {"spec": plan.workload.spec, "questions": len(order), "categories": list(plan.workload.categories),
                     "multi_turn": sum(len(q.turns) > 1 for q in plan.workload.questions)},
        "methods": methods,
        "environment": session.get("environment", {}),
        "earlier_environments": session.get("earlier_environments", []),  # resumed from other machines or libraries
        "peak_rss_mb": session.get("peak_rss_mb"),
        "noise": session.get("noise", {}),  # the noise checks at the start and end of the timed part
        "checkpoints": session.get("checkpoints", {}),
        "gate_profiles": session.get("gate_profiles", {}),  # the t(n) each gated method decided by
        "earlier_gate_profiles": session.get("earlier_gate_profiles", []),  # earlier sessions' differing ones
        "concurrency": concurrency,  # B requests in flight per (method, B); None without --concurrency
    }


def _retrieval_split(answer: Answer) -> Answer:
    """A REST method's answer written before the ledger had a retrieval phase: its proposal
    time was all retrieval (the datastore lookup is REST's whole proposal), so it moves there."""
    turns = tuple(replace(t, phase_seconds={**t.phase_seconds, "propose": 0.0,
                                            "retrieval": t.phase_seconds.get("propose", 0.0)})
                  if t.phase_seconds is not None and "retrieval" not in t.phase_seconds else t
                  for t in answer.turns)
    return replace(answer, turns=turns)


def _in_order(answers: dict[str, Answer], order: list[str]) -> list[Answer]:
    return [answers[q] for q in order if q in answers]


def write_summary(root: Path) -> dict:
    summary = build_summary(root)
    ResultStore(root).write_json("summary.json", summary)
    return summary
