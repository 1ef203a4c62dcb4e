"""`draftwise index ...`: build, describe and verify REST retrieval datastores.

A typer sub-app; the main CLI mounts it with `app.add_typer(index_app, name="index")`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from draftwise.errors import DraftwiseError
from draftwise.data import SPEC_BENCH_DEV, spec_bench_questions
from draftwise.proposers.retrieval.corpus import DEFAULT_SUFFIXES, CorpusError, load_encoder, resolve_source
from draftwise.proposers.retrieval.exclusion import NGRAM, NgramFilter, load_eval_set
from draftwise.proposers.retrieval.index import build_index, index_info, verify_index
from draftwise.proposers.retrieval.query import QueryConfig

index_app = typer.Typer(help="REST retrieval datastores: build, info, verify.", no_args_is_help=True)
_DEFAULT = QueryConfig()


def _fail(console: Console, message: str) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(1)


@index_app.command()
def build(
    corpus: List[str] = typer.Option(..., "--corpus", help="file, directory tree, .jsonl, ShareGPT .json, or 'sharegpt'"),
    target: str = typer.Option(..., "--target", help="target model: its tokenizer tokenizes the corpus"),
    out: Path = typer.Option(..., "--out", help="index directory to create"),
    exclude: List[str] = typer.Option([], "--exclude", help="'humaneval', 'spec-bench' (the packaged dev split) or a Spec-Bench-format JSONL"),
    suffix: List[str] = typer.Option(list(DEFAULT_SUFFIXES), "--suffix", help="file suffixes read from directories"),
    text_field: str = typer.Option("text", help="JSONL field holding the text"),
    max_suffix: int = typer.Option(_DEFAULT.max_suffix, help="longest context suffix a query tries"),
    min_suffix: int = typer.Option(_DEFAULT.min_suffix, help="shortest context suffix a query accepts"),
    max_matches: int = typer.Option(_DEFAULT.max_matches, help="continuations retrieved per query"),
    continuation_length: int = typer.Option(_DEFAULT.continuation_length, help="tokens per continuation"),
    ngram: int = typer.Option(NGRAM, help="exclusion n-gram length in target tokens"),
    force: bool = typer.Option(False, "--force", help="replace an existing index at --out"),
) -> None:
    """Tokenize corpora with the target's tokenizer and build a suffix-array index."""
    console = Console(stderr=True)
    try:
        config = QueryConfig(max_suffix, min_suffix, max_matches, continuation_length)
        sources = [resolve_source(c, text_field, suffix) for c in corpus]
        eval_sets = [load_eval_set(str(spec_bench_questions()) if e == SPEC_BENCH_DEV else e) for e in exclude]
        if not any(source.total_bytes() for source in sources):  # fail before the slow tokenizer load
            raise CorpusError("the corpus is empty (0 bytes of matching files); refusing an empty index")
        console.print(f"loading the tokenizer of {target}")
        encoder = load_encoder(target)
        exclusion = NgramFilter.from_eval_sets(eval_sets, encoder, ngram) if eval_sets else None
        report = build_index(sources, encoder, out, exclusion, config, overwrite=force)
    except DraftwiseError as exc:
        _fail(console, str(exc))
    console.print(
        f"{report.directory}: {report.tokens:,} tokens in {report.documents:,} documents "
        f"({report.excluded:,} excluded); tokenize {report.tokenize_seconds:.1f} s, "
        f"suffix array {report.suffix_array_seconds:.1f} s; {report.disk_bytes / max(report.tokens, 1):.2f} bytes/token"
    )


@index_app.command()
def info(directory: Path = typer.Argument(..., help="index directory"),
         as_json: bool = typer.Option(False, "--json", help="print the whole manifest as JSON")) -> None:
    """Print an index's manifest: corpus snapshot, tokenizer, exclusion, layout, policies."""
    console = Console()
    try:
        details = index_info(directory)
    except DraftwiseError as exc:
        _fail(Console(stderr=True), str(exc))
    if as_json:
        print(json.dumps(details, indent=2, sort_keys=True, default=str))
        return
    console.print(f"[bold]{directory}[/bold]  manifest {details['hash'][:16]}…")
    tok, totals = details["tokenizer"], details["totals"]
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("tokenizer", f"{tok['name']}  vocab {tok['vocab_size']}  hash {tok['hash'][:16]}…")
    summary.add_row("documents", f"{totals['documents']:,}   tokens {totals['tokens']:,}")
    exclusion = details.get("exclusion")
    if exclusion:
        names = escape(", ".join(s["name"] for s in exclusion["eval_sets"]))
        summary.add_row("exclusion", f"{exclusion['ngram_tokens']}-token n-grams of {names}: "
                                     f"{exclusion['excluded_documents']:,} documents dropped")
    summary.add_row("query", escape(str(details["query"])))
    summary.add_row("encoding", f"{details['key_encoding']}; separator {details['separator']}; "
                                f"{details['endianness']}-endian")
    summary.add_row("counter", f"{details['counter']['dtype']}; pruning: {details['trie']['pruning']}")
    console.print(summary)

    corpus = Table("corpus", "files", "bytes", "documents", "excluded", "sha256", title="corpus snapshot")
    for column in corpus.columns[1:5]:
        column.justify = "right"
    for source in details["corpus"]:
        corpus.add_row(escape(source["spec"]), str(source.get("files", "-")), f"{source.get('bytes', 0):,}",
                       f"{source['documents']:,}", f"{source['excluded']:,}", f"{str(source.get('sha256', ''))[:16]}…")
    console.print(corpus)
    for source in details["corpus"]:
        for warning in source.get("warnings", []):
            console.print(f"[yellow]warning:[/yellow] {escape(source['spec'])}: {escape(warning)}")

    files = Table("file", "bytes", "sha256", title="files")
    files.columns[1].justify = "right"
    for name, digest in details["files"].items():
        files.add_row(escape(name), f"{details['file_bytes'].get(name, 0):,}", f"{digest[:16]}…")
    console.print(files)


@index_app.command()
def verify(directory: Path = typer.Argument(..., help="index directory")) -> None:
    """Re-check every file's sha256 and size against the manifest."""
    console = Console()
    try:
        manifest = verify_index(directory)
    except DraftwiseError as exc:
        _fail(Console(stderr=True), f"verification failed: {exc}")
    console.print(f"ok: {len(manifest.files)} files match manifest {manifest.hash[:16]}…")
