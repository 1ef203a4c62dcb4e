"""report.md: what was run, on what, what won, and the tables, for a reader new to the project."""

from __future__ import annotations

import json
from pathlib import Path

from draftwise.bench.concurrency_report import CONCURRENCY_DEFINITIONS, concurrency_section
from draftwise.bench.formatting import fmt as _fmt

DEFINITIONS = """\
**How to read this.** *tok/s* is Spec-Bench's: each question's new tokens over its wall time
(prefill included, all turns), averaged over questions. *Speedup* divides that by the same
average of the method's **plain reference on the same backend and target** (transformers and
llama.cpp legitimately produce different greedy text, so each is checked against its own).
*Mismatches* counts (question, turn) outputs whose tokens differ from that reference; at
temperature 0 a speedup with mismatches is not a valid speedup (when sampling, see Exactness). *Mean accepted* is accepted
draft tokens per verification step, the step's own target token not counted. *ms/token* is
wall time per committed token; for draftwise methods it is split into the engine's phases
(prefill: round 1's forward, prompt included; propose: drafting; retrieval: a REST
datastore's lookup, trie and pruning; compile; verify; select; commit) and *other* (stop
checks, callbacks, chat rendering). *First / any-child coverage*: of the rounds whose frontier offered candidates,
the share where the target's next token was the first candidate / any candidate (the gap is
what the siblings add). *Provisional KV* is the most KV a round held only until its commit
(pending token and candidate rows); *max KV* adds the committed rows.
*ITL* is the gap between consecutive emit events (a round that publishes several tokens is
one event); llama.cpp peers yield drafted tokens one by one, so their gaps include near-zero
ones. Peak memory is the process's maximum RSS, which only grows: the value after a
method was loaded includes every model loaded before it.
"""


def _winner(summary: dict) -> str:
    """Methods are ranked only against others that answered every question (a partial run's
    few easy questions must not outrank a full one); with none complete, over what exists, said so."""
    total = summary["workload"]["questions"]
    ran = {n: m for n, m in summary["methods"].items() if m["overall"]["questions"]}
    # complete: every question attempted (an error still counts as attempted: it is reported, not hidden)
    complete = {n: m for n, m in ran.items() if m["overall"]["questions"] + m["overall"]["errors"] == total}
    pool = complete or ran
    most = max((m["overall"]["questions"] for m in ran.values()), default=0)
    scope = "" if complete else f" (partial run, at most {most} of {total} questions per method: a provisional ranking)"
    unranked = sorted(set(ran) - set(pool))
    sampled = summary["settings"]["temperature"] != 0.0
    valid = [(m["overall"]["speedup"], name) for name, m in pool.items()
             if m["overall"]["speedup"] is not None and not m.get("plain") and not m.get("heuristic")
             and (m["overall"]["mismatches"] == 0 or sampled)]
    fastest = max(((m["overall"]["tokens_per_s"], n) for n, m in pool.items()), default=None)
    lines = []
    kind = "speedup (sampling: exact by construction; texts compared in Exactness)" if sampled else "exact speedup"
    if valid:
        speedup, name = max(valid)
        if speedup > 1.0:
            lines.append(f"Best {kind} over its own backend's plain decoding: **{name}**, {speedup:.2f}x{scope}.")
        else:
            lines.append(f"No method beat its plain reference (closest: **{name}**, {speedup:.2f}x){scope}.")
    elif pool:
        lines.append(f"No speculative method qualifies for the ranking (each has mismatches, no plain reference or a "
                     f"heuristic verifier){scope}.")
    if fastest:
        lines.append(f"Highest absolute throughput: **{fastest[1]}**, {fastest[0]:.3f} tok/s.")
    if unranked:
        lines.append(f"Not ranked (did not attempt all {total} questions): {', '.join(unranked)}.")
    bad = [n for n, m in summary["methods"].items() if m["overall"]["mismatches"]]
    if bad and not sampled:  # when sampling, another text of the same law is no fault
        lines.append(f"**Outputs differ from the plain reference** for: {', '.join(bad)} (see Exactness).")
    return " ".join(lines) or "No method finished a question."


