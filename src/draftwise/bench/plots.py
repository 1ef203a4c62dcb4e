"""PNG plots from summary.json (matplotlib, Agg: no display on these machines)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from draftwise.runtime.stats import PHASES  # noqa: E402


def _ran(summary: dict) -> dict[str, dict]:
    return {name: m for name, m in summary["methods"].items() if m["overall"]["questions"]}


def plot_speedup(summary: dict, path: Path) -> Path | None:
    methods = {n: m for n, m in _ran(summary).items() if m["overall"]["speedup"] is not None}
    categories = summary["workload"]["categories"] + ["overall"]
    if not methods:
        return None
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories) + 2), 4))
    x = np.arange(len(categories))
    for i, (name, m) in enumerate(methods.items()):
        values = [m["overall"]["speedup"] if c == "overall" else (m["categories"].get(c) or {}).get("speedup")
                  for c in categories]
        # a category the method has no speedup for gets no bar (NaN), not a bar of height zero
        ax.bar(x + i * width, [np.nan if v is None else v for v in values], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x + width * (len(methods) - 1) / 2, categories, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain (same backend)")
    ax.set_title("Speedup per category")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars stay visible
    return _save(fig, path)


def plot_accepted_histogram(summary: dict, path: Path) -> Path | None:
    methods = {n: m["overall"]["accepted_histogram"] for n, m in _ran(summary).items()
               if m["overall"]["accepted_histogram"] and len(m["overall"]["accepted_histogram"]) > 1}
    if not methods:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, histogram in methods.items():
        counts = np.asarray(histogram, dtype=np.float64)
        ax.plot(np.arange(len(counts)), counts / counts.sum(), marker="o", label=name)
    ax.set_xlabel("accepted draft tokens in a step")
    ax.set_ylabel("fraction of steps")
    ax.set_title("Accepted length distribution")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars stay visible
    return _save(fig, path)


def plot_acceptance_by_depth(summary: dict, path: Path) -> Path | None:
    methods = {n: m["overall"]["acceptance_by_depth"] for n, m in _ran(summary).items()
               if m["overall"]["acceptance_by_depth"]}
    if not methods:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rates in methods.items():
        known = [np.nan if r is None else r for r in rates]  # None: depth never offered, left as a gap
        ax.plot(np.arange(1, len(rates) + 1), known, marker="o", label=name)
    ax.set_xlabel("depth")
    ax.set_ylabel("P(accepted | offered, parent accepted)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by depth")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars stay visible
    return _save(fig, path)


def plot_speedup_grid(points: list[dict], path: Path, title: str = "", depth_label: str = "d=") -> Path:
    """Measured (solid) and predicted (dashed) speedup against tree size n, one line per depth d:
    issue 7's grid plot.  `points`: dicts with n, d, measured_speedup, predicted_speedup."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d in sorted({p["d"] for p in points}):
        line = sorted((p for p in points if p["d"] == d), key=lambda p: p["n"])
        n = [p["n"] for p in line]
        drawn, = ax.plot(n, [p["measured_speedup"] for p in line], "o-", label=f"measured, {depth_label}{d}")
        ax.plot(n, [p["predicted_speedup"] for p in line], "x--", color=drawn.get_color(),
                label=f"predicted, {depth_label}{d}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree size n (rows a full round verifies, root included)")
    ax.set_ylabel("speedup over plain decoding")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_time_split(summary: dict, path: Path) -> Path | None:
    """Stacked ms per committed token; peers have no phases, so they show one 'total' bar."""
    methods = _ran(summary)
    if not methods:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(methods) + 2), 4))
    names = list(methods)
    bottom = np.zeros(len(names))
    for phase in (*PHASES, "other"):
        values = np.array([(m["overall"]["time_split_ms"] or {}).get(phase, 0.0) for m in methods.values()])
        ax.bar(names, values, bottom=bottom, label=phase)
        bottom += values
    totals = np.array([m["overall"]["ms_per_token"] if not m["overall"]["time_split_ms"] else 0.0
                       for m in methods.values()])
    ax.bar(names, totals, bottom=bottom, label="total (no phase data)", color="lightgray")
    ax.set_ylabel("ms per committed token")
    ax.set_title("Time per committed token, by phase")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars stay visible
    return _save(fig, path)


def _measured(summary: dict) -> dict[str, dict[int, dict]]:
    """method -> B -> its concurrency row, for the (method, B) cells that were measured (not refused)."""
    table = (summary.get("concurrency") or {}).get("methods", {})
    return {name: {int(b): row for b, row in rows.items() if row.get("total_tokens_per_s") is not None}
            for name, rows in table.items()
            if any(row.get("total_tokens_per_s") is not None for row in rows.values())}


