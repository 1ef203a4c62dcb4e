"""Replay predictions against speedups measured by `draftwise bench`.

Takes a committed bench run (a results directory): decodes its prompts plainly once on the
same backend and settings (the traces `--proposer auto` uses; every turn of a multi-turn
question, each later turn after plain decoding's own earlier answers), replays every draftwise method
of the run that a trace can replay (plain, prompt lookup, REST, a greedy draft chain; gated or
not), and sets each predicted speedup (Spec-Bench's: per-prompt tok/s averaged, over plain's)
beside the measured one.  `--as PEER=CONFIG` predicts a peer as the draftwise configuration
that does the same work (transformers' prompt lookup = dw prompt lookup, round for round).
Then it asks `--proposer auto` what it picks from its default calibration prompts, and reads
how that configuration measured.

Writes OUT.json and OUT.md (default OUT: predicted, inside the measured run's directory).

    .venv/bin/python benchmarks/lookup_grid/predict_vs_measured.py \\
        --measured benchmarks/cost_gate/runs/amd-epyc-2026-11-30-llamacpp --backend llamacpp \\
        --out benchmarks/lookup_grid/runs/amd-epyc-2026-11-30-gate-replay/llamacpp_gate
    .venv/bin/python benchmarks/lookup_grid/predict_vs_measured.py \\
        --measured benchmarks/cost_gate/runs/amd-epyc-2026-11-30-transformers \\
        --backend transformers --workload humaneval:0-4 --as hf-prompt-lookup=dw:proposer=prompt-lookup \\
        --out benchmarks/lookup_grid/runs/amd-epyc-2026-11-30-gate-replay/transformers_gate
"""

from __future__ import annotations

import argparse
import logging
import datetime
import json
import statistics
from dataclasses import replace
from pathlib import Path

from draftwise.artifacts import stable_hash
from draftwise.bench.methods import MethodDefaults, parse_method
from draftwise.workloads import messages_for, parse_workloads
from draftwise.measure.load import load_backend
from draftwise.plan import branches
from draftwise.parse import spec_from_options
from draftwise.spec import CALIBRATION_WORKLOAD, DecoderSpec, GateProfile
from draftwise.runtime.round import GenerationConfig
from draftwise.models import cache_dir
from draftwise.optimize.auto import AutoTreeConfig, auto_gate_directory, ensure_profile, gate_rows
from draftwise.optimize.auto_proposer import (candidate_rows, choose_proposer, ensure_traces,
                                              replay_candidate, trace_key)
from draftwise.runtime.sampling import SamplingPolicy

REPLAYABLE = ("none", "prompt-lookup", "rest", "draft-model")


def measured_tokens_per_s(run: Path, method: str, ids: list[str]) -> list[float]:
    """Per-question tok/s of `method` in a bench run, in the order of `ids`."""
    rows = {}
    for line in (run / "answers" / f"{method}.jsonl").read_text().splitlines():
        answer = json.loads(line)
        turn = answer["choices"][0]
        rows[answer["question_id"]] = sum(turn["new_tokens"]) / sum(turn["wall_time"])
    return [rows[i] for i in ids]


def every_turn_traces(target, questions, generation: GenerationConfig, root: Path) -> tuple[list, list[int]]:
    """Plain traces of every turn of every question, as the bench decodes them: a later turn's
    prompt holds the earlier turns with plain decoding's own answers (under greedy each exact
    method's answers, near-ties aside; under sampling answers of the same distribution).  Only
    first turns were replayed before, which left out the second turns of Spec-Bench, where a
    rewrite of the first answer is what prompt lookup copies best.  Returns the traces and the
    question index each belongs to."""
    traces, owner, answers = [], [], {i: [] for i in range(len(questions))}
    for turn in range(max(len(q.turns) for q in questions)):
        asked = [i for i, q in enumerate(questions) if turn < len(q.turns)]
        prompts = [target.chat_prompt(messages_for(questions[i], turn, answers[i])) for i in asked]
        directory = root / "traces" / stable_hash(trace_key(target, prompts, generation))[:20]
        for i, trace in zip(asked, ensure_traces(target, prompts, generation, directory)):
            answers[i].append(target.detokenize([t for t in trace.tokens if t not in target.info.eos_token_ids]))
            traces.append(trace)
            owner.append(i)
    return traces, owner


