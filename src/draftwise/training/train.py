"""The head training loop: frozen target, cached hidden states, per-depth weighted losses.

    Medusa  L_ind  = sum_i lambda_i CE(q_i(. | h_{t-1}), x_{t+i})
    Hydra   L_hard = sum_i lambda_i CE(q_i(. | h_{t-1}, x_t .. x_{t+i-1}), x_{t+i})   (teacher forcing)

lambda_i = decay^(i - 1); AdamW, linear warm-up then cosine decay.  q is scored over the draft
vocabulary (the `draft_vocab` most frequent label tokens of the training split); a label
outside it is left out of the loss (no head can propose it) and counted as a miss in the
validation accuracy.  After every epoch: per-head top-1 / top-5 accuracy on the held-out
split, and a checkpoint (weights, optimizer state, epoch) that a rerun resumes from.
Deterministic under the seed: the shuffles come from a generator seeded by (seed, epoch).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftwise.errors import InputError
from draftwise.heads.arch import DraftVocab, HeadArch, HydraHeads, MedusaHeads, make_heads
from draftwise.options import option
from draftwise.training.hidden_cache import HiddenStream
from draftwise.training.rows import anchors, dependent_inputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainRecipe:
    family: str = option("medusa", help="medusa | hydra")
    num_heads: int = option(4, key="heads", help="K: depths past the pending token")
    layers: int = option(1, help="residual blocks per head")
    draft_vocab: int = option(8192, help="rows of the draft vocabulary (the most frequent label tokens)")
    epochs: int = option(4, help="passes over the training rows")
    lr: float = option(1e-3, help="peak learning rate (AdamW)")
    warmup: float = option(0.1, help="share of the steps spent warming up")
    batch: int = option(256, help="rows per head per step")
    decay: float = option(0.8, help="lambda_i = decay^(i - 1): the weight of depth i")
    weight_decay: float = option(0.0, help="AdamW weight decay")
    seed: int = option(0, help="initialization and shuffles")

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch < 1 or self.lr <= 0 or not 0 <= self.warmup < 1:
            raise InputError("epochs and batch must be >= 1, lr > 0, warmup in [0, 1)")

    def as_dict(self) -> dict:
        return asdict(self)


# The published recipes, scaled to a CPU budget: the shape (frozen backbone, lr, schedule,
# depth weights) is the paper's, the data and epochs are what two cores train in minutes.
PRESETS: Mapping[str, Mapping[str, Any]] = {
    "medusa-1": {"family": "medusa", "lr": 1e-3, "warmup": 0.1, "decay": 0.8, "layers": 1},
    "hydra": {"family": "hydra", "lr": 1e-3, "warmup": 0.1, "decay": 0.8, "layers": 1},
}


def choose_token_map(stream: HiddenStream, size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent label tokens of the training split, most frequent first (ties: lower id)."""
    counts = np.bincount(stream.tokens[stream.labels], minlength=vocab_size)  # [V]
    order = np.lexsort((np.arange(vocab_size), -counts))[: min(size, vocab_size)]
    return torch.from_numpy(order.astype(np.int64))


def coverage(stream: HiddenStream, token_map: torch.Tensor) -> float:
    """Share of the label tokens inside the draft vocabulary: the ceiling of every head's top-k."""
    inside = np.isin(stream.tokens[stream.labels], token_map.numpy())
    return float(inside.mean()) if inside.size else 0.0


class Rows:
    """Head i's rows of one split: anchors, labels (draft indices, -1 outside the map)."""

    def __init__(self, stream: HiddenStream, arch: HeadArch, index_of: torch.Tensor) -> None:
        self.stream = stream
        self.anchors = {i: anchors(stream.segments, stream.labels, i) for i in range(1, arch.num_heads + 1)}
        tokens = torch.from_numpy(stream.tokens)
        self.labels = {i: index_of[tokens[torch.from_numpy(t + i)]] for i, t in self.anchors.items()}

    def inputs(self, heads: MedusaHeads | HydraHeads, embed: torch.Tensor | None, i: int, pick: np.ndarray) -> torch.Tensor:
        """Head i's output states [B, d] for the rows `pick` (indices into its anchors)."""
        t = self.anchors[i][pick]
        h = self.stream.hidden[torch.from_numpy(t - 1)].float()  # [B, d]
        if isinstance(heads, MedusaHeads):
            return heads.head(i, h)
        assert embed is not None
        previous = torch.from_numpy(dependent_inputs(self.stream.tokens, t, i))  # [B, i]
        u = torch.cat([h, embed[previous].flatten(1)], dim=1)  # [B, (i+1) d]
        return heads.head(i, u)


def lr_at(step: int, total: int, recipe: TrainRecipe) -> float:
    warm = max(1, int(recipe.warmup * total))
    if step < warm:
        return recipe.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return recipe.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def evaluate(heads, vocab: DraftVocab, embed, rows: Rows, batch: int = 2048) -> dict[str, list[float]]:
    """Per-head top-1 and top-5 accuracy on `rows` (a label outside the map is a miss)."""
    top1, top5 = [], []
    heads.eval()
    with torch.inference_mode():
        for i in sorted(rows.anchors):
            hits1 = hits5 = 0
            n = len(rows.anchors[i])
            for start in range(0, n, batch):
                pick = np.arange(start, min(n, start + batch))
                logits = vocab.logits(rows.inputs(heads, embed, i, pick))  # [B, V_d]
                label = rows.labels[i][torch.from_numpy(pick)]  # [B]
                best = logits.topk(5, dim=-1).indices  # [B, 5]
                hits1 += int((best[:, 0] == label).sum())
                hits5 += int((best == label[:, None]).any(dim=-1).sum())
            top1.append(hits1 / max(n, 1))
            top5.append(hits5 / max(n, 1))
    heads.train()
    return {"top1": top1, "top5": top5}


