"""Teacher-forcing rows of a packed stream (docs/training.md, "Draft heads").

For head i (1-based) an anchor t is a position such that t - 1 and t + i lie in t's own
segment and the token at t + i is a label (an answer token).  Its input is hidden[t - 1] (and,
for dependent heads, the embeddings of tokens t .. t + i - 1) and its label tokens[t + i].  The
label is never an input; a row whose predecessor lies in another segment is skipped, never
clamped or wrapped.  A fully labelled segment of length L gives head i max(L - i - 1, 0) rows.
"""

from __future__ import annotations

import numpy as np


def anchors(segments: np.ndarray, labels: np.ndarray, i: int) -> np.ndarray:
    """Anchor positions t [R] for head i over a packed stream (segments [N], labels [N] bool)."""
    n = segments.shape[0]
    if i < 1:
        raise ValueError(f"heads are numbered from 1, got {i}")
    if n <= i + 1:
        return np.zeros(0, dtype=np.int64)
    t = np.arange(1, n - i)  # t - 1 >= 0 and t + i <= n - 1
    same = (segments[t - 1] == segments[t]) & (segments[t + i] == segments[t])  # [R]
    return t[same & labels[t + i]].astype(np.int64)


def dependent_inputs(tokens: np.ndarray, t: np.ndarray, i: int) -> np.ndarray:
    """Token ids [R, i] whose embeddings follow hidden[t - 1] in head i's input: tokens t .. t + i - 1."""
    return tokens[t[:, None] + np.arange(i)[None, :]]
