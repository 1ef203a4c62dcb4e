"""The serving benchmark's PNGs (matplotlib, Agg: these machines have no display):
output tok/s against concurrency (closed loop) and against request rate (open loop), one line
per server; TTFT and ITL CDFs at the highest closed-loop concurrency, repeats pooled."""

from __future__ import annotations

from typing import Any, Callable

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from draftwise.bench.serving.loadgen import CLOSED, OPEN, RequestRecord  # noqa: E402
from draftwise.bench.serving.metrics import itl, ttft  # noqa: E402
from draftwise.bench.serving.summary import Row  # noqa: E402


def write_plots(out: Path, results: dict[str, Any], rows: list[Row]) -> list[Path]:
    made = [_throughput(rows, CLOSED, out / "throughput_concurrency.png"),
            _throughput(rows, OPEN, out / "throughput_rate.png")]
    closed = [c for c in results["cells"] if c["mode"] == CLOSED]
    if closed:
        top = max(c["value"] for c in closed)
        at_top = [c for c in closed if c["value"] == top]
        made.append(_cdf(at_top, lambda r: [ttft(r)], f"TTFT, ms (c={int(top)})", out / "ttft_cdf.png"))
        made.append(_cdf(at_top, itl, f"inter-token latency, ms (c={int(top)})", out / "itl_cdf.png"))
    return [p for p in made if p is not None]


def _throughput(rows: list[Row], mode: str, path: Path) -> Path | None:
    mine = [r for r in rows if r.mode == mode]
    if not mine:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for server in dict.fromkeys(r.server for r in mine):
        line = sorted((r for r in mine if r.server == server), key=lambda r: r.value)
        ax.errorbar([r.value for r in line], [r.output_tok_s for r in line],
                    yerr=[[r.output_tok_s - r.output_tok_s_min for r in line],
                          [r.output_tok_s_max - r.output_tok_s for r in line]], marker="o", capsize=3, label=server)
    values = sorted({r.value for r in mine})
    if mode == CLOSED:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(int(v)) for v in values])
    ax.set_xlabel("concurrent requests (closed loop)" if mode == CLOSED else "request rate, req/s (Poisson)")
    ax.set_ylabel("output tokens / s (all requests)")
    ax.legend()
    return _save(fig, path)


def _cdf(cells: list[dict[str, Any]], values: Callable[[RequestRecord], list[float]], label: str,
         path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for server in dict.fromkeys(c["server"] for c in cells):
        records = [RequestRecord.from_json(r) for c in cells if c["server"] == server for r in c["requests"]]
        data = np.sort([v for r in records if r.ok for v in values(r)]) * 1e3
        if data.size:
            ax.plot(data, np.arange(1, data.size + 1) / data.size, label=server)
    ax.set_xlabel(label)
    ax.set_ylabel("fraction")
    ax.legend()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