def train_heads(recipe: TrainRecipe, stream: HiddenStream, lm_head: torch.Tensor, embed: torch.Tensor,
                checkpoint_dir: Path) -> tuple[HeadArch, MedusaHeads | HydraHeads, torch.Tensor, dict]:
    """Train a head set on `stream`; resume from `checkpoint_dir` when it holds this recipe's
    checkpoint.  lm_head [V, d] and embed [V, d] are the target's, frozen."""
    torch.manual_seed(recipe.seed)
    train, validation = stream.subset("train"), stream.subset("validation")
    token_map = choose_token_map(train, recipe.draft_vocab, lm_head.shape[0])
    arch = HeadArch(recipe.family, recipe.num_heads, int(lm_head.shape[1]), recipe.layers, int(lm_head.shape[0]),
                    int(token_map.numel()))
    heads = make_heads(arch)
    vocab = DraftVocab(lm_head, token_map)
    index_of = vocab.index_of()
    train_rows, val_rows = Rows(train, arch, index_of), Rows(validation, arch, index_of)
    embed = embed.float() if arch.family == "hydra" else None
    optimizer = torch.optim.AdamW(heads.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps_per_epoch = max(math.ceil(len(a) / recipe.batch) for a in train_rows.anchors.values())
    total = steps_per_epoch * recipe.epochs
    weights = [recipe.decay ** (i - 1) for i in range(1, arch.num_heads + 1)]
    history: list[dict] = []
    first_epoch = _resume(checkpoint_dir, recipe, heads, optimizer, history)
    started = time.perf_counter()
    heads.train()
    for epoch in range(first_epoch, recipe.epochs):
        rng = np.random.default_rng([recipe.seed, epoch])
        orders = {i: rng.permutation(len(a)) for i, a in train_rows.anchors.items()}
        running = 0.0
        for step in range(steps_per_epoch):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(epoch * steps_per_epoch + step, total, recipe)
            loss = torch.zeros(())
            for i, w in zip(sorted(orders), weights):
                order = orders[i]
                pick = order[(step * recipe.batch) % len(order):][: recipe.batch]
                label = train_rows.labels[i][torch.from_numpy(pick)]  # [B] draft index, -1 outside
                logits = vocab.logits(train_rows.inputs(heads, embed, i, pick))  # [B, V_d]
                loss = loss + w * torch.nn.functional.cross_entropy(logits, label, ignore_index=-1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += float(loss.detach())
            if (step + 1) % 50 == 0:
                log.info("%s epoch %d/%d step %d/%d loss %.3f (%.0f s)", arch.family, epoch + 1, recipe.epochs,
                         step + 1, steps_per_epoch, running / 50, time.perf_counter() - started)
                running = 0.0
        accuracy = evaluate(heads, vocab, embed, val_rows)
        history.append({"epoch": epoch + 1, **accuracy, "seconds": round(time.perf_counter() - started, 1)})
        log.info("%s epoch %d: validation top-1 %s top-5 %s", arch.family, epoch + 1,
                 " ".join(f"{a:.3f}" for a in accuracy["top1"]), " ".join(f"{a:.3f}" for a in accuracy["top5"]))
        _checkpoint(checkpoint_dir, recipe, heads, optimizer, history, epoch + 1)
    metrics = {
        "history": history,
        "validation": history[-1] if history else {},
        "coverage": {"train": coverage(train, token_map), "validation": coverage(validation, token_map)},
        "rows": {f"head{i}": int(len(a)) for i, a in train_rows.anchors.items()},
        "steps": total,
    }
    heads.eval().requires_grad_(False)
    return arch, heads, token_map, metrics


def _checkpoint(directory: Path, recipe: TrainRecipe, heads, optimizer, history: list[dict], epoch: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in heads.state_dict().items()}
    for n, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optim.{n}.{key}"] = torch.as_tensor(value).detach().contiguous()
    save_file(tensors, str(directory / "checkpoint.partial"))
    (directory / "checkpoint.partial").replace(directory / "checkpoint.safetensors")
    (directory / "checkpoint.json").write_text(json.dumps({"recipe": recipe.as_dict(), "epoch": epoch,
                                                           "history": history}))


def _resume(directory: Path, recipe: TrainRecipe, heads, optimizer, history: list[dict]) -> int:
    meta, weights = directory / "checkpoint.json", directory / "checkpoint.safetensors"
    if not (meta.is_file() and weights.is_file()):
        return 0
    state = json.loads(meta.read_text())
    if state.get("recipe") != recipe.as_dict():
        log.info("checkpoint in %s is for another recipe: starting afresh", directory)
        return 0
    tensors = load_file(str(weights))
    heads.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    # one optimizer step with zero gradients creates the state tensors, then they are overwritten
    saved = optimizer.state_dict()
    groups = saved["param_groups"]
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, n, name = key.split(".", 2)
            opt_state.setdefault(int(n), {})[name] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    history.extend(state.get("history", []))
    log.info("resuming %s training after epoch %d", recipe.family, state["epoch"])
    return int(state["epoch"])
