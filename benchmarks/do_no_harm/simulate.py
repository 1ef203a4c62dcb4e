"""Replay the do-no-harm controller on real text: how close does it come to the better arm?

For every position of every greedy answer in `traces.json` (`traces.py`), a prompt-lookup round
started there proposes what `find_continuations` finds in the context, and the target accepts the
longest prefix that matches the answer (temperature 0: every arm publishes the same tokens).  A
round's time is t(rows) = 1 + slope * (rows - 1) (relative to a one-row step), times lognormal
noise of the given spread.  Three policies walk the same answers in order, one controller for
the whole run as in a batch of one: always plain, always speculate, and the `DoNoHarm`
controller with each configuration asked for.  Printed: committed tokens per unit time of each,
and the controller's ratio to the better fixed arm (the quantity the loss bound is about).

    PYTHONPATH=src .venv/bin/python benchmarks/do_no_harm/simulate.py benchmarks/do_no_harm/traces.json \\
        --slope 0.03 --slope 0.1 --noise 0.05 --noise 0.3 --seeds 20 --out benchmarks/do_no_harm/simulation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import NamedTuple

import numpy as np

from draftwise.runtime.guard import Arm, DoNoHarm, DoNoHarmConfig
from draftwise.proposers.prompt_lookup import PromptLookupConfig, find_continuations


class Position(NamedTuple):
    rows: int  # rows a lookup round started here verifies (1: nothing proposed)
    accepted: int  # proposed tokens the target accepts


def positions(prompt: list[int], answer: list[int], config: PromptLookupConfig) -> list[Position]:
    out = []
    for p in range(1, len(answer) + 1):  # p tokens published; the last one is pending
        context = np.asarray(prompt + answer[:p], dtype=np.int64)
        found = find_continuations(context, config)
        proposal = [int(t) for t in found[0]] if found else []
        truth = answer[p:]
        accepted = 0
        while accepted < min(len(proposal), len(truth)) and proposal[accepted] == truth[accepted]:
            accepted += 1
        out.append(Position(1 + len(proposal), accepted))
    return out


def replay(answers: list[list[Position]], policy: str, slope: float, noise: float, seed: int,
           config: DoNoHarmConfig | None = None) -> float:
    """Committed tokens per unit time of one policy over every answer in order."""
    rng = np.random.default_rng(seed)
    harm = DoNoHarm(config) if config is not None else None
    tokens = seconds = 0.0
    for answer in answers:
        p = 0
        while p < len(answer):
            if harm is not None:
                arm, explored = harm.play(1)
            else:
                arm, explored = (Arm.SPECULATE if policy == "speculate" else Arm.PLAIN), False
            here = answer[p]
            rows = here.rows if arm is Arm.SPECULATE else 1
            committed = min(1 + here.accepted, len(answer) - p) if arm is Arm.SPECULATE else 1
            took = (1.0 + slope * (rows - 1)) * float(np.exp(rng.normal(0.0, noise)))
            if harm is not None:
                harm.observe(1, arm, committed, took, explored)
            tokens += committed
            seconds += took
            p += committed
    return tokens / seconds


CONFIGS = {
    "previous default (decay = stale = 0.8, explore 16)": DoNoHarmConfig(decay=0.8, stale=0.8, explore_every=16),
    "d.95/s.98": DoNoHarmConfig(decay=0.95, stale=0.98),
    "d.98/s.995": DoNoHarmConfig(decay=0.98, stale=0.995),
    "default": DoNoHarmConfig(),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path)
    ap.add_argument("--slope", type=float, action="append")
    ap.add_argument("--noise", type=float, action="append")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    data = json.loads(args.traces.read_text())
    lookup = PromptLookupConfig()
    groups: dict[str, list[list[Position]]] = {"all": []}
    for trace in data["traces"]:
        walk = positions(trace["prompt"], trace["answer"], lookup)
        groups["all"].append(walk)
        groups.setdefault(trace["workload"], []).append(walk)
    configs = dict(CONFIGS)
    rows = []
    for slope in args.slope or [0.05]:
        for noise in args.noise or [0.1]:
            for group, answers in groups.items():
                fixed = {arm: statistics.median(replay(answers, arm, slope, noise, s) for s in range(args.seeds))
                         for arm in ("plain", "speculate")}
                better = max(fixed.values())
                line = {"slope": slope, "noise": noise, "group": group, **fixed}
                for name, config in configs.items():
                    ratios = [replay(answers, "guard", slope, noise, s, config) / better for s in range(args.seeds)]
                    line[name] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
                rows.append(line)
                print(f"slope {slope:.2f} noise {noise:.2f} {group:22s} spec/plain {fixed['speculate'] / fixed['plain']:.3f}  "
                      + "  ".join(f"{n}: {line[n]['median']:.3f} [{line[n]['min']:.3f}-{line[n]['max']:.3f}]"
                                  for n in configs))
    if args.out is not None:
        args.out.write_text(json.dumps({"configs": {n: c.__dict__ for n, c in configs.items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
