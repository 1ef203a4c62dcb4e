"""The gated union against its sources alone, replayed on a bench run's plain traces (no target
forward, so no timing noise in the comparison): the union's depth per source chosen from recent
walks down the merged tree (`gate.SourceGate`, `union_walks=True`) against the independent model
alone (`union_walks=False`) and against the walks with the heads asked every round
(`ask_by_cost=False`), beside gated prompt lookup and Hydra++ with its tree alone.

Each trace is plain decoding's answer to one turn of the run (its prompt re-made through the
target's chat template with plain's earlier answers, as the bench made it); the target's hidden
states along it are recorded once, so the heads draft on the trace as in decoding.  A replay runs
the engine itself on the trace (`draftwise.optimize.replay`); its cost is the run's measured gate
profile t(1 + rows) per round after the first, plus the proposers' measured time in plain-step
units (a round where the heads drafted at their median drafting time, so the machine's load
does not move the comparison), so the columns differ only by what each configuration verifies
and proposes.

Usage: python benchmarks/heterogeneous/union_replay.py RUN_DIR [--profile-from RUN] [--tree PATHS] [--threads 2]
  RUN_DIR: a bench run with a `plain` method (its answers are the traces; a `questions.jsonl`
  beside them stands in for the run's `specbench:` question file); --profile-from: a run
  of union.sh (plain, lookup-gate, hydrapp-auto, union-tree-gate) whose measured gate profile
  and heads' tree are used (default RUN_DIR itself); PATHS: the heads' tree as a JSON list of
  paths.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

from draftwise.measure.load import load_backend
from draftwise.build import fitted_generation, make_proposers
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.gate import CostGateConfig
from draftwise.optimize.auto_proposer import HiddenTraces
from draftwise.optimize.replay import Trace, replay
from draftwise.optimize.trace_hidden import record_hidden
from draftwise.parse import spec_from_options
from draftwise.spec import DecoderSpec
from draftwise.workloads import messages_for, parse_workloads

# the union with the independent model alone and with the walks but asking the heads every round
# (as before `CostGateConfig.ask_by_cost`), beside its two sources
SOURCES = ("lookup-gate", "hydra++", "union-independent", "always-ask")
HEADS_DRAFTED_S = 1e-3  # a round that took longer to propose ran the heads (prompt lookup: microseconds)


def traces_of(run: Path, target) -> list[tuple[str, Trace]]:
    """(category, trace) for every turn of plain decoding's answers in `run`."""
    workloads = list(json.loads((run / "summary.json").read_text())["settings"]["workloads"])
    if (run / "questions.jsonl").is_file():  # a run on a question file kept beside its answers
        workloads = [f"specbench:{run / 'questions.jsonl'}" if w.startswith("specbench:") else w for w in workloads]
    questions = {q.question_id: q for q in parse_workloads(workloads).questions}
    out = []
    for line in (run / "answers" / "plain.jsonl").read_text().splitlines():
        row = json.loads(line)
        question = questions[row["question_id"]]
        texts = row["choices"][0]["turns"]
        for turn, recorded in enumerate(row["draftwise"]["turns"]):
            prompt = target.chat_prompt(messages_for(question, turn, texts[:turn]))
            out.append((row["category"], Trace(tuple(prompt), tuple(recorded["tokens"]), 1.0, 1.0)))
    return out


