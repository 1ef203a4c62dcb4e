"""Self-distillation on the transformers target: batched greedy answers whose hidden states are
kept on the way (the hidden state of every fed token is the final-norm output of the step that
read it), so the answers and the hidden-state cache cost one pass, not two.

Prompts are left-padded in batches of similar length; each finished batch is written as a
chunk (safetensors) that records the hash of its prompts and of the generation settings, so an
interrupted run resumes at the first missing chunk and never reuses a chunk made for other
prompts.  The last
answer token of each sample is never fed back, so its hidden row is zero: no training row
reads it (a row reads hidden[t - 1] with t + i still inside the segment).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from draftwise.artifacts import stable_hash

log = logging.getLogger(__name__)


def distill_chunks(prompts: Sequence[Sequence[int]], model, eos: frozenset[int], max_new: int, batch: int,
                   directory: Path) -> list[tuple[list[int], torch.Tensor]]:
    """(answer ids, hidden [len(prompt) + len(answer), d] bf16) per prompt, in the given order."""
    directory.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i : i + batch] for i in range(0, len(order), batch)]
    results: dict[int, tuple[list[int], torch.Tensor]] = {}
    started, produced = time.perf_counter(), 0
    for number, members in enumerate(batches):
        path = directory / f"chunk-{number:04d}.safetensors"
        key = stable_hash({"prompts": [[int(t) for t in prompts[i]] for i in members], "max_new": max_new,
                           "eos": sorted(eos)})
        if path.is_file() and _chunk_key(path) == key:
            saved = load_file(str(path))
            for j, index in enumerate(members):
                results[index] = (saved[f"answer.{j}"].tolist(), saved[f"hidden.{j}"])
            continue
        out = _generate([prompts[i] for i in members], model, eos, max_new)
        tensors = {}
        for j, (index, (answer, hidden)) in enumerate(zip(members, out)):
            results[index] = (answer, hidden)
            tensors[f"answer.{j}"] = torch.tensor(answer, dtype=torch.int64)
            tensors[f"hidden.{j}"] = hidden
            produced += len(answer)
        save_file(tensors, str(directory / "chunk.partial"), metadata={"key": key})
        (directory / "chunk.partial").replace(path)
        log.info("self-distillation: batch %d/%d (%d answer tokens, %.0f tokens/s)", number + 1, len(batches),
                 produced, produced / (time.perf_counter() - started))
    return [results[i] for i in range(len(prompts))]


def _chunk_key(path: Path) -> str | None:
    with safe_open(str(path), framework="pt") as handle:
        return (handle.metadata() or {}).get("key")


def _generate(prompts: list[Sequence[int]], model, eos: frozenset[int], max_new: int) -> list[tuple[list[int], torch.Tensor]]:
    width = max(len(p) for p in prompts)
    pad = min(eos)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # [B, P], left-padded
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt):] = torch.tensor(list(prompt))
        mask[b, width - len(prompt):] = 1
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             output_hidden_states=True, return_dict_in_generate=True, pad_token_id=pad,
                             eos_token_id=sorted(eos))
    steps = out.hidden_states  # per step: per layer [B, rows, d]; step 0 holds the prompt rows
    new = out.sequences[:, width:]  # [B, T]
    results = []
    for b, prompt in enumerate(prompts):
        answer: list[int] = []
        for token in new[b].tolist():
            answer.append(int(token))
            if token in eos:
                break
        rows = [steps[0][-1][b, width - len(prompt):]]  # [P, d]
        rows += [steps[s][-1][b, -1:] for s in range(1, len(answer))]  # the answer tokens that were fed
        rows.append(torch.zeros_like(rows[0][:1]))  # the last answer token was never fed
        results.append((answer, torch.cat(rows).to(torch.bfloat16)))  # [P + len(answer), d]
    return results
