"""Self-distillation on the transformers target: batched greedy answers whose hidden states are
kept on the way (the hidden state of every fed token is the final-norm output of the step that
read it), so the answers and the hidden-state cache cost one pass, not two.

Prompts are left-padded in batches of similar length (sorted within each group of prompts, so
a group's batches do not depend on what follows it: a corpus grown by more groups reuses the
chunks of the groups it already had); each finished batch is written as a chunk
(safetensors) that records the hash of its prompts and of the generation settings, so an
interrupted run resumes at the first missing chunk and never reuses a chunk made for other
prompts.  The last answer token of each sample is never fed back, so its hidden row is zero:
no training row reads it (a row reads hidden[t - 1] with t + i still inside the segment).

The decoding loop is our own, not `generate`: it keeps only the final-norm state of each step
(`generate(output_hidden_states=True)` keeps every layer's), and it drops a sample from the
batch (its cache rows included) as soon as it has answered, so a batch's late steps do not pay
for the finished.  Its answers and states equal `generate`'s (greedy, same forward).
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
                   directory: Path, groups: Sequence[range] | None = None) -> list[tuple[list[int], torch.Tensor]]:
    """(answer ids, hidden [len(prompt) + len(answer), d] bf16) per prompt, in the given order.
    `groups`: consecutive index ranges batched independently (default: one group of all)."""
    directory.mkdir(parents=True, exist_ok=True)
    batches: list[list[int]] = []
    for group in groups if groups is not None else [range(len(prompts))]:
        order = sorted(group, key=lambda i: len(prompts[i]))
        batches += [order[i : i + batch] for i in range(0, len(order), batch)]
    results: dict[int, tuple[list[int], torch.Tensor]] = {}
    started, produced, fed, generated = time.perf_counter(), 0, 0, 0
    for number, members in enumerate(batches):
        path = directory / f"chunk-{number:04d}.safetensors"
        key = stable_hash({"prompts": [[int(t) for t in prompts[i]] for i in members], "max_new": max_new,
                           "eos": sorted(eos)})
        if path.is_file() and _chunk_key(path) == key:
            saved = load_file(str(path))
            for j, index in enumerate(members):
                results[index] = (saved[f"answer.{j}"].tolist(), saved[f"hidden.{j}"])
            continue
        out = generate_greedy([prompts[i] for i in members], model, eos, max_new)
        tensors = {}
        for j, (index, (answer, hidden)) in enumerate(zip(members, out)):
            results[index] = (answer, hidden)
            tensors[f"answer.{j}"] = torch.tensor(answer, dtype=torch.int64)
            tensors[f"hidden.{j}"] = hidden
            produced += len(answer)
            fed += len(prompts[index])
        save_file(tensors, str(directory / "chunk.partial"), metadata={"key": key})
        (directory / "chunk.partial").replace(path)
        generated += 1
        elapsed = time.perf_counter() - started
        left = (len(batches) - number - 1) * elapsed / generated  # the batches still to answer, at this run's pace
        log.info("self-distillation: batch %d/%d: %d answer + %d prompt tokens, %.1f answer tokens/s, ETA %s",
                 number + 1, len(batches), produced, fed, produced / elapsed, _clock(left))
    return [results[i] for i in range(len(prompts))]


def _clock(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds % 60):02d}s"


def _chunk_key(path: Path) -> str | None:
    with safe_open(str(path), framework="pt") as handle:
        return (handle.metadata() or {}).get("key")


def generate_greedy(prompts: list[Sequence[int]], model, eos: frozenset[int],
                    max_new: int) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy answers (stopping at an eos token, kept, or at max_new tokens) and the final-norm
    state of every fed token: the prompt's rows, then one per answer token but the last (zero)."""
    from transformers import DynamicCache

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), min(eos), dtype=torch.long)  # [B, P], left-padded
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, P] -> grows one column a step
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt):] = torch.tensor(list(prompt))
        mask[b, width - len(prompt):] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]: padding does not shift positions
    body, head = model.get_decoder(), model.get_output_embeddings()
    cache = DynamicCache()
    with torch.inference_mode():
        h = body(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache,
                 use_cache=True).last_hidden_state  # [B, P, d]
        rows = [[h[b, width - len(p):].to(torch.bfloat16)] for b, p in enumerate(prompts)]
        token = head(h[:, -1]).argmax(-1)  # [B]
        last = position[:, -1]  # [B]
        answers: list[list[int]] = [[] for _ in prompts]
        alive = list(range(len(prompts)))  # batch row -> sample
        while True:
            keep = []
            for r, b in enumerate(alive):
                answers[b].append(int(token[r]))
                if answers[b][-1] not in eos and len(answers[b]) < max_new:
                    keep.append(r)
            if not keep:
                break
            if len(keep) < len(alive):
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                mask, token, last = mask[index], token[index], last[index]
                alive = [alive[r] for r in keep]
            mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long)], dim=1)
            last = last + 1
            h = body(input_ids=token[:, None], attention_mask=mask, position_ids=last[:, None], past_key_values=cache,
                     use_cache=True).last_hidden_state[:, 0]  # [b, d]
            kept = h.to(torch.bfloat16)
            for r, b in enumerate(alive):
                rows[b].append(kept[r : r + 1])
            token = head(h).argmax(-1)  # [b]
    out = []
    for b, answer in enumerate(answers):
        rows[b].append(torch.zeros_like(rows[b][0][:1]))  # the last answer token was never fed
        out.append((answer, torch.cat(rows[b])))  # [P + len(answer), d]
    return out
