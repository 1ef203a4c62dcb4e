"""The head training loop: frozen target, cached hidden states, per-depth weighted losses.

    Medusa   L_ind  = sum_i lambda_i CE(q_i(. | h_{t-1}), x_{t+i})
    Hydra    L_hard = sum_i lambda_i CE(q_i(. | h_{t-1}, x_t .. x_{t+i-1}), x_{t+i})   (teacher forcing)
    Hydra++  hard_weight L_hard + teacher_weight L_teacher (`objective`), deeper heads, optionally
             the prefix layer over the context, teacher forcing or self-conditioning
    Clover   the same losses through the recurrent state

lambda_i = decay^(i - 1); AdamW, linear warm-up then cosine decay.  q is scored over the draft
vocabulary (the `draft_vocab` most frequent label tokens of the training split); a label
outside it is left out of the hard loss (no head can propose it) and counted as a miss in the
validation accuracy.  After every epoch: per-head top-1 / top-5 accuracy (teacher-forced paths)
on the held-out split, and a checkpoint (weights, optimizer state, epoch) that a rerun resumes
from.  Deterministic under the seed: the shuffles come from a generator seeded by (seed, epoch).

Batches: rows drawn per head from the whole split, except with a context layer (`prefix`):
its output at a row depends on the row's whole segment, so a step draws whole segments (about
`batch` rows of head 1), runs the layer over them once, and trains every head on the rows
anchored in them.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftwise.errors import InputError
from draftwise.heads.arch import FAMILIES, CloverHeads, DraftVocab, HeadArch, HydraHeads, MedusaHeads, make_heads
from draftwise.heads.prefix import PrefixLayer
from draftwise.options import option
from draftwise.training.hidden_cache import HiddenStream
from draftwise.training.objective import CONDITIONING, conditioned_path, head_states, teacher_loss
from draftwise.training.rows import anchors, dependent_inputs

log = logging.getLogger(__name__)

Heads = MedusaHeads | HydraHeads | CloverHeads
Frontier = Callable[[np.ndarray], torch.Tensor]  # stream positions [B] -> the heads' input states [B, d]


@dataclass(frozen=True)
class TrainRecipe:
    family: str = option("medusa", help="medusa | hydra | hydra++ | clover")
    num_heads: int = option(4, key="heads", help="K: depths past the pending token")
    layers: int = option(1, help="residual blocks per head (Clover: per depth's predictor)")
    draft_vocab: int = option(8192, help="rows of the draft vocabulary (the most frequent label tokens)")
    epochs: int = option(4, help="passes over the training rows")
    lr: float = option(1e-3, help="peak learning rate (AdamW)")
    warmup: float = option(0.1, help="share of the steps spent warming up")
    batch: int = option(256, help="rows per head per step")
    decay: float = option(0.8, help="lambda_i = decay^(i - 1): the weight of depth i")
    weight_decay: float = option(0.0, help="AdamW weight decay")
    seed: int = option(0, help="initialization and shuffles")
    prefix: bool = option(False, help="hydra++ / clover: a prefix-attention layer over the context feeds the heads "
                                      "(Clover's augmenting block)")
    hard_weight: float = option(1.0, help="weight of L_hard (cross-entropy with the next tokens)")
    teacher_weight: float = option(0.0, help="weight of L_teacher (cross-entropy with the target's distribution)")
    conditioning: str = option("teacher", help="dependent heads' path in training: teacher (true tokens) | self "
                                               "(earlier heads' picks)")
    segment_batches: bool = option(False, help="draw whole segments per step even without a context layer (which "
                                               "needs them): isolates the batching's effect from the layer's")

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch < 1 or self.lr <= 0 or not 0 <= self.warmup < 1:
            raise InputError("epochs and batch must be >= 1, lr > 0, warmup in [0, 1)")
        if self.family not in FAMILIES:
            raise InputError(f"head family must be one of {FAMILIES}, got {self.family!r}")
        if self.hard_weight < 0 or self.teacher_weight < 0 or self.hard_weight + self.teacher_weight == 0:
            raise InputError(f"loss weights must be >= 0 and not both 0, got hard {self.hard_weight}, "
                             f"teacher {self.teacher_weight}")
        if self.conditioning not in CONDITIONING:
            raise InputError(f"conditioning must be one of {CONDITIONING}, got {self.conditioning!r}")
        if self.conditioning == "self" and self.family == "medusa":
            raise InputError("self-conditioning feeds earlier heads' picks to later heads; medusa heads read no path")

    def as_dict(self) -> dict:
        """The options added with Hydra++ only when they differ from their defaults: an older
        recipe keeps the dict (and the checkpoint directory hash) it had."""
        defaults = {"prefix": False, "hard_weight": 1.0, "teacher_weight": 0.0, "conditioning": "teacher",
                    "segment_batches": False}
        return {k: v for k, v in asdict(self).items() if k not in defaults or v != defaults[k]}


# The published recipes, scaled to a CPU budget: the shape (frozen backbone, lr, schedule,
# depth weights, losses) is the paper's, the data and epochs are what two cores train in
# minutes.  Hydra++'s dropout 0.2 is left out (a few epochs over small data).
PRESETS: Mapping[str, Mapping[str, Any]] = {
    "medusa-1": {"family": "medusa", "lr": 1e-3, "warmup": 0.1, "decay": 0.8, "layers": 1},
    "hydra": {"family": "hydra", "lr": 1e-3, "warmup": 0.1, "decay": 0.8, "layers": 1},
    "hydra++": {"family": "hydra++", "lr": 5e-4, "warmup": 0.1, "decay": 0.8, "layers": 4, "weight_decay": 0.1,
                "teacher_weight": 1.0, "hard_weight": 0.0, "prefix": True},
    "clover": {"family": "clover", "lr": 1e-3, "warmup": 0.1, "decay": 0.8, "layers": 1, "prefix": True},
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
        self.segment_of = {i: stream.segments[t] for i, t in self.anchors.items()}  # [R_i] each anchor's segment

    def states(self, heads: Heads, embed: torch.Tensor | None, i: int, pick: np.ndarray, frontier: Frontier,
               vocab: DraftVocab | None = None, conditioning: str = "teacher") -> torch.Tensor:
        """Head i's output states [B, d] for the rows `pick` (indices into its anchors);
        self-conditioning needs `vocab` (the earlier heads' picks)."""
        t = self.anchors[i][pick]
        h = frontier(t - 1)  # [B, d]
        path = None
        if not isinstance(heads, MedusaHeads):
            path = torch.from_numpy(dependent_inputs(self.stream.tokens, t, i))  # [B, i]
            if conditioning == "self" and i > 1:
                assert embed is not None and vocab is not None
                path = conditioned_path(heads, vocab, embed, i, h, path)
        return head_states(heads, embed, i, h, path)

    def inputs(self, heads: Heads, embed: torch.Tensor | None, i: int, pick: np.ndarray) -> torch.Tensor:
        """Head i's states [B, d] on the cached target states, teacher-forced paths."""
        return self.states(heads, embed, i, pick, stream_frontier(self.stream))

    def logits(self, heads: Heads, vocab: DraftVocab, embed: torch.Tensor | None, i: int, pick: np.ndarray,
               frontier: Frontier, conditioning: str = "teacher") -> torch.Tensor:
        """Head i's draft-vocabulary logits [B, V_d] for the rows `pick`."""
        return vocab.logits(self.states(heads, embed, i, pick, frontier, vocab, conditioning))

    def teacher(self, vocab: DraftVocab, i: int, pick: np.ndarray) -> torch.Tensor:
        """The target's logits [B, V_d] at position t + i - 1 (its law for the label x_{t+i})."""
        t = self.anchors[i][pick]
        with torch.no_grad():
            return vocab.logits(self.stream.hidden[torch.from_numpy(t + i - 1)].float())


def stream_frontier(stream: HiddenStream) -> Frontier:
    return lambda positions: stream.hidden[torch.from_numpy(positions)].float()  # [B, d]


def context_frontier(layer: PrefixLayer, stream: HiddenStream, segments: np.ndarray) -> Frontier:
    """The layer's output over whole segments (one causal pass each, padded at the end), as a
    lookup by stream position; a position outside `segments` is an error."""
    starts = np.searchsorted(stream.segments, segments, side="left")
    ends = np.searchsorted(stream.segments, segments, side="right")
    longest = int((ends - starts).max())
    x = torch.zeros((len(segments), longest, layer.d))  # [S, L, d]
    for k, (a, b) in enumerate(zip(starts, ends)):
        x[k, : b - a] = stream.hidden[int(a):int(b)].float()
    out = layer(x)  # [S, L, d]
    where = np.full(len(stream.tokens), -1, dtype=np.int64)  # stream position -> row of `table`
    for k, (a, b) in enumerate(zip(starts, ends)):
        where[a:b] = np.arange(b - a) + k * longest
    table = out.reshape(-1, layer.d)  # [S * L, d]

    def lookup(positions: np.ndarray) -> torch.Tensor:
        index = where[positions]
        if (index < 0).any():
            raise InputError("a row's frontier lies outside the segments the context layer read")
        return table[torch.from_numpy(index)]

    return lookup


def split_frontier(heads: Heads, stream: HiddenStream, chunk: int = 16) -> Frontier:
    """The heads' input over a whole split (no gradient): the cached states, or the context
    layer's output computed chunk by chunk of segments."""
    layer = getattr(heads, "prefix", None)
    if layer is None:
        return stream_frontier(stream)
    segments = np.unique(stream.segments)
    table = torch.zeros((len(stream.tokens), layer.d))  # [N, d]
    with torch.inference_mode():
        for start in range(0, len(segments), chunk):
            part = segments[start:start + chunk]
            lookup = context_frontier(layer, stream, part)
            inside = np.flatnonzero(np.isin(stream.segments, part))
            table[torch.from_numpy(inside)] = lookup(inside)
    return lambda positions: table[torch.from_numpy(positions)]


def lr_at(step: int, total: int, recipe: TrainRecipe) -> float:
    warm = max(1, int(recipe.warmup * total))
    if step < warm:
        return recipe.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return recipe.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def evaluate(heads: Heads, vocab: DraftVocab, embed: torch.Tensor | None, rows: Rows,
             batch: int = 2048) -> dict[str, list[float]]:
    """Per-head top-1 and top-5 accuracy on `rows`, teacher-forced paths (a label outside the map is a miss)."""
    top1, top5 = [], []
    heads.eval()
    with torch.inference_mode():
        frontier = split_frontier(heads, rows.stream)
        for i in sorted(rows.anchors):
            hits1 = hits5 = 0
            n = len(rows.anchors[i])
            for start in range(0, n, batch):
                pick = np.arange(start, min(n, start + batch))
                logits = rows.logits(heads, vocab, embed, i, pick, frontier)  # [B, V_d]
                label = rows.labels[i][torch.from_numpy(pick)]  # [B]
                best = logits.topk(5, dim=-1).indices  # [B, 5]
                hits1 += int((best[:, 0] == label).sum())
                hits5 += int((best == label[:, None]).any(dim=-1).sum())
            top1.append(hits1 / max(n, 1))
            top5.append(hits5 / max(n, 1))
    heads.train()
    return {"top1": top1, "top5": top5}


class Sampler:
    """Which rows each step trains on: per-head shuffles of the whole split, or (context layer)
    shuffled groups of whole segments with every head's rows anchored in them."""

    def __init__(self, rows: Rows, recipe: TrainRecipe, by_segment: bool) -> None:
        self.rows, self.recipe, self.by_segment = rows, recipe, by_segment
        self.segments = np.unique(rows.stream.segments)
        if by_segment:
            per_segment = len(rows.anchors[1]) / max(len(self.segments), 1)
            self.group = max(1, round(recipe.batch / max(per_segment, 1.0)))
            self.steps = math.ceil(len(self.segments) / self.group)
        else:
            self.steps = max(math.ceil(len(a) / recipe.batch) for a in rows.anchors.values())

    def epoch(self, epoch: int) -> list[tuple[dict[int, np.ndarray], np.ndarray | None]]:
        """Per step: head -> picks (indices into its anchors), and the step's segments (or None)."""
        rng = np.random.default_rng([self.recipe.seed, epoch])
        steps = []
        if self.by_segment:
            order = rng.permutation(self.segments)
            for step in range(self.steps):
                group = np.sort(order[step * self.group:(step + 1) * self.group])
                steps.append(({i: np.flatnonzero(np.isin(s, group)) for i, s in self.rows.segment_of.items()}, group))
            return steps
        orders = {i: rng.permutation(len(a)) for i, a in self.rows.anchors.items()}
        for step in range(self.steps):
            steps.append(({i: o[(step * self.recipe.batch) % len(o):][: self.recipe.batch] for i, o in orders.items()},
                          None))
        return steps


def step_loss(heads: Heads, vocab: DraftVocab, embed: torch.Tensor | None, rows: Rows, recipe: TrainRecipe,
              picks: dict[int, np.ndarray], frontier: Frontier, weights: list[float]) -> torch.Tensor:
    loss = torch.zeros(())
    for i, w in zip(sorted(picks), weights):
        pick = picks[i]
        if not len(pick):
            continue
        logits = rows.logits(heads, vocab, embed, i, pick, frontier, recipe.conditioning)  # [B, V_d]
        if recipe.hard_weight:
            label = rows.labels[i][torch.from_numpy(pick)]  # [B] draft index, -1 outside
            if (label >= 0).any():
                loss = loss + w * recipe.hard_weight * torch.nn.functional.cross_entropy(logits, label, ignore_index=-1)
        if recipe.teacher_weight:
            loss = loss + w * recipe.teacher_weight * teacher_loss(logits, rows.teacher(vocab, i, pick))
    return loss


def train_heads(recipe: TrainRecipe, stream: HiddenStream, lm_head: torch.Tensor, embed: torch.Tensor,
                checkpoint_dir: Path) -> tuple[HeadArch, Heads, torch.Tensor, dict]:
    """Train a head set on `stream`; resume from `checkpoint_dir` when it holds this recipe's
    checkpoint.  lm_head [V, d] and embed [V, d] are the target's, frozen."""
    torch.manual_seed(recipe.seed)
    train, validation = stream.subset("train"), stream.subset("validation")
    token_map = choose_token_map(train, recipe.draft_vocab, lm_head.shape[0])
    arch = HeadArch(recipe.family, recipe.num_heads, int(lm_head.shape[1]), recipe.layers, int(lm_head.shape[0]),
                    int(token_map.numel()), prefix=recipe.prefix)
    heads = make_heads(arch)
    vocab = DraftVocab(lm_head, token_map)
    index_of = vocab.index_of()
    train_rows, val_rows = Rows(train, arch, index_of), Rows(validation, arch, index_of)
    dependent_embed = embed.float() if arch.dependent else None
    optimizer = torch.optim.AdamW(heads.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    layer = getattr(heads, "prefix", None)
    sampler = Sampler(train_rows, recipe, by_segment=layer is not None or recipe.segment_batches)
    total = sampler.steps * recipe.epochs
    weights = [recipe.decay ** (i - 1) for i in range(1, arch.num_heads + 1)]
    history: list[dict] = []
    first_epoch = resume_checkpoint(checkpoint_dir, recipe, heads, optimizer, history)
    started = time.perf_counter()
    heads.train()
    for epoch in range(first_epoch, recipe.epochs):
        running = 0.0
        for step, (picks, group) in enumerate(sampler.epoch(epoch)):
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr_at(epoch * sampler.steps + step, total, recipe)
            frontier = stream_frontier(train) if group is None or layer is None else context_frontier(layer, train, group)
            loss = step_loss(heads, vocab, dependent_embed, train_rows, recipe, picks, frontier, weights)
            optimizer.zero_grad(set_to_none=True)
            if loss.requires_grad:
                loss.backward()
                optimizer.step()
            running += float(loss.detach())
            if (step + 1) % 50 == 0:
                log.info("%s epoch %d/%d step %d/%d loss %.3f (%.0f s)", arch.family, epoch + 1, recipe.epochs,
                         step + 1, sampler.steps, running / 50, time.perf_counter() - started)
                running = 0.0
        accuracy = evaluate(heads, vocab, dependent_embed, val_rows)
        history.append({"epoch": epoch + 1, **accuracy, "seconds": round(time.perf_counter() - started, 1)})
        log.info("%s epoch %d: validation top-1 %s top-5 %s", arch.family, epoch + 1,
                 " ".join(f"{a:.3f}" for a in accuracy["top1"]), " ".join(f"{a:.3f}" for a in accuracy["top5"]))
        save_checkpoint(checkpoint_dir, recipe, heads, optimizer, history, epoch + 1)
    metrics = {
        "history": history,
        "validation": history[-1] if history else {},
        "coverage": {"train": coverage(train, token_map), "validation": coverage(validation, token_map)},
        "rows": {f"head{i}": int(len(a)) for i, a in train_rows.anchors.items()},
        "steps": total,
        "parameters": sum(p.numel() for p in heads.parameters()),
    }
    heads.eval().requires_grad_(False)
    return arch, heads, token_map, metrics


def save_checkpoint(directory: Path, recipe: TrainRecipe, heads, optimizer, history: list[dict], epoch: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in heads.state_dict().items()}
    for n, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optim.{n}.{key}"] = torch.as_tensor(value).detach().contiguous()
    save_file(tensors, str(directory / "checkpoint.partial"))
    (directory / "checkpoint.partial").replace(directory / "checkpoint.safetensors")
    (directory / "checkpoint.json").write_text(json.dumps({"recipe": recipe.as_dict(), "epoch": epoch,
                                                           "history": history}))


def resume_checkpoint(directory: Path, recipe: TrainRecipe, heads, optimizer, history: list[dict]) -> int:
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