def plot_throughput_vs_batch(summary: dict, path: Path) -> Path | None:
    """Total tok/s (median of the repeats, bars from min to max) against B, one line per method."""
    methods = _measured(summary)
    if not methods:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in methods.items():
        batches = sorted(rows)
        median = np.array([rows[b]["total_tokens_per_s"] for b in batches])
        spread = [median - np.array([rows[b]["total_tokens_per_s_min"] for b in batches]),
                  np.array([rows[b]["total_tokens_per_s_max"] for b in batches]) - median]
        ax.errorbar(batches, median, yerr=spread, marker="o", capsize=3, label=name)
    levels = summary["concurrency"]["levels"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(b) for b in levels])
    ax.set_xlabel("requests in flight (B, closed loop)")
    ax.set_ylabel("committed tokens / s, all requests")
    ax.set_title("Throughput vs batch size (median of repeats, min-max bars)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_itl_cdf(summary: dict, path: Path) -> Path | None:
    """The inter-token latency CDF (gaps between a request's chunks) of every method, one panel per B."""
    methods = _measured(summary)
    levels = [b for b in (summary.get("concurrency") or {}).get("levels", [])
              if any(rows.get(b, {}).get("itl_cdf_ms") for rows in methods.values())]
    if not levels:
        return None
    fig, axes = plt.subplots(1, len(levels), figsize=(3.2 * len(levels) + 1.5, 3.6), sharey=True, squeeze=False)
    colors = {name: f"C{i % 10}" for i, name in enumerate(methods)}  # one colour per method in every panel
    for ax, batch in zip(axes[0], levels):
        for name, rows in methods.items():
            cdf = rows.get(batch, {}).get("itl_cdf_ms")
            if cdf:
                ax.plot(cdf, np.linspace(0, 1, len(cdf)), color=colors[name])
        ax.set_xlim(left=0)  # linear: a panel's gaps span less than a decade, which a log axis leaves unlabelled
        ax.set_title(f"B = {batch}", fontsize=9)
        ax.set_xlabel("ITL, ms (per chunk)")
    axes[0][0].set_ylabel("fraction of gaps")
    handles = [plt.Line2D([], [], color=color, label=name) for name, color in colors.items()]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_plots(summary: dict, root: Path) -> list[Path]:
    made = [
        plot_speedup(summary, root / "speedup_by_category.png"),
        plot_accepted_histogram(summary, root / "accepted_length_histogram.png"),
        plot_acceptance_by_depth(summary, root / "acceptance_by_depth.png"),
        plot_time_split(summary, root / "time_split.png"),
        plot_throughput_vs_batch(summary, root / "throughput_vs_batch.png"),
        plot_itl_cdf(summary, root / "itl_cdf.png"),
    ]
    return [p for p in made if p is not None]


def _short_kernels(kernels: str) -> str:
    """A legend-sized form of `LlamaCppKernels.describe()` (every field kept: they tell sets apart)."""
    for long, short in (("flash attention", "FA"), ("repacked weights", "repack"), ("decodes of >= ", ">="),
                        (" row(s)", " rows"), ("rejected tree cells kept", "cells kept")):
        kernels = kernels.replace(long, short)
    return kernels


def plot_invariance(probes: list, path: Path) -> Path:
    """Largest |logit difference| between verify rows and plain decoding's rows against the row
    count, one line per (probe, prefix length, shape); bit-identical cases sit on the floor line."""
    fig, ax = plt.subplots(figsize=(7, 4))
    floor = 1e-3  # a log axis cannot show 0: bit-identical cases are drawn here
    for probe in probes:
        for prefix in sorted({c.prefix_len for c in probe.cases}):
            for shape, style in (("chain", "-o"), ("tree", "--s")):
                cases = sorted((c for c in probe.cases if c.prefix_len == prefix and c.shape == shape), key=lambda c: c.rows)
                if cases:
                    ax.plot([c.rows for c in cases], [max(c.max_abs_diff, floor) for c in cases], style, markersize=3,
                            label=f"{_short_kernels(probe.kernels)}, P={prefix}, {shape}" if len(probes) > 1
                            else f"prefix {prefix}, {shape}")
    ax.axhline(floor, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yscale("log")
    ax.set_xlabel("rows in the verify batch (pending included)")
    ax.set_ylabel("max |logit difference| vs plain (floor = bit-identical)")
    ax.set_title("Batch invariance: " + ", ".join(sorted({p.model.split("/")[-1][:40] for p in probes})), fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_search_history(history: list[dict], baselines: dict[str, float], path: Path,
                        title: str = "Skip-set search") -> Path:
    """f(z) per trial, the best so far, and the baselines' f (plain decoding, every other layer):
    the skip search's course, from its `history.json` and its manifest's baselines."""
    done = [t for t in history if t.get("f") is not None]
    trials = [t["trial"] for t in done]
    values = [t["f"] * 1000 for t in done]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(trials, values, "o", markersize=4, label="trial f(z)")
    ax.step(trials, np.minimum.accumulate(values), where="post", label="best so far")
    for (name, f), style in zip(sorted(baselines.items()), ("--", ":", "-.")):
        ax.axhline(f * 1000, linestyle=style, color="gray", label=f"{name} ({f * 1000:.0f} ms)")
    ax.set_xlabel("trial")
    ax.set_ylabel("ms per committed token (dev prompts)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)
