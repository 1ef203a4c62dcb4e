"""Benchmark the REST datastore: build cost, size, and query + trie + prune latency.

    nice -n 10 python benchmarks/rest_index/bench_index.py build --which code
    nice -n 10 python benchmarks/rest_index/bench_index.py build --which chat
    python benchmarks/rest_index/bench_index.py query          # both indexes, budgets 8/16/32/64
    python benchmarks/rest_index/bench_index.py table          # markdown for README.md

Indexes go to ~/.cache/draftwise/indexes/{code,chat} (never into git); numbers are merged
into results.json of benchmarks/rest_index/runs/<machine>-<date>/ (--results overrides;
`table` reads the newest run's).  Tokenizer: Qwen2.5-Coder-1.5B's.  Both datastores
exclude HumanEval and the Spec-Bench development split.

Queries: contexts cut at random positions of held-out text (HumanEval problems 0-79,
prompt + canonical solution, for code; Spec-Bench turns for chat); the text that really
follows gives an oracle acceptance length (longest trie path equal to it), a cheap proxy
for what greedy verification would accept when the target reproduces the reference.
"""

from __future__ import annotations

import subprocess
import argparse
import gzip
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

from draftwise.data import spec_bench_questions
from draftwise.proposers.retrieval.corpus import load_encoder, resolve_source
from draftwise.proposers.retrieval.exclusion import NgramFilter, humaneval_path, load_eval_set
from draftwise.proposers.retrieval.index import RestIndex, build_index
from draftwise.proposers.retrieval.query import retrieve
from draftwise.proposers.retrieval.trie import build_trie, prune

TARGET = "qwen2.5-coder-1.5b"
ROOT = Path.home() / ".cache" / "draftwise" / "indexes"
SPEC_BENCH = spec_bench_questions()  # the development split shipped in the package
BUDGETS = (8, 16, 32, 64)


# the venv and the system stdlib hold ~48M Qwen tokens of Python; these packages of another
# interpreter on this machine (absent from the venv) bring the datastore past 50M
EXTRA_PACKAGES = Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages")
EXTRA = ("moto", "cfnlint", "libcst", "IPython")


def code_dirs() -> list[str]:
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    stdlib = Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")
    extra = [EXTRA_PACKAGES / name for name in EXTRA]
    return [str(p) for p in (site, stdlib, *extra) if p.is_dir()]


def build(which: str) -> dict:
    load_at_start = os.getloadavg()[0]  # other jobs on these shared cores slow every rate below
    encoder = load_encoder(TARGET)
    exclusion = NgramFilter.from_eval_sets([load_eval_set("humaneval"), load_eval_set(str(SPEC_BENCH))], encoder)
    corpora = code_dirs() if which == "code" else ["sharegpt"]
    sources = [resolve_source(c) for c in corpora]
    report = build_index(sources, encoder, ROOT / which, exclusion, overwrite=True)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    index = RestIndex.open(ROOT / which, verify=True)
    verified_load = time.perf_counter() - started
    started = time.perf_counter()
    RestIndex.open(ROOT / which, verify=False)
    fast_load = time.perf_counter() - started
    return {
        "corpora": corpora,
        "documents": report.documents,
        "excluded_documents": report.excluded,
        "tokens": report.tokens,
        "tokenize_seconds": round(report.tokenize_seconds, 2),
        "tokenize_tokens_per_s": round(report.tokens / report.tokenize_seconds),
        "suffix_array_seconds": round(report.suffix_array_seconds, 2),
        "index_tokens_per_s": round(report.stream_length / report.suffix_array_seconds),
        "total_build_seconds": round(report.total_seconds, 2),
        "disk_bytes": report.disk_bytes,
        "disk_bytes_per_token": round(report.disk_bytes / report.tokens, 3),
        "mapped_bytes_per_token": round(index.memory_bytes() / report.tokens, 3),
        "build_peak_rss_bytes": peak_rss,
        "load_seconds_verified": round(verified_load, 3),
        "load_seconds_unverified": round(fast_load, 4),
        "built_on": time.strftime("%Y-%m-%d"),
        "load_average_at_start": round(load_at_start, 2),
    }


def held_out_texts(which: str) -> list[str]:
    if which == "code":
        with gzip.open(humaneval_path(), "rt") as handle:
            problems = [json.loads(line) for line in handle][:80]  # development split 0-79
        return [p["prompt"] + p["canonical_solution"] for p in problems]
    records = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    return [t for r in records for t in r["turns"]]


def oracle_accept(trie, truth: list[int]) -> int:
    """Longest path of the trie that equals the start of `truth` (greedy acceptance proxy)."""
    node, accepted = -1, 0
    for token in truth:
        nxt = [i for i in trie.children(node) if trie.tokens[i] == token]
        if not nxt:
            break
        node, accepted = nxt[0], accepted + 1
    return accepted


