"""The head families side by side (issue 28's comparison), from `draftwise bench` runs whose
methods are head families under `tree=auto` with node budgets (`tree_nodes=N`).

Per run (one backend, one temperature) it tabulates each family at each budget (`tree_nodes=N`
or a fixed tree's size): time per
committed token, speedup over the run's plain decoding, mean accepted length, acceptance by
depth, head cost per round and rows verified; then the issue's goal ratios, each at the same
budget; and two plots: mean accepted length against head cost per round, and speedup
against the tree budget.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

FAMILIES = ("medusa", "hydra", "hydra++", "clover")
_PROPOSER = re.compile(r"proposer=([\w+-]+)")
_NODES = re.compile(r"tree_nodes=(\d+)")
_PATHS = re.compile(r"tree=(\[\[.*?\]\])")
_CHAIN = re.compile(r"tree=chain:(\d+)")


def tree_nodes(config: str) -> int | None:
    """The tree's node budget, root included: a tree=auto budget, or the size of a fixed tree."""
    for pattern, nodes in ((_NODES, int), (_PATHS, lambda t: len(json.loads(t)) + 1),
                           (_CHAIN, lambda k: int(k) + 1)):
        found = pattern.search(config)
        if found:
            return nodes(found.group(1))
    return None


@dataclass(frozen=True)
class HeadRow:
    method: str
    family: str
    nodes: int | None  # the tree's budget, root included; None: tree=auto at its default budget
    ms_per_token: float
    speedup: float | None
    mean_accepted: float
    acceptance_by_depth: tuple[float, ...]
    head_ms_per_round: float
    rows_verified: float
    mismatches: int | None  # None: a sampled run, which has no token-level reference


@dataclass(frozen=True)
class Run:
    directory: Path
    backend: str
    temperature: float
    target: str
    plain_ms_per_token: float | None
    lookup_speedup: float | None
    rows: tuple[HeadRow, ...]

    @property
    def title(self) -> str:
        return f"{self.target}, {self.backend}, temperature {self.temperature:g}"


def read_run(directory: Path) -> Run:
    summary = json.loads((Path(directory) / "summary.json").read_text())
    settings, rows = summary["settings"], []
    plain = lookup = None
    backend = ""
    for name, method in summary["methods"].items():
        overall = method["overall"]
        if not overall.get("questions"):
            continue
        backend = method.get("backend") or backend
        proposer = _PROPOSER.search(method["config"])
        if method.get("plain"):
            plain = overall["ms_per_token"]
            continue
        if proposer is None or proposer.group(1) not in FAMILIES:
            if proposer is not None and proposer.group(1) == "prompt-lookup":
                lookup = overall["speedup"]
            continue
        nodes = tree_nodes(method["config"])
        if nodes is None and "tree=auto" not in method["config"]:  # a chain through every head
            continue
        rows.append(HeadRow(name, proposer.group(1), nodes, overall["ms_per_token"],
                            overall["speedup"], overall["mean_accepted"], tuple(overall["acceptance_by_depth"]),
                            overall["propose_ms_per_round"], overall["rows_verified_mean"], overall["mismatches"]))
    return Run(Path(directory), backend, float(settings["temperature"]), settings["target"], plain, lookup,
               tuple(sorted(rows, key=lambda r: (FAMILIES.index(r.family), _budget_order(r.nodes)))))


def _budget_order(nodes: int | None) -> tuple[bool, int]:
    """Fixed budgets in size order, then tree=auto's default."""
    return nodes is None, nodes or 0


def _budget_label(nodes: int | None) -> str:
    return "auto" if nodes is None else str(nodes)


def _find(rows: list[HeadRow], family: str) -> HeadRow | None:
    return next((r for r in rows if r.family == family), None)


