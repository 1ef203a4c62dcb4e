"""The target's hidden states along plain traces, so that `--proposer auto` can replay draft
heads (which read them) without the target.

Recorded once per trace set and cached beside it, keyed by the traces' own key: a backend that
keeps every committed row's state (`ContextHidden`: transformers) reads prompt + continuation
in one forward and keeps every row (a context layer, the Hydra++ prefix, reads them all); one
that keeps only the frontier (llama.cpp) reads the prompt, then the continuation a token at a
time, keeping the state at each commit (what frontier-only heads read).  One forward over the
whole sequence computes the same rows as the decode that made the trace, up to the float
rounding of a wider matrix product: near-ties of the heads' top-k may order differently, which
moves the replay's prediction by that much and never its exactness (the replay only predicts).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors.numpy import load_file, save_file

from draftwise.artifacts import write_manifest
from draftwise.backends.base import Backend, supports_context_hidden, supports_hidden
from draftwise.errors import InputError
from draftwise.optimize.auto import artifact_matches
from draftwise.optimize.replay import Trace

log = logging.getLogger(__name__)

HIDDEN_KIND = "trace_hidden"
HIDDEN_FILE = "hidden.safetensors"
FIRST_FILE = "first.json"


@dataclass(frozen=True, eq=False)
class TraceHidden:
    """States [R, d] float32 of one trace's positions first .. first + R - 1."""

    states: np.ndarray
    first: int


def record_hidden(target: Backend, trace: Trace) -> TraceHidden:
    """The target's final-norm states along `trace` (see the module note)."""
    if not supports_hidden(target):
        raise InputError(f"backend {target.info.name} does not expose hidden states: no draft heads to replay")
    sequence = [*trace.prompt, *trace.tokens]
    try:
        if supports_context_hidden(target):
            target.track_context(True)  # type: ignore[attr-defined]
            target.reset()  # tracking the context takes effect at a reset
            target.extend(sequence)
            states = target.context_hidden(0)  # type: ignore[attr-defined]  # [P + T, d]
            first = 0
        else:
            target.track_hidden(True)  # type: ignore[attr-defined]
            target.reset()
            target.extend(list(trace.prompt))
            rows = [target.frontier_hidden()]  # type: ignore[attr-defined]
            for token in trace.tokens:
                target.extend([token])
                rows.append(target.frontier_hidden())  # type: ignore[attr-defined]
            states = None if any(r is None for r in rows) else np.stack(rows)  # [T + 1, d]
            first = len(trace.prompt) - 1
    finally:
        if supports_context_hidden(target):
            target.track_context(False)  # type: ignore[attr-defined]
        target.track_hidden(False)  # type: ignore[attr-defined]
        target.reset()
    if states is None:
        raise InputError(f"backend {target.info.name} kept no hidden state for a row it read")
    return TraceHidden(np.ascontiguousarray(states, dtype=np.float32), first)


def ensure_hidden(target: Backend, traces: Sequence[Trace], traces_key: dict, directory: Path) -> list[TraceHidden]:
    """The states along every trace, recorded now unless a valid cached set for the same traces
    (`traces_key`, the traces' own cache key) and backend is there."""
    key = {"traces": traces_key, "context": supports_context_hidden(target)}
    if artifact_matches(directory, HIDDEN_KIND, lambda p: p == key):
        tensors = load_file(str(directory / HIDDEN_FILE))
        firsts = json.loads((directory / FIRST_FILE).read_text())
        return [TraceHidden(tensors[f"trace_{i}"], int(first)) for i, first in enumerate(firsts)]
    shutil.rmtree(directory, ignore_errors=True)
    out = []
    for i, trace in enumerate(traces, 1):
        log.info("hidden states along trace %d/%d", i, len(traces))
        out.append(record_hidden(target, trace))
    directory.mkdir(parents=True, exist_ok=True)
    save_file({f"trace_{i}": h.states for i, h in enumerate(out)}, str(directory / HIDDEN_FILE))
    (directory / FIRST_FILE).write_text(json.dumps([h.first for h in out]) + "\n")
    write_manifest(directory, HIDDEN_KIND, key)
    return out