def _dtypes(summary: dict) -> str:
    """The run's --dtype (runs before it was an option: float32), and for auto what the loads chose."""
    asked = summary["settings"].get("dtype", "float32")
    loaded = sorted({c["dtype"] for c in summary.get("checkpoints", {}).values()
                     if c.get("dtype") in ("float32", "bfloat16")})
    return f"{asked} (loaded as {', '.join(loaded) or 'nothing'})" if asked == "auto" else asked


def _noise_lines(noise: dict) -> list[str]:
    """The noise checks (a short generation of the first method repeated) at the start and end of
    the timed part: an unreliable one says the run's ratios may be the machine's."""
    checks = [(when, c) for when, c in noise.items() if "verdict" in c]
    if not checks:
        return []
    said = "; ".join(f"{when}: {c['verdict']}" for when, c in checks)
    if all(c["reliable"] for _, c in checks):
        return [f"Noise check ({checks[0][1]['method']}, a short generation repeated): {said}."]
    return [f"**Measured on a busy machine**: {said}. The ratios below may be the machine's; repeat on an idle one."]


def _overview(summary: dict) -> list[str]:
    s = summary["settings"]
    env = summary.get("environment", {})
    machine = env.get("machine", {})
    w = summary["workload"]
    return [
        "# draftwise benchmark", "",
        f"Workload `{w['spec']}`: {w['questions']} questions ({w['multi_turn']} multi-turn) in categories "
        f"{', '.join(w['categories'])}.",
        f"Target `{s['target']}`" + (f", draft `{s['draft']}`" if s.get("draft") else "") +
        f"; temperature {s['temperature']}, {s['max_new_tokens']} new tokens at most, seed {s['seed']}, "
        f"{s['repeats']} repeat(s) (median kept), {s['threads']} threads, transformers dtype {_dtypes(summary)}.",
        f"Machine: {machine.get('cpu') or machine.get('machine', '?')}, {machine.get('cpus_usable', '?')} usable cores; "
        f"libraries {', '.join(f'{k} {v}' for k, v in env.get('libraries', {}).items() if v)}.",
        *([f"Peak memory (the process's maximum RSS, every model loaded): {summary['peak_rss_mb']:.0f} MB."]
          if summary.get("peak_rss_mb") is not None else []),
        *_noise_lines(summary.get("noise") or {}),
        *([f"**Resumed across environments**: {len(summary['earlier_environments'])} earlier session(s) ran in another "
           "environment (machine, threads, libraries or model files; see summary.json), so answers from different "
           "sessions were not measured side by side."] if summary.get("earlier_environments") else []),
        *([f"**Gate profiles re-measured**: {len(summary['earlier_gate_profiles'])} earlier session(s) gated by "
           "other verify-cost profiles t(n) (see summary.json): the gated methods' rounds were not all decided by "
           "the same costs."] if summary.get("earlier_gate_profiles") else []),
        "",
        "## Result", "", _winner(summary), "",
    ]


def _methods_table(summary: dict) -> list[str]:
    lines = ["## Methods", "", "| method | configuration | reference | RSS after load MB | status |",
             "|---|---|---|---|---|"]
    for name, m in summary["methods"].items():
        status = f"skipped: {m['skipped']}" if m["skipped"] else f"{m['overall']['questions']} questions"
        if m.get("heuristic"):
            status = "**HEURISTIC** (not exact), " + status
        if m["overall"]["errors"]:
            status += f", {m['overall']['errors']} failed"
        lines.append(f"| {name} | {m['config']} | {m['reference'] or '–'} | {_fmt(m.get('rss_after_load_mb'), 0)} | "
                     f"{status.replace('|', '/')} |")
    return lines + [""]