def query(which: str, n_queries: int, seed: int = 0) -> dict:
    encoder = load_encoder(TARGET)
    index = RestIndex.open(ROOT / which, verify=False)
    config = index.query_config
    rng = np.random.default_rng(seed)
    docs = [ids for ids in encoder.encode_batch(held_out_texts(which)) if len(ids) > 24]
    cases = []
    for _ in range(n_queries):
        ids = docs[rng.integers(len(docs))]
        cut = int(rng.integers(16, len(ids) - config.continuation_length))
        cases.append((ids[:cut], ids[cut : cut + config.continuation_length]))
    cold = [_timed(index, ctx, 64)[0][0] for ctx, _ in cases]  # first touch of the mapped pages
    out = {"queries": n_queries, "query_config": config.__dict__,
           "cold_pass_wall_ms": {"p50": _pct(cold, 50), "p99": _pct(cold, 99)}}
    for budget in BUDGETS:
        times, cpu, lengths, sizes, kept, accepted, misses = [], [], [], [], [], [], 0
        for ctx, truth in cases:
            (seconds, cpu_seconds), match, trie, pruned = _timed(index, ctx, budget)
            times.append(seconds)
            cpu.append(cpu_seconds)
            sizes.append(trie.size)
            kept.append(pruned.size)
            misses += pruned.size == 0
            if match.length:
                lengths.append(match.length)
            accepted.append(oracle_accept(pruned, truth))
        out[f"budget_{budget}"] = {
            "wall_p50_ms": _pct(times, 50), "wall_p99_ms": _pct(times, 99),
            "cpu_p50_ms": _pct(cpu, 50), "cpu_p99_ms": _pct(cpu, 99), "cpu_mean_ms": round(float(np.mean(cpu)) * 1e3, 4),
            "miss_rate": round(misses / n_queries, 4), "mean_match_length": round(float(np.mean(lengths)), 3),
            "mean_trie_nodes": round(float(np.mean(sizes)), 2), "mean_kept_nodes": round(float(np.mean(kept)), 2),
            "mean_oracle_accepted": round(float(np.mean(accepted)), 3),
        }
    return out


def _timed(index: RestIndex, context: list[int], budget: int):
    """Wall and CPU seconds of query + trie + prune.  On this shared 2-core machine the wall
    clock's tail is preemption by other jobs; the thread's CPU time is what the code costs."""
    started, cpu = time.perf_counter(), time.thread_time()
    match, rows = retrieve(index.arrays, context, index.query_config)
    trie = build_trie(rows)
    pruned = prune(trie, budget)
    return (time.perf_counter() - started, time.thread_time() - cpu), match, trie, pruned


def _pct(seconds: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(seconds) * 1e3, q)), 4)


def default_run_dir(variant: str = "") -> Path:
    """benchmarks/<this study>/runs/<machine>-<date>[-VARIANT], named by benchmarks/peers/run_dir.sh."""
    here = Path(__file__).resolve().parent
    name = subprocess.run(["bash", str(here.parent / "peers" / "run_dir.sh"), here.name, *([variant] if variant else [])],
                          capture_output=True, text=True, check=True).stdout.strip()
    return here.parents[1] / name


def save(section: str, which: str, numbers: dict, path: Path) -> None:
    results = json.loads(path.read_text()) if path.is_file() else {}
    results.setdefault(section, {})[which] = numbers
    # merged, so a note on how earlier builds ran stays with them
    results["machine"] = {**results.get("machine", {}), "cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": platform.python_version()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def table(path: Path) -> str:
    """Markdown tables of results.json (pasted into README.md)."""
    results = json.loads(path.read_text())
    lines = ["| datastore | documents (excluded) | tokens | tokenize tok/s | index tok/s | build s | disk B/tok | mapped B/tok | verified load s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for which, b in results.get("build", {}).items():
        lines.append(f"| {which} | {b['documents']:,} ({b['excluded_documents']}) | {b['tokens']:,} | "
                     f"{b['tokenize_tokens_per_s']:,} | {b['index_tokens_per_s']:,} | {b['total_build_seconds']:.0f} | "
                     f"{b['disk_bytes_per_token']:.2f} | {b['mapped_bytes_per_token']:.2f} | {b['load_seconds_verified']:.2f} |")
    lines += ["", "| datastore | node budget | CPU p50 ms | CPU p99 ms | wall p50 ms | wall p99 ms | miss rate | "
              "mean match len | trie nodes before / after | oracle accepted |", "|---|---|---|---|---|---|---|---|---|---|"]
    for which, q in results.get("query", {}).items():
        for budget in BUDGETS:
            r = q[f"budget_{budget}"]
            lines.append(f"| {which} | {budget} | {r['cpu_p50_ms']:.2f} | {r['cpu_p99_ms']:.2f} | {r['wall_p50_ms']:.2f} | "
                         f"{r['wall_p99_ms']:.2f} | {r['miss_rate']:.3f} | {r['mean_match_length']:.2f} | "
                         f"{r['mean_trie_nodes']:.0f} / {r['mean_kept_nodes']:.1f} | {r['mean_oracle_accepted']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["build", "query", "table"])
    parser.add_argument("--which", choices=["code", "chat", "both"], default="both")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--results", type=Path, help="results.json to merge into or read "
                        "(default: this machine's run of today; for table, the newest run's)")
    args = parser.parse_args()
    if args.step == "table":
        print(table(args.results or max(Path(__file__).parent.glob("runs/*/results.json"), key=lambda p: p.stat().st_mtime)))
        return
    for which in (["code", "chat"] if args.which == "both" else [args.which]):
        numbers = build(which) if args.step == "build" else query(which, args.queries)
        print(json.dumps({which: numbers}, indent=2))
        save(args.step, which, numbers, args.results or default_run_dir() / "results.json")


if __name__ == "__main__":
    main()