def goal_lines(run: Run) -> list[str]:
    """The issue's goals, each at the same tree budget (budgets where both families ran)."""
    lines = []
    for nodes in sorted({r.nodes for r in run.rows}, key=_budget_order):
        here = [r for r in run.rows if r.nodes == nodes]
        if nodes is None and all(r.rows_verified <= 1.0 for r in here):
            # every auto tree is the bare root: plain decoding with heads loaded, nothing to compare
            lines.append("n=auto: no family's auto tree drafts on this hardware (each ran as plain decoding)")
            continue
        medusa, hydra, plus, clover = (_find(here, f) for f in FAMILIES)
        # auto: each family's own tree for this hardware, so accepted lengths are not at one budget
        parts = [f"n={_budget_label(nodes)}" + (" (each family's own tree):" if nodes is None else ":")]
        if hydra and plus and hydra.mean_accepted > 0:
            parts.append(f"Hydra++/Hydra accepted {plus.mean_accepted / hydra.mean_accepted:.2f}x (goal >= 1.15x);")
        if hydra and clover:
            parts.append(f"Clover accepted {clover.mean_accepted:.2f} vs Hydra {hydra.mean_accepted:.2f} (goal >=)")
            if plus:
                parts.append(f"at head cost {clover.head_ms_per_round:.2f} vs Hydra++ {plus.head_ms_per_round:.2f} "
                             "ms/round (goal lower);")
        if medusa:
            fastest = min(here, key=lambda r: r.ms_per_token)
            parts.append(f"fastest family {fastest.family} is {medusa.ms_per_token / fastest.ms_per_token:.2f}x "
                         "Medusa's time per token (the goal: benchmarks/heads_families/README.md)")
        lines.append(" ".join(parts))
    if run.rows and run.plain_ms_per_token:
        best = min(run.rows, key=lambda r: r.ms_per_token)
        lines.append(f"overall fastest: {best.method}, {run.plain_ms_per_token / best.ms_per_token:.2f}x plain"
                     + (" (goal at temperature 1: > 1x)" if run.temperature > 0 else ""))
    return lines


def run_table(run: Run) -> list[str]:
    out = ["| family | tree budget | ms/token | speedup | mean accepted | acceptance by depth | head ms/round "
           "| rows/round | mismatches |", "|---|---|---|---|---|---|---|---|---|"]
    for r in run.rows:
        depth = " / ".join(f"{a:.2f}" for a in r.acceptance_by_depth[:5]) or "–"
        speed = "–" if r.speedup is None else f"{r.speedup:.2f}"
        out.append(f"| {r.family} | {_budget_label(r.nodes)} | {r.ms_per_token:.1f} | {speed} | {r.mean_accepted:.2f} | {depth} "
                   f"| {r.head_ms_per_round:.2f} | {r.rows_verified:.1f} | {'–' if r.mismatches is None else r.mismatches} |")
    return out


def plot_accepted_vs_cost(run: Run, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for family in FAMILIES:
        rows = [r for r in run.rows if r.family == family and r.nodes is not None]
        if rows:
            ax.plot([r.head_ms_per_round for r in rows], [r.mean_accepted for r in rows], "o-", label=family)
            for r in rows:
                ax.annotate(f"n={r.nodes}", (r.head_ms_per_round, r.mean_accepted), fontsize=7)
    ax.set_xlabel("head cost per round (ms)")
    ax.set_ylabel("mean accepted tokens per round")
    ax.set_title(run.title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_speedup_vs_size(run: Run, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for family in FAMILIES:
        rows = [r for r in run.rows if r.family == family and r.speedup is not None and r.nodes is not None]
        if rows:
            ax.plot([r.nodes for r in rows], [r.speedup for r in rows], "o-", label=family)
    ax.axhline(1.0, color="black", linewidth=0.8)
    if run.lookup_speedup is not None:
        ax.axhline(run.lookup_speedup, color="grey", linestyle="--", linewidth=0.8, label="prompt lookup + gate")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree budget (nodes, root included)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(run.title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_comparison(runs: list[Run], out: Path) -> Path:
    """comparison.md and two plots per run under `out` (none for a run of tree=auto rows only: the
    plots' x axes are fixed budgets)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Head families compared", ""]
    for run in runs:
        stem = run.directory.name  # one pair of plots per run (two machines may run one backend and temperature)
        plots = ""
        if any(r.nodes is not None for r in run.rows):
            accepted = plot_accepted_vs_cost(run, out / f"accepted_vs_head_cost_{stem}.png")
            speedup = plot_speedup_vs_size(run, out / f"speedup_vs_tree_size_{stem}.png")
            plots = f"![accepted vs head cost]({accepted.name}) ![speedup vs tree size]({speedup.name})"
        plain = "–" if run.plain_ms_per_token is None else f"{run.plain_ms_per_token:.1f}"
        lookup = "–" if run.lookup_speedup is None else f"{run.lookup_speedup:.2f}x"
        lines += [f"## {run.title}", "", f"Run: `{run.directory}`. Plain decoding {plain} ms/token; prompt lookup "
                  f"+ gate {lookup}.", "", *run_table(run), "", *(f"- {g}" for g in goal_lines(run)), "",
                  plots, ""]
    path = out / "comparison.md"
    path.write_text("\n".join(lines))
    return path
