"""Random, non-trivial head sets for a target backend (the tiny random Llamas of `tiny_models`,
or a real model): every weight drawn from N(0, gain^2 / fan_in) instead of the zero init, so each
depth's q differs from the LM head's and from the other depths', and draft and target disagree
often enough to exercise every branch of a verifier."""

from __future__ import annotations

from pathlib import Path

import torch

from draftwise.heads.arch import HeadArch, make_heads
from draftwise.heads.artifact import HeadSet, HeadTarget, save_heads


def random_headset(family: str, target, seed: int, num_heads: int = 2, draft_vocab: int | None = None,
                   gain: float = 1.0, layers: int = 1) -> HeadSet:
    """A head set bound to `target`, over a random draft vocabulary of `draft_vocab` tokens
    (default: the whole vocabulary, in a shuffled order).  Weights are rounded to bf16, as an
    artifact stores them, so a saved and reloaded set is the same set."""
    weights = target.token_weights()
    vocab_size, d = weights.lm_head.shape
    g = torch.Generator().manual_seed(seed)
    token_map = torch.randperm(vocab_size, generator=g)[: draft_vocab or vocab_size]
    arch = HeadArch(family, num_heads, d, layers, vocab_size, int(token_map.numel()))
    heads = make_heads(arch)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * gain / p.shape[-1] ** 0.5).to(torch.bfloat16).float())
    heads.eval().requires_grad_(False)
    bound = HeadTarget(target.info.checkpoint, target.info.tokenizer_hash)
    return HeadSet(arch, heads, token_map, bound, f"random-{family}-{seed}", {"family": family})


def save_headset(directory: Path, headset: HeadSet) -> Path:
    save_heads(directory, headset.arch, headset.heads, headset.token_map, headset.target, dict(headset.provenance))
    return directory
