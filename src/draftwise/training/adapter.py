"""Training Kangaroo's adapter by distillation from the frozen target (docs/training.md, "Kangaroo
adapters").

Data: the cached hidden-state stream of the heads pipeline (`pipeline.hidden_stream`: ShareGPT
or self-distilled conversations, one segment each, the target's final-norm state per token),
so the teacher's logits z_t = LM_head(h) cost no target forward.  Student: the target's first
l layers (frozen, recomputed per segment: l is small) -> adapter -> the target's LM head
(frozen).  Loss over the positions that predict an answer token:

    L_KD = -tau^2 sum_v softmax(z_t / tau)_v log softmax(z_s / tau)_v   (mean over positions)

AdamW with linear warmup and cosine decay; a checkpoint after every epoch (the heads trainer's
format), so a rerun resumes.  Validation after every epoch: the KD loss and top-1 agreement
with the target (the greedy acceptance proxy), and the same agreement of the untrained
adapter (the plain early exit at layer l) for comparison.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from draftwise.errors import InputError
from draftwise.options import option
from draftwise.selfdraft.adapter import KangarooAdapter
from draftwise.training.corpus import CorpusRecipe
from draftwise.training.hidden_cache import HiddenStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterRecipe:
    exit_layer: int = option(2, help="l: the adapter reads the residual stream after the first l layers")
    epochs: int = option(2, help="passes over the training conversations")
    lr: float = option(1e-3, help="peak learning rate (AdamW)")
    warmup: float = option(0.05, help="share of the steps spent warming up")
    tau: float = option(1.0, help="distillation temperature")
    weight_decay: float = option(0.0, help="AdamW weight decay")
    max_tokens: int = option(384, help="longest segment trained on (longer ones are cut)")
    seed: int = option(0, help="initialization and shuffles")
    family: str = "kangaroo"  # what the shared checkpoint format records

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.lr <= 0 or not 0 <= self.warmup < 1 or self.tau <= 0 or self.max_tokens < 2:
            raise InputError("epochs >= 1, lr > 0, warmup in [0, 1), tau > 0 and max_tokens >= 2 are required")

    def as_dict(self) -> dict:
        return asdict(self)


def kd_loss(teacher: torch.Tensor, student: torch.Tensor, tau: float) -> torch.Tensor:
    """L_KD over rows: teacher, student [P, V] logits -> scalar (mean over the P rows)."""
    target = torch.softmax(teacher / tau, dim=-1)  # [P, V]
    return -(tau**2) * (target * torch.log_softmax(student / tau, dim=-1)).sum(-1).mean()


def shallow_states(model, tokens: torch.Tensor, exit_layer: int) -> tuple[torch.Tensor, tuple, torch.Tensor]:
    """The residual stream after the first `exit_layer` layers of the frozen target, for one
    segment from position 0: x [1, T, d], the rotary embedding, and the causal mask [1, 1, T, T]."""
    inner = model.model
    rows = tokens.shape[0]
    positions = torch.arange(rows)[None]  # [1, T]
    visible = torch.arange(rows)[None] <= torch.arange(rows)[:, None]  # [T, T]
    mask = torch.zeros((rows, rows), dtype=model.dtype).masked_fill_(~visible, torch.finfo(model.dtype).min)[None, None]
    with torch.no_grad():
        x = inner.embed_tokens(tokens[None])  # [1, T, d]
        rope = inner.rotary_emb(x, positions)
        for layer in inner.layers[:exit_layer]:
            x = layer(x, attention_mask=mask, position_embeddings=rope, position_ids=positions)
    return x, rope, mask


def segment_rows(stream: HiddenStream, max_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per segment: tokens [T], the positions predicting an answer token [P], the teacher's
    hidden state at those positions [P, d] (T cut at max_tokens)."""
    out = []
    bounds = np.flatnonzero(np.diff(stream.segments)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(stream.segments)]):
        stop = min(stop, start + max_tokens)
        labels = stream.labels[start + 1 : stop]  # position t predicts token t + 1
        where = np.flatnonzero(labels)
        if stop - start < 2 or not where.size:
            continue
        tokens = torch.from_numpy(stream.tokens[start:stop].astype(np.int64))
        index = torch.from_numpy(where)
        out.append((tokens, index, stream.hidden[start + index].float()))
    return out


def lr_at(step: int, total: int, recipe: AdapterRecipe) -> float:
    warm = max(1, int(recipe.warmup * total))
    if step < warm:
        return recipe.lr * (step + 1) / warm
    return recipe.lr * 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def evaluate(model, adapter: KangarooAdapter, rows, recipe: AdapterRecipe) -> dict[str, float]:
    """KD loss and top-1 agreement with the target on `rows`."""
    lm_head = model.lm_head
    loss = agree = count = 0.0
    with torch.no_grad():
        for tokens, index, hidden in rows:
            x, rope, mask = shallow_states(model, tokens, recipe.exit_layer)
            student = lm_head(adapter(x, rope, mask, None)[0, index])  # [P, V]
            teacher = lm_head(hidden)  # [P, V]
            loss += float(kd_loss(teacher, student, recipe.tau)) * len(index)
            agree += float((student.argmax(-1) == teacher.argmax(-1)).sum())
            count += len(index)
    return {"kd_loss": loss / max(count, 1.0), "top1_agreement": agree / max(count, 1.0), "positions": count}


