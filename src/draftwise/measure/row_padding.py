"""Measuring the row-padding plan (`backends/row_padding.py`) of a transformers backend.

A verify forward computes logits for every row, so its LM head is one matrix product of M rows
by the vocabulary.  A CPU BLAS does not price M smoothly: a row count that the kernel does not
block evenly can take longer than a larger one that it does, so a forward of a few rows can cost
more than one of a few more (`benchmarks/row_padding/` has the measured counts).  Rows are what
speculation buys with, so the rows a round can afford follow these steps.

Measured here: the seconds of the matrix products of a forward of M rows, M = 1 .. `max_rows`
(the LM head over every row, as a verify reads them all out, and each layer's linear layers);
`RowPadding` pads a forward of M rows to the M' >= M whose products measured fastest, where that
is at least `margin` faster.  Measured once per checkpoint, dtype, threads, machine and torch
version (a few seconds: the products alone, which a whole forward's other costs would only blur),
and cached as an artifact; a measurement whose repeats varied more than the noise limit is used
for that run and measured again next time.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.artifacts import read_manifest, stable_hash, staged_artifact, write_manifest
from draftwise.backends.row_padding import RowPadding
from draftwise.errors import ArtifactError, InputError
from draftwise.timing import DEFAULT_MAX_CV

log = logging.getLogger(__name__)

ARTIFACT_KIND = "row_padding"
DEFAULT_MAX_ROWS = 24  # a prompt-lookup chain of 10 is 11 rows, the gate's and planner's trees stay under 24
MEASURED_AS = "products of a forward, fastest of 5 passes"  # in the cache key: another method, another plan


def measure_products(model: Any, max_rows: int = DEFAULT_MAX_ROWS, passes: int = 5) -> tuple[tuple[float, ...], float]:
    """Seconds of the matrix products of a forward of M rows, M = 1 .. max_rows: the LM head
    over M rows plus every linear layer of the first decoder layer over M rows, times the number
    of layers (the products are what a BLAS prices by M; the rest of a forward grows smoothly
    with M).  The fastest of `passes` interleaved passes after one untimed (a shared machine only
    ever adds time: the floor is the kernel's own price, where a median moves with the load);
    also the median over M of the passes' coefficient of variation (the noise of the measurement)."""
    import torch
    from torch import nn

    head = model.get_output_embeddings()
    layers = model.model.layers
    linears = [m for m in layers[0].modules() if isinstance(m, nn.Linear)]
    dtype, device = head.weight.dtype, head.weight.device
    inputs = {m: {lin: torch.randn((1, m, lin.in_features), dtype=dtype, device=device) for lin in [head, *linears]}
              for m in range(1, max_rows + 1)}
    samples: dict[int, list[float]] = {m: [] for m in range(1, max_rows + 1)}
    order = np.random.default_rng(0)
    with torch.inference_mode():
        for sweep in range(passes + 1):
            for m in (range(1, max_rows + 1) if sweep == 0 else 1 + order.permutation(max_rows)):
                x = inputs[int(m)]
                start = time.perf_counter()
                head(x[head])
                at_head = time.perf_counter()
                for lin in linears:
                    lin(x[lin])
                done = time.perf_counter()
                if sweep:
                    samples[int(m)].append((at_head - start) + len(layers) * (done - at_head))
    floors = tuple(float(np.min(samples[m])) for m in range(1, max_rows + 1))
    cvs = [float(np.std(s, ddof=1) / np.mean(s)) for s in samples.values() if len(s) > 1]
    return floors, float(np.median(cvs)) if cvs else 0.0


def row_padding_key(checkpoint: str, dtype: str, threads: int, device: str, max_rows: int) -> dict:
    """What the measurement depends on: the weights and their type, the threads, the machine and torch."""
    import torch

    from draftwise.measure.profile import machine_description

    return {"checkpoint": checkpoint, "dtype": dtype, "threads": int(threads), "device": device,
            "machine": machine_description(), "torch": torch.__version__, "max_rows": int(max_rows),
            "measured_as": MEASURED_AS}


def cached_row_padding(directory: Path, key: dict) -> RowPadding | None:
    """The measurement recorded in `directory` for exactly `key`; None if absent, corrupt or foreign."""
    try:
        provenance = read_manifest(directory, kind=ARTIFACT_KIND).provenance
        if provenance.get("key") != key:
            return None
        return RowPadding(tuple(float(s) for s in provenance["seconds"]), float(provenance["margin"]))
    except (ArtifactError, InputError, KeyError, TypeError, ValueError):
        return None


def row_padding_for(backend: Any, cache_root: Path, max_rows: int = DEFAULT_MAX_ROWS) -> RowPadding | None:
    """`backend`'s padding: cached for this key, else measured (and cached when the machine was
    steady); None off the CPU (a GPU's products are not priced like a CPU BLAS's)."""
    import torch

    if backend.device.type != "cpu":
        return None
    key = row_padding_key(backend.info.checkpoint, backend.info.dtype, torch.get_num_threads(), backend.info.device,
                          max_rows)
    directory = Path(cache_root) / "row_padding" / stable_hash(key)[:20]
    padding = cached_row_padding(directory, key)
    if padding is not None:
        return padding
    log.info("timing the products of forwards of 1-%d rows of %s (once; cached in %s)", max_rows,
             backend.info.checkpoint, directory)
    seconds, cv = measure_products(backend.model, max_rows)
    padding = RowPadding(seconds)
    if cv > DEFAULT_MAX_CV:
        log.warning("the machine was busy while the row counts were timed (repeats varied %.0f%%, limit %.0f%%): "
                    "used for this run and timed again next time", 100 * cv, 100 * DEFAULT_MAX_CV)
        return padding
    if directory.exists():
        shutil.rmtree(directory)  # corrupt or foreign: measured again, never reused
    with staged_artifact(directory, ARTIFACT_KIND) as staging:
        write_manifest(staging, ARTIFACT_KIND, {"key": key, **padding.as_dict(), "noise_cv": cv})
    log.info("row padding: %s", padding.describe())
    return padding


def padded_rows(backend: Any) -> dict[str, int]:
    """The row counts `backend`'s verify forwards are padded from, and to ({} where none): part
    of the key of every cached measurement of its verify costs, which the padding changes."""
    padding = getattr(backend, "row_padding", None)
    if padding is None:
        return {}
    return {str(m): p for m, p in padding.padded.items()}