def per_question_tokens_per_s(result, owner: list[int], questions: int) -> list[float]:
    """Predicted tok/s of each question over all its turns, as the bench measures it."""
    seconds, tokens = [0.0] * questions, [0] * questions
    for i, s, n in zip(owner, result.seconds, result.tokens):
        seconds[i] += s
        tokens[i] += n
    return [n / s for n, s in zip(tokens, seconds)]


def same_configuration(a: DecoderSpec, b: DecoderSpec) -> bool:
    return (a.proposer, a.gate is not None, a.family_config) == (b.proposer, b.gate is not None, b.family_config)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the library's progress lines
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", required=True, type=Path, help="a draftwise bench results directory")
    parser.add_argument("--backend", required=True, help="the run's methods on this backend are predicted")
    parser.add_argument("--workload", action="append", help="the questions to compare on (default: the run's)")
    parser.add_argument("--as", dest="aliases", action="append", default=[], help="PEER=dw:CONFIG it equals")
    parser.add_argument("--out", type=Path, help="OUT.json and OUT.md are written (default: MEASURED/predicted)")
    args = parser.parse_args()

    run = json.loads((args.measured / "run.json").read_text())
    policy = SamplingPolicy(temperature=run["temperature"])
    generation = GenerationConfig(max_new_tokens=run["max_new_tokens"], policy=policy, seed=run["seed"])
    defaults = MethodDefaults(target=run["target"], draft=run["draft"], generation=generation)
    aliases = dict(item.split("=", 1) for item in args.aliases)
    methods = {}  # measured method name -> DecoderSpec to replay
    for text in run["methods"]:
        method = parse_method(text, defaults)
        if method.name in aliases:
            method = replace(parse_method(f"{method.name}={aliases[method.name]},backend={args.backend}", defaults),
                             name=method.name)
        spec = method.decoder
        if (method.kind != "dw" or spec.backend != args.backend or spec.proposer not in REPLAYABLE
                or (spec.uses_draft_model and (spec.family_config.tree or not policy.greedy))):
            continue
        methods[method.name] = spec
    plain_name = next(name for name, spec in methods.items() if spec.proposer == "none")

    contexts = {}  # shape -> target: each method's profile is measured on a context like the one it ran on

    def target_for(spec: DecoderSpec):
        shape = branches(spec)
        if shape not in contexts:
            contexts[shape] = load_backend(run["target"], args.backend, run["threads"])
        return contexts[shape]

    target = target_for(methods[plain_name])  # the traces: plain decoding on plain's own context
    draft = (load_backend(run["draft"], args.backend, run["threads"])
             if any(s.uses_draft_model for s in methods.values()) else None)
    questions = parse_workloads(args.workload or run["workloads"]).questions
    ids = [q.question_id for q in questions]
    root = cache_dir().parent / "auto"
    traces, owner = every_turn_traces(target, questions, generation, root)

    config = AutoTreeConfig()
    max_rows = max(1 + candidate_rows(spec) for spec in methods.values())
    predicted, rows = {}, []
    for name, spec in methods.items():
        chain = not branches(spec)  # each method's own shape, as its gate would measure it
        profile_dir = auto_gate_directory(target, max_rows, root, config, chain)
        profile = ensure_profile(target_for(spec), profile_dir, gate_rows(max_rows), config.profile_prefix_len,
                                 config.profile_repeats, chain=chain)
        print(f"replaying {name}")
        result = replay_candidate(replace(spec, gate=GateProfile(profile_dir) if spec.gate else None), target, draft, traces,
                                  generation.max_new_tokens, profile)
        predicted[name] = (statistics.mean(per_question_tokens_per_s(result, owner, len(questions))),
                           result.mean_accepted)
    plain_predicted = predicted[plain_name][0]
    plain_measured = statistics.mean(measured_tokens_per_s(args.measured, plain_name, ids))
    measured = {}
    for name in methods:
        measured[name] = statistics.mean(measured_tokens_per_s(args.measured, name, ids)) / plain_measured
        speedup = predicted[name][0] / plain_predicted
        rows.append({"method": name, "as": aliases.get(name), "predicted_speedup": round(speedup, 4),
                     "measured_speedup": round(measured[name], 4),
                     "relative_error": round(abs(speedup - measured[name]) / measured[name], 4),
                     "predicted_accepted_per_round": round(predicted[name][1], 3)})

    auto = choose_proposer(spec_from_options({"proposer": "auto"}, DecoderSpec(target=run["target"], backend=args.backend,
                                                                               generation=generation)), target, None,
                           [target.chat_prompt(messages_for(q, 0, [])) for q in
                            parse_workloads([CALIBRATION_WORKLOAD]).questions], root)
    pick = next((name for name, spec in methods.items() if same_configuration(spec, auto.spec)), None)
    best = max(measured, key=measured.get)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "backend": args.backend, "target": target.info.checkpoint, "threads": run["threads"],
        "measured_run": str(args.measured), "workloads": args.workload or run["workloads"],
        "max_new_tokens": run["max_new_tokens"], "temperature": run["temperature"],
        "plain_tokens_per_s": {"predicted": round(plain_predicted, 3), "measured": round(plain_measured, 3)},
        "methods": rows,
        "median_relative_error": statistics.median(  # plain is 1.0 on both sides by definition: not evidence
            r["relative_error"] for r in rows if r["method"] != plain_name),
        "auto": {"calibration": CALIBRATION_WORKLOAD, "chosen": auto.chosen, "measured_as": pick,
                 "table": auto.table()},
        "best_measured": best,
        "auto_pick_measured_vs_best": None if pick is None else round(measured[pick] / measured[best], 4),
    }
    stem = args.out or args.measured / "predicted"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: dict) -> str:
    lines = [
        f"# Replay predictions vs `{result['measured_run']}` ({result['backend']})",
        "",
        f"Target `{result['target']}`, {result['threads']} threads, temperature {result['temperature']}, "
        f"{result['max_new_tokens']} new tokens, {', '.join(result['workloads'])}; {result['date']}.",
        "",
        f"Plain tok/s: predicted {result['plain_tokens_per_s']['predicted']} (traces decoded now), measured "
        f"{result['plain_tokens_per_s']['measured']} (the committed run): only speedups are compared.",
        "",
        "| method | predicted as | predicted speedup | measured speedup | error | predicted accepted/round |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["methods"]:
        lines.append(f"| {row['method']} | {row['as'] or 'itself'} | {row['predicted_speedup']:.3f} | "
                     f"{row['measured_speedup']:.3f} | {100 * row['relative_error']:.1f}% | "
                     f"{row['predicted_accepted_per_round']} |")
    auto = result["auto"]
    ratio = result["auto_pick_measured_vs_best"]
    lines += [
        "",
        f"Median |predicted - measured| / measured over the speculative methods: "
        f"**{100 * result['median_relative_error']:.1f}%**.",
        "",
        f"`--proposer auto` from its default calibration (`{auto['calibration']}`, as long as the run) picks "
        f"**{auto['chosen']}** (measured as `{auto['measured_as']}`); best measured: `{result['best_measured']}`"
        + ("" if ratio is None else f"; the pick measures {ratio:.3f}x the best") + ".",
        "",
        "```",
        auto["table"],
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
