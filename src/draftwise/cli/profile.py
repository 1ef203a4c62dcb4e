"""`draftwise profile` and `draftwise oracle`: the target's measured verify cost (or its
kernels' batch invariance), and the exhaustive exactness oracles."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from draftwise.measure.load import load_backend
from draftwise.cli.common import DEFAULTS, DTYPE_HELP, dim, err, fail, int_list, quiet_llama_cpp
from draftwise.errors import DraftwiseError
from draftwise.logs import progress_to



def oracle(as_json: bool = typer.Option(False, "--json")) -> None:
    """Run the exhaustive exactness and optimizer oracles."""
    from draftwise.oracles import run_all

    results = run_all()
    if as_json:
        print(json.dumps([r.__dict__ for r in results], default=float))
    else:
        # the detail says what "pass" means: for the counterexample oracles it is a LARGE deviation
        table = Table("oracle", "computed", "expected", "tolerance", "pass", "detail")
        for r in results:
            table.add_row(r.name, f"{r.computed:.12g}", f"{r.expected:.12g}", f"{r.tolerance:.3g}",
                          "[green]pass[/]" if r.passed else "[red]FAIL[/]", r.detail)
        Console().print(table)
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


def profile(
    target: str = typer.Option(DEFAULTS.target, help="Model whose verify cost to measure."),
    backend: str = typer.Option(DEFAULTS.backend, help="auto | transformers | llamacpp."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores)."),
    dtype: str = typer.Option(DEFAULTS.dtype, help=DTYPE_HELP),
    prefix_len: int = typer.Option(512, help="Committed prefix length the rounds sit on."),
    max_rows: int = typer.Option(64, help="Measure n = 1, 2, 4, ... up to this many rows."),
    rows_list: Optional[str] = typer.Option(None, "--rows", help="Explicit row counts, e.g. 1,2,3,4,6,8 (overrides --max-rows)."),
    repeats: int = typer.Option(5, help="Timed repeats per n (the median is kept)."),
    chain: bool = typer.Option(False, "--chain", help="Time chains of n - 1 candidates (what a sequence proposer verifies) instead of random trees."),
    extend: bool = typer.Option(False, "--extend", help="Time extends of n tokens with the last row's logits only (a draft's catch-up) instead of verifies."),
    invariance: bool = typer.Option(False, "--invariance", help="Instead of timing, probe whether verify rows (chains and trees of --rows sizes after --prefixes) are bit-identical to plain decoding's rows, and save an invariance_probe artifact."),
    prefixes: str = typer.Option("40,256,700", help="--invariance: committed prefix lengths to probe at."),
    strict: Optional[str] = typer.Option(None, "--strict", help="llama.cpp with the strict kernels for chains or trees (see `generate --strict`)."),
    out: str = typer.Option(..., help="Directory for the verify_profile (or invariance_probe) artifact."),
) -> None:
    """Measure t(n)/t(1), the target's verify time for n rows, and save it as an artifact."""
    from pathlib import Path

    from draftwise.measure.profile import write_profile

    quiet_llama_cpp()
    if strict is not None and strict not in ("chains", "trees"):
        fail(f"--strict {strict!r}: choose chains or trees")
    _check_out(Path(out), invariance)
    if invariance:
        _probe_invariance(target, backend, threads, dtype, strict, rows_list, max_rows, prefixes, Path(out))
        return
    if rows_list:
        rows = tuple(sorted(set(int_list(rows_list, "--rows"))))
        if rows[0] < 1:
            fail(f"--rows {rows_list!r}: a round verifies at least 1 row")
            return
        if rows[0] != 1:
            fail("--rows must include 1: t(n) is relative to a plain decoding step")
            return
    else:
        rows = tuple(2**i for i in range(max_rows.bit_length()) if 2**i <= max_rows)
    for value, name in ((prefix_len, "--prefix-len"), (repeats, "--repeats"), (max_rows, "--max-rows")):
        if value < 1:
            fail(f"{name} must be >= 1, got {value}")
            return
    try:
        with progress_to(dim):
            target_backend = load_backend(target, backend, threads, dtype=dtype, strict=strict)
        with progress_to(lambda m: err.print(m, markup=False, highlight=False)):
            result = write_profile(target_backend, Path(out), prefix_len=prefix_len, rows=rows, repeats=repeats,
                                   chain=chain, extend=extend)
    except (DraftwiseError, OSError) as exc:
        fail(str(exc))
        return
    info = target_backend.info
    table = Table("rows", "median s", "t(n)/t(1)", title=f"{info.checkpoint} ({info.name}, {info.dtype})")
    for n, absolute, relative in zip(result.rows, result.absolute_s, result.relative):
        table.add_row(str(n), f"{absolute:.5f}", f"{relative:.3f}")
    Console().print(table)


def _check_out(out, invariance: bool) -> None:
    """--out refused before a model is loaded or a row is timed (a regular file, a foreign directory)."""
    from draftwise.artifacts import check_out

    try:
        check_out(out, "invariance_probe" if invariance else "verify_profile")
    except DraftwiseError as exc:
        fail(str(exc))


def _probe_invariance(target: str, backend: str, threads: int | None, dtype: str, strict: str | None,
                      rows_list: str | None, max_rows: int, prefixes: str, out) -> None:
    from draftwise.measure.invariance import DEFAULT_PREFIXES, DEFAULT_SIZES, SHAPES, cached_probe, probe_invariance
    from draftwise.bench.plots import plot_invariance

    sizes = int_list(rows_list, "--rows") if rows_list else tuple(n for n in DEFAULT_SIZES if n <= max_rows)
    lengths = int_list(prefixes, "--prefixes")
    try:
        with progress_to(dim):
            loaded = load_backend(target, backend, threads, dtype=dtype, strict=strict)
        with progress_to(lambda m: err.print(m, markup=False, highlight=False)):
            shapes = ("chain",) if strict == "chains" else SHAPES  # chain kernels are exact for chains only
            if (sizes, lengths) == (DEFAULT_SIZES, DEFAULT_PREFIXES):  # the cached one (a strict load probed it)
                probe = cached_probe(loaded, shapes=shapes)
            else:
                probe = probe_invariance(loaded, prefixes=lengths, sizes=sizes, shapes=shapes)
        probe.save(out)
    except (DraftwiseError, OSError) as exc:
        fail(str(exc))
        return
    plot_invariance([probe], out / "invariance.png")
    table = Table("prefix", "shape", "rows", "max |logit difference|", title=f"{probe.model} ({probe.kernels})")
    for case in probe.cases:
        table.add_row(str(case.prefix_len), case.shape, str(case.rows),
                      "bit-identical" if case.max_abs_diff == 0.0 else f"{case.max_abs_diff:.4g}")
    Console().print(table)
    Console().print(probe.statement())
