"""`--proposer auto`'s predictions against speedups measured by `draftwise bench`.

For a committed bench run (a results directory), decode the same prompts plainly once on the
same backend and settings (the traces `--proposer auto` uses), replay every candidate on them,
and set the predicted speedup (Spec-Bench's: per-prompt tok/s averaged, over plain's) beside
the measured one of the method that runs that configuration.  Then ask what `--proposer auto`
picks from its default calibration prompts, and how the pick measured.

    .venv/bin/python benchmarks/auto_proposer/predict_vs_measured.py --backend llamacpp \\
        --measured benchmarks/llamacpp_gate --workload humaneval:0-9 \\
        --map plain=dw-plain --map prompt-lookup=dw-prompt-lookup --map prompt-lookup+gate=dw-prompt-lookup-gate
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from dataclasses import replace
from pathlib import Path

from draftwise.bench.workloads import messages_for, parse_workload
from draftwise.build import DecoderSpec, load_backend
from draftwise.engine import GenerationConfig
from draftwise.models import cache_dir
from draftwise.optimize.auto_proposer import CALIBRATION_WORKLOAD, auto_preflight, choose_proposer


def measured_tokens_per_s(run: Path, method: str, ids: list[str]) -> list[float]:
    """Per-question tok/s of `method` in a bench run, in the order of `ids`."""
    rows = {}
    for line in (run / "answers" / f"{method}.jsonl").read_text().splitlines():
        answer = json.loads(line)
        turn = answer["choices"][0]
        rows[answer["question_id"]] = sum(turn["new_tokens"]) / sum(turn["wall_time"])
    return [rows[i] for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--measured", required=True, type=Path, help="a draftwise bench results directory")
    parser.add_argument("--workload", required=True, help="the questions of that run to compare on")
    parser.add_argument("--map", action="append", default=[], help="CANDIDATE=METHOD of the measured run")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    mapping = dict(item.split("=", 1) for item in args.map)

    spec = DecoderSpec(target=args.target, backend=args.backend, proposer="auto",
                       generation=GenerationConfig(max_new_tokens=args.max_new_tokens))
    target = load_backend(args.target, args.backend, args.threads, progress=print, max_tree_leaves=auto_preflight(spec))
    questions = parse_workload(args.workload).questions
    prompts = [target.chat_prompt(messages_for(q, 0, [])) for q in questions]
    ids = [q.question_id for q in questions]
    root = cache_dir().parent / "auto"
    choice = choose_proposer(spec, target, None, prompts, root, progress=print, trace_tokens=args.max_new_tokens)

    plain_predicted = statistics.mean(next(s for s in choice.scores if s.name == "plain").tokens_per_s)
    plain_measured = statistics.mean(measured_tokens_per_s(args.measured, mapping["plain"], ids))
    rows = []
    for score in choice.scores:
        predicted = statistics.mean(score.tokens_per_s) / plain_predicted
        method = mapping.get(score.name)
        measured = (statistics.mean(measured_tokens_per_s(args.measured, method, ids)) / plain_measured
                    if method else None)
        rows.append({"candidate": score.name, "method": method, "predicted_speedup": round(predicted, 4),
                     "measured_speedup": None if measured is None else round(measured, 4),
                     "relative_error": None if measured is None else round(abs(predicted - measured) / measured, 4),
                     "mean_accepted_predicted": round(score.mean_accepted, 3)})

    default = choose_proposer(replace(spec, generation=replace(spec.generation, max_new_tokens=64)), target, None,
                              [target.chat_prompt(messages_for(q, 0, [])) for q in parse_workload(CALIBRATION_WORKLOAD).questions],
                              root, progress=print)
    measured_by_name = {r["candidate"]: r["measured_speedup"] for r in rows if r["measured_speedup"] is not None}
    best = max(measured_by_name, key=measured_by_name.get)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "backend": args.backend, "target": target.info.checkpoint, "threads": args.threads,
        "measured_run": str(args.measured), "workload": args.workload, "max_new_tokens": args.max_new_tokens,
        "plain_tokens_per_s": {"predicted": round(plain_predicted, 3), "measured": round(plain_measured, 3)},
        "candidates": rows,
        "median_relative_error": statistics.median(  # plain is 1.0 on both sides by definition: not evidence
            r["relative_error"] for r in rows if r["relative_error"] is not None and r["candidate"] != "plain"),
        "auto_on_the_same_prompts": choice.chosen,
        "auto_from_default_calibration": {"workload": CALIBRATION_WORKLOAD, "chosen": default.chosen,
                                          "table": default.table()},
        "best_measured": best,
        "auto_pick_measured_vs_best": round(measured_by_name.get(default.chosen, float("nan")) / measured_by_name[best], 4),
    }
    out = args.out / f"{args.backend}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.backend}.md").write_text(markdown(result))
    print(json.dumps(result, indent=1))


def markdown(result: dict) -> str:
    lines = [
        f"# `--proposer auto` on {result['backend']}: predicted vs measured",
        "",
        f"Target `{result['target']}`, {result['threads']} threads, greedy, {result['max_new_tokens']} new tokens, "
        f"`{result['workload']}`; measured speedups from `{result['measured_run']}`; {result['date']}.",
        "",
        f"Plain tok/s: predicted {result['plain_tokens_per_s']['predicted']}, "
        f"measured {result['plain_tokens_per_s']['measured']} (another sitting: only ratios are compared).",
        "",
        "| candidate | measured as | predicted speedup | measured speedup | error | predicted accepted/round |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["candidates"]:
        error = "" if row["relative_error"] is None else f"{100 * row['relative_error']:.1f}%"
        lines.append(f"| {row['candidate']} | {row['method'] or '—'} | {row['predicted_speedup']:.3f} | "
                     f"{'' if row['measured_speedup'] is None else format(row['measured_speedup'], '.3f')} | "
                     f"{error} | {row['mean_accepted_predicted']} |")
    auto = result["auto_from_default_calibration"]
    lines += [
        "",
        f"Median |predicted - measured| / measured over the speculative candidates: **{100 * result['median_relative_error']:.1f}%**.",
        "",
        f"`--proposer auto` from its default calibration (`{auto['workload']}`, 64 tokens) picks "
        f"**{auto['chosen']}**; best measured: {result['best_measured']}; the pick measures "
        f"{result['auto_pick_measured_vs_best']:.3f}x the best.",
        "",
        "```",
        auto["table"],
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
