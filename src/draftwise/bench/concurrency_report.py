"""report.md's section on the concurrency cells: one table row per (method, B), refusals, exactness."""

from __future__ import annotations

from draftwise.bench.formatting import fmt

CONCURRENCY_DEFINITIONS = """\
**Requests in flight.** Each (method, B) cell decodes the first turn of every question with B
requests in flight, closed loop: B are sent at the start and each time one ends the next is
sent (draftwise: it joins the batch at the next round; transformers' `generate` batches
statically, so `hf-plain` runs padded waves of B and a request waits for its wave, counted in
its TTFT). *Total tok/s*: every request's new tokens over the cell's wall time (median of the
repeats, min-max in parentheses); *x ref*: that over the plain reference's at the same B;
*per-request tok/s*: a request's tokens over its send-to-last-token time, the median request.
*TTFT*: send to first chunk. *ITL* per streamed chunk, as vLLM's benchmark_serving counts it:
the gap between consecutive chunks of a request, where a chunk is what one round published (k
tokens of one round are one gap, not k - 1 extra zero gaps); *TPOT*: (last chunk - first
chunk) / (tokens - 1) per request. Percentiles are numpy's (linear interpolation) over the
cell's requests or pooled gaps, the median over repeats. *KV*: the most the backend held
(allocated, padding included; `generate`'s padded cache computed from its shape) / the
in-flight requests' own rows. *RSS*: the process's resident memory sampled at round
boundaries, every loaded model included. *Exact*: requests whose tokens equal the method's own
single-request answer / the plain reference's (every repeat's requests counted).
"""


def _fmt(value, digits: int = 1) -> str:
    return fmt(value, digits)


def _mb(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:.1f}"


def _exact(check: dict | None) -> str:
    if check is None:
        return "–"
    return f"{check['compared'] - check['mismatches']}/{check['compared']}"


def _row(name: str, batch: str, row: dict) -> str:
    if "refused" in row:
        return f"| {name} | {batch} | refused: {row['refused']} |" + " |" * 9
    rate = (f"{_fmt(row['total_tokens_per_s'], 2)} ({_fmt(row['total_tokens_per_s_min'], 2)}-"
            f"{_fmt(row['total_tokens_per_s_max'], 2)})")
    failed = f", {row['failed_requests']} failed" if row["failed_requests"] else ""
    errors = f", {len(row['errors'])} cell(s) failed" if row["errors"] else ""
    return (f"| {name} | {batch} | {rate} | {_fmt(row['vs_reference'], 2)} | {_fmt(row['request_tokens_per_s'], 2)} "
            f"| {_fmt(row['ttft_p50_ms'], 0)} / {_fmt(row['ttft_p90_ms'], 0)} "
            f"| {_fmt(row['itl_p50_ms'])} / {_fmt(row['itl_p90_ms'])} / {_fmt(row['itl_p99_ms'])} "
            f"| {_fmt(row['tpot_p50_ms'])} | {_mb(row['kv_peak_bytes'])} / {_mb(row['kv_rows_peak_bytes'])} "
            f"| {_mb(row['rss_peak_bytes'])} | {_exact(row['exact_vs_single'])} / {_exact(row['exact_vs_plain'])} "
            f"| {row['repeats']}{failed}{errors} |")


def concurrency_section(summary: dict) -> list[str]:
    table = summary.get("concurrency")
    if not table:
        return []
    lines = ["## Requests in flight (closed loop)", "",
             f"B = {', '.join(str(b) for b in table['levels'])}; first turns of the workload's "
             f"{summary['workload']['questions']} questions per cell; definitions below.", "",
             "| method | B | total tok/s | x ref | per-request tok/s | TTFT p50 / p90 ms | ITL p50 / p90 / p99 ms "
             "| TPOT p50 ms | KV MB (backend / rows) | RSS MB | exact (own single / plain) | repeats |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in table["methods"].items():
        lines += [_row(name, batch, row) for batch, row in rows.items()]
    differ = [f"{name} at B={batch} ({', '.join(row[k]['examples'][:2])})"
              for name, rows in table["methods"].items() for batch, row in rows.items()
              for k in ("exact_vs_single", "exact_vs_plain") if (row.get(k) or {}).get("mismatches")]
    if differ:
        lines += ["", "**Outputs that differ from a single-request answer**: " + "; ".join(differ) + "."]
    return lines + [""]
