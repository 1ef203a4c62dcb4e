"""The frozen target's last hidden states over a corpus, computed once and cached.

A packed stream: every conversation (prompt + answer) is one segment; `tokens` [N],
`segments` [N] (segment id per token), `labels` [N] (1 where the token is an answer token, the
only positions trained as labels), `hidden` [N, d] (bf16, the final-norm state that the LM
head reads).  Each segment is its own causal forward, so no row ever attends across a
segment boundary (segment-causal).  The artifact binds the target, the corpus recipe and the
data's hash; several head families and runs reuse it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftwise.artifacts import read_manifest, stable_hash, staged_artifact, write_manifest
from draftwise.errors import ArtifactError
from draftwise.training.corpus import Sample

log = logging.getLogger(__name__)

KIND = "hidden_cache"
FILE = "stream.safetensors"


@dataclass(frozen=True, eq=False)
class HiddenStream:
    tokens: np.ndarray  # [N] int64
    segments: np.ndarray  # [N] int64, non-decreasing
    labels: np.ndarray  # [N] bool: answer tokens
    hidden: torch.Tensor  # [N, d] bfloat16
    split: Mapping[str, np.ndarray]  # "train" / "validation" -> segment ids
    manifest_hash: str
    provenance: Mapping[str, Any]

    def subset(self, split: str) -> "HiddenStream":
        """The tokens of one split's segments (a packed stream of its own)."""
        keep = np.isin(self.segments, self.split[split])
        index = np.flatnonzero(keep)
        return HiddenStream(self.tokens[index], self.segments[index], self.labels[index],
                            self.hidden[torch.from_numpy(index)], {split: self.split[split]},
                            self.manifest_hash, self.provenance)


def build_stream(directory: Path, samples: Sequence[Sample], model, provenance: Mapping[str, Any]) -> HiddenStream:
    """Run `model` (a transformers causal LM, the target as loaded) over every sample, one
    segment per forward, and write the artifact."""
    hidden, start, done = [], time.perf_counter(), 0
    for sid, sample in enumerate(samples):
        ids = list(sample.prompt) + list(sample.answer)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, logits_to_keep=1)
        hidden.append(out.hidden_states[-1][0].to(torch.bfloat16))  # [L, d]
        done += len(ids)
        if (sid + 1) % 50 == 0:
            log.info("hidden states: %d/%d conversations, %d tokens (%.0f tokens/s)", sid + 1, len(samples), done,
                     done / (time.perf_counter() - start))
    return write_stream(directory, samples, hidden, {**dict(provenance), "hidden_seconds": round(time.perf_counter() - start, 1)})


def write_stream(directory: Path, samples: Sequence[Sample], hidden: Sequence[torch.Tensor],
                 provenance: Mapping[str, Any]) -> HiddenStream:
    """Pack samples (prompt + answer, one segment each) and their hidden rows [L, d] into the artifact."""
    tokens, segments, labels, splits = [], [], [], []
    for sid, (sample, rows) in enumerate(zip(samples, hidden)):
        ids = list(sample.prompt) + list(sample.answer)
        if rows.shape[0] != len(ids):
            raise ArtifactError(f"sample {sample.key}: {rows.shape[0]} hidden rows for {len(ids)} tokens")
        tokens.extend(ids)
        segments.extend([sid] * len(ids))
        labels.extend([False] * len(sample.prompt) + [True] * len(sample.answer))
        splits.append(sample.split == "train")
    tensors = {
        "tokens": torch.tensor(tokens, dtype=torch.int64),
        "segments": torch.tensor(segments, dtype=torch.int64),
        "labels": torch.tensor(labels, dtype=torch.bool),
        "train_segments": torch.tensor([i for i, t in enumerate(splits) if t], dtype=torch.int64),
        "validation_segments": torch.tensor([i for i, t in enumerate(splits) if not t], dtype=torch.int64),
        "hidden": torch.cat(list(hidden)).to(torch.bfloat16),
    }
    data_hash = stable_hash([[list(s.prompt), list(s.answer), s.split] for s in samples])
    with staged_artifact(Path(directory), KIND) as staging:
        save_file(tensors, str(staging / FILE))
        write_manifest(staging, KIND, {**dict(provenance), "data_sha256": data_hash, "tokens": len(tokens),
                                       "segments": len(samples)})
    return load_stream(directory)


def load_stream(directory: Path) -> HiddenStream:
    manifest = read_manifest(Path(directory), kind=KIND, required=(FILE,))
    t = load_file(str(Path(directory) / FILE))
    needed = {"tokens", "segments", "labels", "hidden", "train_segments", "validation_segments"}
    if not needed <= set(t):
        raise ArtifactError(f"{directory}/{FILE} lacks {sorted(needed - set(t))}")
    n = t["tokens"].shape[0]
    if t["segments"].shape[0] != n or t["labels"].shape[0] != n or t["hidden"].shape[0] != n:
        raise ArtifactError(f"{directory}/{FILE}: tokens, segments, labels and hidden disagree in length")
    return HiddenStream(t["tokens"].numpy(), t["segments"].numpy(), t["labels"].numpy().astype(bool), t["hidden"],
                        {"train": t["train_segments"].numpy(), "validation": t["validation_segments"].numpy()},
                        manifest.hash, manifest.provenance)