def train_adapter(model, stream: HiddenStream, recipe: AdapterRecipe, checkpoint_dir: Path
                  ) -> tuple[KangarooAdapter, dict]:
    """Train an adapter for `model` (the transformers target, frozen) on `stream`; resumable."""
    from draftwise.training.train import resume_checkpoint, save_checkpoint  # the heads trainer's checkpoint format

    torch.manual_seed(recipe.seed)
    model.requires_grad_(False)
    adapter = KangarooAdapter(model, recipe.exit_layer).float().train()
    train_rows = segment_rows(stream.subset("train"), recipe.max_tokens)
    val_rows = segment_rows(stream.subset("validation"), recipe.max_tokens)
    if not train_rows or not val_rows:
        raise InputError("the corpus has no training or validation conversation with answer tokens")
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    history: list[dict] = []
    early_exit = evaluate(model, adapter, val_rows, recipe)  # untrained: the final norm on layer l's state
    log.info("kangaroo: untrained adapter (early exit at layer %d): validation top-1 agreement %.3f",
             recipe.exit_layer, early_exit["top1_agreement"])
    first_epoch = resume_checkpoint(checkpoint_dir, recipe, adapter, optimizer, history)
    total = len(train_rows) * recipe.epochs
    started = time.perf_counter()
    for epoch in range(first_epoch, recipe.epochs):
        order = np.random.default_rng([recipe.seed, epoch]).permutation(len(train_rows))
        running = 0.0
        for step, i in enumerate(order):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(epoch * len(train_rows) + step, total, recipe)
            tokens, index, hidden = train_rows[i]
            x, rope, mask = shallow_states(model, tokens, recipe.exit_layer)
            with torch.no_grad():
                teacher = model.lm_head(hidden)  # [P, V]
            student = model.lm_head(adapter(x, rope, mask, None)[0, index])  # [P, V]
            loss = kd_loss(teacher, student, recipe.tau)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += float(loss.detach())
            if (step + 1) % 25 == 0:
                log.info("kangaroo epoch %d/%d step %d/%d KD loss %.3f (%.0f s)", epoch + 1, recipe.epochs, step + 1,
                         len(train_rows), running / 25, time.perf_counter() - started)
                running = 0.0
        adapter.eval()
        metrics = evaluate(model, adapter, val_rows, recipe)
        adapter.train()
        history.append({"epoch": epoch + 1, **metrics, "seconds": round(time.perf_counter() - started, 1)})
        log.info("kangaroo epoch %d: validation KD loss %.3f, top-1 agreement %.3f", epoch + 1, metrics["kd_loss"],
                 metrics["top1_agreement"])
        save_checkpoint(checkpoint_dir, recipe, adapter, optimizer, history, epoch + 1)
    adapter.eval().requires_grad_(False)
    return adapter, {"history": history, "validation": history[-1] if history else {}, "early_exit": early_exit,
                     "segments": {"train": len(train_rows), "validation": len(val_rows)}, "steps": total}


@dataclass(frozen=True)
class AdapterRun:
    target: str  # model alias, file or directory
    out: Path  # the adapter artifact to write
    corpus: CorpusRecipe
    recipe: AdapterRecipe = AdapterRecipe()
    work: Path | None = None  # corpus journal, hidden cache and checkpoints (default: the heads pipeline's)
    batch: int = 32  # prompts answered together in self-distillation


def run_adapter_training(run: AdapterRun) -> dict:
    """Cache the hidden states (shared with the heads pipeline), train, write the artifact."""
    from draftwise.artifacts import read_manifest, stable_hash
    from draftwise.measure.load import load_backend
    from draftwise.selfdraft.adapter import KIND, AdapterTarget, save_adapter
    from draftwise.training.pipeline import TrainingRun, hidden_stream, work_dir
    from draftwise.training.train import TrainRecipe

    started = time.perf_counter()
    target = load_backend(run.target, "transformers")
    data_run = TrainingRun(run.target, run.out, run.corpus, TrainRecipe(), run.work, run.batch)
    stream, data = hidden_stream(data_run, target)
    work = work_dir(data_run, target.info.checkpoint)
    checkpoints = work / f"adapter-checkpoints-{stable_hash(run.recipe.as_dict())[:12]}"
    trained = time.perf_counter()
    with torch.enable_grad():
        adapter, metrics = train_adapter(target.model, stream, run.recipe, checkpoints)  # type: ignore[attr-defined]
    metrics = {**metrics, "train_seconds": round(time.perf_counter() - trained, 1),
               "total_seconds": round(time.perf_counter() - started, 1), "threads": torch.get_num_threads()}
    provenance = {
        "recipe": run.recipe.as_dict(),
        "data": {"hidden_cache": stream.manifest_hash, "tokens": int(len(stream.tokens)),
                 "label_tokens": int(stream.labels.sum()),
                 **{k: data[k] for k in ("corpus", "source", "answers_by", "disjointness") if k in data}},
        "losses": f"L_KD (temperature {run.recipe.tau}) from the frozen target's logits",
        "metrics": metrics,
    }
    save_adapter(run.out, adapter, AdapterTarget(target.info.checkpoint, target.info.tokenizer_hash), provenance)
    read_manifest(run.out, kind=KIND)  # written and re-read whole
    log.info("wrote the Kangaroo adapter to %s", run.out)
    return provenance