def run_tree(run: Path) -> str:
    line = (run / "answers" / "union-tree-gate.jsonl").read_text().splitlines()[0]
    found = re.search(r"tree=(\[\[.*?\]\])", json.loads(line)["model_id"])
    if found is None:
        raise SystemExit("the run's union names no tree: pass --tree")
    return found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--tree", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--walk-decay", default=str(CostGateConfig.walk_decay),
                        help="union walks' decays to compare, e.g. 0.5,0.95 (a column each)")
    parser.add_argument("--profile-from", type=Path, default=None,
                        help="a union.sh run whose measured gate profile (and tree) to use (default: RUN_DIR)")
    args = parser.parse_args()
    settings = json.loads((args.run / "summary.json").read_text())["settings"]
    measured_in = args.profile_from or args.run
    measured = json.loads((measured_in / "summary.json").read_text())["gate_profiles"]["union-tree-gate"]
    profile = VerifyCostProfile.from_json(measured, {k: measured[k] for k in ("model", "backend", "threads", "machine")})
    step = profile.absolute_at(1)
    tree = args.tree or run_tree(measured_in)
    target = load_backend(settings["target"], "transformers", args.threads)
    traces = traces_of(args.run, target)
    print(f"{len(traces)} traces; profile t(11) = {profile.relative_at(min(11, profile.max_rows)):.2f} plain steps; "
          f"heads' tree {tree}", flush=True)
    base = DecoderSpec(generation=GenerationConfig(max_new_tokens=settings["max_new_tokens"]))
    specs = {
        "lookup-gate": spec_from_options({"proposer": "prompt-lookup"}, base),
        "hydra++": spec_from_options({"proposer": "hydra++", "tree": tree, "relation": "beam"}, base),
        "union": spec_from_options({"proposer": "prompt-lookup+hydra++", "tree": tree, "relation": "beam"}, base),
    }
    decays = [float(d) for d in args.walk_decay.split(",")]
    columns = [*SOURCES, *(f"walks-{d:g}" for d in decays)]
    gates = {"lookup-gate": CostGateConfig(profile), "hydra++": None,
             "union-independent": CostGateConfig(profile, union_walks=False, ask_by_cost=False),
             "always-ask": CostGateConfig(profile, ask_by_cost=False),
             **{f"walks-{d:g}": CostGateConfig(profile, walk_decay=d) for d in decays}}
    hidden = HiddenTraces([record_hidden(target, trace) for _, trace in traces], target.info, target.token_weights())
    replayed: dict[tuple[int, str], list] = {}
    started = time.perf_counter()
    for i, (_, trace) in enumerate(traces):
        for column in columns:
            spec = specs[column if column in specs else "union"]
            stand_in = hidden.backend(i, trace, settings["max_new_tokens"])
            replayed[i, column] = replay(trace, make_proposers(spec, stand_in), max_new_tokens=settings["max_new_tokens"],
                                         limits=fitted_generation(spec).limits, context_length=target.info.context_length,
                                         gate=gates[column], target=stand_in)[1:]  # round 1 reads the prompt: alike
        print(f"  trace {i + 1}/{len(traces)} ({time.perf_counter() - started:.0f} s)", flush=True)
    # a round where the heads drafted costs their median drafting time (what the replay measured
    # varies with the machine's load); lookup's own is microseconds, taken as measured
    drafted = [r.propose_s for rounds in replayed.values() for r in rounds if r.propose_s > HEADS_DRAFTED_S]
    heads_s = statistics.median(drafted)
    print(f"heads' drafting: median {heads_s * 1e3:.2f} ms a round ({len(drafted)} rounds), "
          f"{heads_s / step:.3f} plain steps")
    for column in columns[1:]:
        rounds = [r for (_, c), rs in replayed.items() if c == column for r in rs]
        share = sum(r.propose_s > HEADS_DRAFTED_S for r in rounds) / max(len(rounds), 1)
        print(f"  {column}: the heads drafted in {share:.0%} of {len(rounds)} rounds")
    cost: dict[tuple[str, str], float] = defaultdict(float)  # (category, column) -> plain-step units
    tokens: dict[tuple[str, str], int] = defaultdict(int)
    for (i, column), rounds in replayed.items():
        category = traces[i][0]
        for r in rounds:
            propose = heads_s if r.propose_s > HEADS_DRAFTED_S else r.propose_s
            cost[category, column] += profile.relative_at(1 + r.nodes) + propose / step
            tokens[category, column] += r.emitted
    categories = list(dict.fromkeys(category for category, _ in traces))
    unions = columns[2:]
    print("\ntokens per plain-step unit (rounds after the first); each union against the better source alone\n"
          f"{'category':15s} " + " ".join(f"{c:>17s}" for c in columns) + "  " + " ".join(f"{c + '/better':>24s}" for c in unions))
    for category in [*categories, "all"]:
        keys = categories if category == "all" else [category]
        rate = {c: sum(tokens[k, c] for k in keys) / sum(cost[k, c] for k in keys) for c in columns}
        better = max(rate["lookup-gate"], rate["hydra++"])
        print(f"{category:15s} " + " ".join(f"{rate[c]:17.3f}" for c in columns) + "  "
              + " ".join(f"{rate[c] / better:24.3f}" for c in unions))


if __name__ == "__main__":
    main()
