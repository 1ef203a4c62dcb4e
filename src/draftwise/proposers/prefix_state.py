"""Proposal-side state of a layer over the whole context (the Hydra++ prefix layer, Clover's
augmenting block): its KV and outputs over the committed rows, read from the target's
committed hidden states (`ContextHidden`), never written into the target's cache.

The state is keyed by the token ids it covers, and a row's keys depend on tokens 0..row only
(the target is causal, the layer is causal), so reuse is sound exactly up to the longest
common prefix with the committed context: each round crops to it (a rejected round's rows
never entered; a truncated context drops its tail) and extends with the rows committed since,
so after any round the state equals a fresh run over the committed text.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from draftwise.heads.prefix import PrefixKV, PrefixLayer


class PrefixState:
    def __init__(self, layer: PrefixLayer, target) -> None:
        self.layer = layer
        self.target = target  # a ContextHidden backend
        self.reset()

    def reset(self) -> None:
        self.tokens = np.zeros(0, dtype=np.int64)  # [T] the committed tokens the state covers
        self.kv: PrefixKV | None = None
        self.outputs = torch.zeros((0, self.layer.d))  # [T, d] the layer's output per row

    def frontier(self, context: Sequence[int]) -> torch.Tensor | None:
        """The layer's output [d] at the last committed row (the row that predicted the pending
        token context[-1]); None when the target has not committed that row's state."""
        committed = self.target.cached_len
        if committed != len(context) - 1 or committed == 0:
            return None
        tokens = np.asarray(context[:committed], dtype=np.int64)  # [T]
        n = min(len(tokens), len(self.tokens))
        differ = np.flatnonzero(tokens[:n] != self.tokens[:n])
        keep = int(differ[0]) if differ.size else n
        if keep < committed:
            rows = self.target.context_hidden(keep)  # [committed - keep, d]
            if rows is None:
                self.reset()
                return None
            kv = self.kv.crop(keep) if self.kv is not None and keep else None
            with torch.inference_mode():
                kv, out = self.layer.extend(kv, torch.from_numpy(np.asarray(rows, dtype=np.float32)))
            self.kv, self.outputs = kv, torch.cat([self.outputs[:keep], out])
        else:
            self.kv = self.kv.crop(committed) if self.kv is not None else None
            self.outputs = self.outputs[:committed]
        self.tokens = tokens
        return self.outputs[-1]
