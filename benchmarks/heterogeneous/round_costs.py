"""Where a guarded method's time goes beside plain decoding's, per category, from a bench run's
answers: the wall time of its rounds that verified no candidate (the guard's plain steps, shadowed
or not) against plain decoding's rounds, and its speculative rounds' milliseconds per token.

A guarded method's plain steps should cost what plain decoding's do; what they cost beyond that
is the guard's own price (shadow proposals, bookkeeping, hidden states for the heads) or what a
speculative round left behind (llama.cpp rebuilds its graph for the one-row shape).

Usage: python benchmarks/heterogeneous/round_costs.py RUN_DIR [METHOD=auto] [REFERENCE=plain]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def load(run: Path, method: str) -> dict[str, tuple[str, list[dict]]]:
    answers = {}
    for line in (run / "answers" / f"{method}.jsonl").read_text().splitlines():
        row = json.loads(line)
        answers[row["question_id"]] = (row["category"], row["draftwise"]["turns"])
    return answers


def intervals(turn: dict) -> list[float]:
    """Seconds between consecutive emit events: round i's wall time for i >= 1."""
    offsets = turn["emit_offsets"]
    return [b - a for a, b in zip(offsets, offsets[1:])]


def main(run: Path, method: str = "auto", reference: str = "plain") -> None:
    ours, theirs = load(run, method), load(run, reference)
    by_category: dict[str, list[dict]] = {}
    for question, (category, turns) in ours.items():
        for number, turn in enumerate(turns):
            other = theirs[question][1][number]
            gaps, rounds = intervals(turn), turn["rounds"]
            plain_steps = [gaps[i - 1] for i in range(1, len(rounds)) if rounds[i][0] == 0]
            speculative = [(gaps[i - 1], rounds[i][3]) for i in range(1, len(rounds)) if rounds[i][0] > 0]
            by_category.setdefault(category, []).append(dict(
                wall=turn["wall_time"], reference_wall=other["wall_time"], tokens=len(turn["tokens"]),
                reference_tokens=len(other["tokens"]), plain=plain_steps, reference=intervals(other),
                speculative=speculative, same=turn["tokens"] == other["tokens"]))
    print(f"{'category':15s} {'x ref':>6s} {'same':>5s} {'plain steps ms':>15s} {'ref steps ms':>13s} "
          f"{'excess':>7s} {'spec rounds':>11s} {'spec ms/tok':>11s}")
    for category, turns in by_category.items():
        rate = sum(t["tokens"] for t in turns) / sum(t["wall"] for t in turns)
        reference_rate = sum(t["reference_tokens"] for t in turns) / sum(t["reference_wall"] for t in turns)
        plain = [g for t in turns for g in t["plain"]]
        reference = [g for t in turns for g in t["reference"]]
        spec = [s for t in turns for s in t["speculative"]]
        mine = statistics.mean(plain) * 1e3 if plain else float("nan")
        theirs_ms = statistics.mean(reference) * 1e3
        spec_ms = sum(s for s, _ in spec) / max(1, sum(e for _, e in spec)) * 1e3
        print(f"{category:15s} {rate / reference_rate:6.3f} {str(all(t['same'] for t in turns)):>5s} "
              f"{mine:9.2f} ({len(plain):3d}) {theirs_ms:13.2f} {mine / theirs_ms - 1:+7.1%} {len(spec):11d} "
              f"{spec_ms:11.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