def _overall_table(summary: dict) -> list[str]:
    lines = ["## Overall", "",
             "| method | tok/s | speedup | median per-prompt speedup | ms/token | mean accepted | fallback rate | "
             "rows/step | ITL p50 / p90 ms | TTFT ms | KV MB provisional / max | mismatches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in summary["methods"].items():
        o = m["overall"]
        if not o["questions"]:
            continue
        lat = o["latency"]
        provisional, most = (None if o[k] is None else o[k] / 2**20 for k in ("max_provisional_kv_bytes", "max_kv_bytes"))
        lines.append(f"| {name} | {_fmt(o['tokens_per_s'], 3)} | {_fmt(o['speedup'])} | "
                     f"{_fmt(o['speedup_per_prompt_median'])} | {_fmt(o['ms_per_token'], 1)} | "
                     f"{_fmt(o['mean_accepted'])} | {_fmt(o['fallback_rate'])} | {_fmt(o['rows_verified_mean'], 1)} | "
                     f"{_fmt(lat['p50_ms'], 1)} / {_fmt(lat['p90_ms'], 1)} | {_fmt(lat['ttft_median_ms'], 0)} | "
                     f"{_fmt(provisional, 2)} / {_fmt(most, 1)} | {_fmt(o['mismatches'])} |")
    return lines + [""]


def _category_table(summary: dict) -> list[str]:
    categories = summary["workload"]["categories"]
    ran = {n: m for n, m in summary["methods"].items() if m["overall"]["questions"]}
    lines = ["## Speedup by category (tok/s in parentheses)", "",
             "| method | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
    for name, m in ran.items():
        cells = []
        for c in categories:
            cm = m["categories"].get(c)
            cells.append("–" if not cm or not cm["questions"] else f"{_fmt(cm['speedup'])} ({_fmt(cm['tokens_per_s'], 3)})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def _split_table(summary: dict) -> list[str]:
    rows = {n: m["overall"] for n, m in summary["methods"].items() if m["overall"]["time_split_ms"]}
    if not rows:
        return []
    phases = list(next(iter(rows.values()))["time_split_ms"])
    lines = ["## Where the time goes (ms per committed token)", "",
             "| method | " + " | ".join(phases) + " | propose ms / round | acceptance by depth "
             "| first / any-child coverage (rounds) |",
             "|---|" + "---|" * (len(phases) + 3)]
    for name, o in rows.items():
        depth = ", ".join(_fmt(x) for x in (o["acceptance_by_depth"] or [])) or "–"
        coverage = (f"{_fmt(o['first_child_coverage'])} / {_fmt(o['any_child_coverage'])} ({o['coverage_rounds']})"
                    if o["coverage_rounds"] else "–")
        per_round = o.get("propose_ms_per_round")
        lines.append(f"| {name} | " + " | ".join(_fmt(o["time_split_ms"][p], 2) for p in phases)
                     + f" | {_fmt(per_round, 2) if per_round is not None else '–'} | {depth} | {coverage} |")
    return lines + [""]


def _source_table(summary: dict) -> list[str]:
    """Per-source acceptance of the methods that merged several proposers in one round."""
    rows = {n: m["overall"].get("acceptance_by_source") for n, m in summary["methods"].items()}
    rows = {n: s for n, s in rows.items() if s and len(s) > 1}
    if not rows:
        return []
    lines = ["## Which source pays (heterogeneous rounds)", "",
             "| method | source | rounds proposing | rows verified | rows accepted | accepted per round | rounds not asked |",
             "|---|---|---|---|---|---|---|"]
    for name, sources in rows.items():
        for source, v in sources.items():
            lines.append(f"| {name} | {source} | {v['rounds']} | {v['rows']} | {v['accepted']} | "
                         f"{_fmt(v['accepted_per_round'])} | {v.get('unasked', 0)} |")
    return lines + ["", "A row two sources proposed (merged by full prefix) counts for both; a source that costs "
                    "drafting time is not asked where its rows would not be verified (`gate.SourceGate.ask`).", ""]


def _sampled_texts(summary: dict) -> list[str]:
    """A sampling run: every method samples the target's law; which ones published the very text
    of their plain reference at the same seed (target-sample membership does, `sampling.PositionDraws`)."""
    lines = ["Sampling run (temperature > 0): every exact method samples the target's law, so a different text "
             "is no fault.  Target-sample membership takes each position's draw as plain decoding does, so at "
             "the same seed it publishes plain decoding's text (up to the backend's rounding of the rows); "
             "residual verifiers sample other texts of the same law.  Texts equal to the reference's:", ""]
    for name, m in summary["methods"].items():
        o = m["overall"]
        if m["reference"] == name or o["mismatches"] is None:
            continue
        lines.append(f"- {name}: {o['compared_turns'] - o['mismatches']} of {o['compared_turns']} turns "
                     f"equal {m['reference']}'s.")
    return lines + [""]


def _exactness(summary: dict, ties: dict) -> list[str]:
    lines = ["## Exactness", ""]
    if summary["settings"]["temperature"] != 0.0:
        return lines + _sampled_texts(summary)
    for name, m in summary["methods"].items():
        o = m["overall"]
        if o["mismatches"] is None:
            if o["questions"]:
                lines.append(f"- {name}: not checked (no plain reference answers on its backend to compare with).")
            continue
        if m["reference"] == name:
            lines.append(f"- {name}: is the reference of its backend.")
        elif o["mismatches"] == 0:
            lines.append(f"- {name}: identical to {m['reference']} on all {o['compared_turns']} turns compared.")
        else:
            first = ", ".join(f"{x['question_id']} turn {x['turn']} at token {x['first_difference']}"
                              for x in o["mismatch_examples"][:5])
            lines.append(f"- **{name}: {o['mismatches']} of {o['compared_turns']} turns differ from {m['reference']}**; "
                         f"first: {first}.")
    lines += _kernel_rounding(ties)
    if any(m["overall"]["mismatches"] for m in summary["methods"].values()):
        lines += ["", "A difference disqualifies the speedup whatever its cause. Causes to tell apart: a bug, or kernels "
                      "whose rounding depends on the batch shape (llama.cpp's quantized CPU matmuls can flip a near-tie "
                      "argmax between a one-token decode and a many-row verify); compare the two texts at the position given."]
    return lines + [""]


def _kernel_rounding(ties: dict) -> list[str]:
    """What `benchmarks/llamacpp_exactness/llamacpp_ties.py` found on replaying each divergence (ties.json): the
    target's invariance statement, and whether every parting sits at a near-tie within its bound."""
    if not ties:
        return []
    lines = ["", "Divergences replayed against the target's invariance probe (ties.json):", ""]
    for name, t in ties.items():
        parted = t["divergent_questions"]
        verdict = ("no question parts" if not parted else
                   f"{parted} question(s) part, {t['near_ties']} of them at near-ties"
                   + ("" if t["near_ties"] == parted else " — **the rest are not explained by kernel rounding**"))
        lines.append(f"- {name} vs {t['reference']}: {verdict}; {t['probe']}.")
    return lines


def render_report(summary: dict, plots: list[Path], ties: dict | None = None) -> str:
    lines = _overview(summary) + _methods_table(summary) + _overall_table(summary) + _category_table(summary)
    lines += _split_table(summary) + _source_table(summary) + _exactness(summary, ties or {}) + concurrency_section(summary)
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += ["## Definitions", "", DEFINITIONS]
    if summary.get("concurrency"):
        lines += [CONCURRENCY_DEFINITIONS]
    return "\n".join(lines)


def write_report(summary: dict, root: Path, plots: list[Path]) -> Path:
    """report.md; a ties.json beside it (benchmarks/llamacpp_exactness/llamacpp_ties.py) adds its near-tie verdicts."""
    ties_path = root / "ties.json"
    ties = json.loads(ties_path.read_text()) if ties_path.is_file() else {}
    path = root / "report.md"
    path.write_text(render_report(summary, plots, ties))
    return path
