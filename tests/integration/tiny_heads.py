"""Random, non-trivial head sets for a target backend (the tiny random Llamas of `tiny_models`,
or a real model): every weight drawn from N(0, gain^2 / fan_in) instead of the zero init, so each
depth's q differs from the LM head's and from the other depths', and draft and target disagree
often enough to exercise every branch of a verifier."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.heads.arch import HeadArch, make_heads
from draftwise.heads.artifact import HeadSet, HeadTarget, save_heads
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.sequoia import without_replacement_q
from tests.helpers import probs_differ
from tests.integration.tiny_models import chi_square_p


def random_headset(family: str, target, seed: int, num_heads: int = 2, draft_vocab: int | None = None,
                   gain: float = 1.0, layers: int = 1, lowest_ids: bool = False, prefix: bool = False) -> HeadSet:
    """A head set bound to `target`, over a random draft vocabulary of `draft_vocab` tokens
    (default: the whole vocabulary, in a shuffled order; `lowest_ids`: the ids 0..draft_vocab-1,
    a BPE vocabulary's earliest, most common merges).  Weights are rounded to bf16, as an
    artifact stores them, so a saved and reloaded set is the same set.  `prefix`: with the
    Hydra++ prefix layer / Clover augmenting block."""
    weights = target.token_weights()
    vocab_size, d = weights.lm_head.shape
    g = torch.Generator().manual_seed(seed)
    token_map = torch.randperm(vocab_size, generator=g)[: draft_vocab or vocab_size]
    if lowest_ids:
        token_map = torch.arange(draft_vocab or vocab_size)
    arch = HeadArch(family, num_heads, d, layers, vocab_size, int(token_map.numel()), prefix=prefix)
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


# ---- the exact law of the emitted tokens ---------------------------------------------------

@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for a block (a 2-layer model: threads cost more than they give; a
    module fixture cannot leave the setting to the per-test restore in conftest)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def exact_law(target, policy: SamplingPolicy, prompt: Sequence[int], n: int) -> np.ndarray:
    """[V] * n: P(the first n emitted tokens) under the target alone, by enumeration."""
    vocab = target.info.vocab_size
    law = np.zeros([vocab] * n)

    def walk(prefix: list[int], mass: float) -> None:
        target.reset()
        target.extend(prefix[:-1])
        p = policy.probs(target.verify(prefix[-1], None).logits[0].numpy())  # [V]
        target.rollback()
        for x in np.flatnonzero(p):
            if len(prefix) + 1 - len(prompt) == n:
                law[tuple(prefix[len(prompt):]) + (int(x),)] = mass * p[x]
            else:
                walk(prefix + [int(x)], mass * p[x])

    with one_thread():
        walk(list(prompt), 1.0)
    target.reset()
    return law


def law_p_value(counts: np.ndarray, law: np.ndarray) -> float:
    """Chi-square goodness of fit; a count in a cell of probability zero is an outright failure."""
    if counts[law == 0].sum() > 0:
        return 0.0
    return chi_square_p(counts[law > 0], law[law > 0])


def emitted_counts(target, proposer, verifier, policy: SamplingPolicy, prompt: Sequence[int], samples: int,
                   new: int) -> tuple[np.ndarray, dict[str, int]]:
    """[V] * (new - 1) counts of emitted tokens 2..new over seeded generations (token 1 comes from
    the round that reads the prompt, where heads have no state yet), and what round 2 did."""
    vocab = target.info.vocab_size
    counts = np.zeros([vocab] * (new - 1))
    seen = {"accepted": 0, "rejected": 0}
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=new, policy=policy, seed=seed)
        result = SpeculativeDecoder(target, [proposer], verifier, config).generate(list(prompt))
        assert result.records[0].nodes == 0, "round 1 has no hidden state: the heads must propose nothing"
        assert result.records[1].nodes > 0, "round 2 must verify head drafts for the test to mean anything"
        counts[tuple(result.tokens[1:new])] += 1
        seen["accepted" if result.records[1].accepted else "rejected"] += 1
    return counts, seen


# ---- direct checks of a proposal against the heads ------------------------------------------

def frontier_state(target, prompt: Sequence[int]) -> list[int]:
    """Read `prompt` as the engine's first round does and commit it; returns the context (the
    greedy bonus token is the new pending one), with the frontier hidden state set."""
    target.reset()
    logits = target.verify(prompt[-1], None, unread=list(prompt[:-1]))
    target.commit([])
    return list(prompt) + [int(logits.argmax()[0])]


def head_law(headset: HeadSet, weights, policy: SamplingPolicy, h: np.ndarray, path: Sequence[int]) -> np.ndarray:
    """q [V] of the head at depth len(path) for the drafted path (pending token first), computed
    here from the head modules, the target's weights and the policy alone."""
    depth = len(path)
    state = torch.from_numpy(np.asarray(h, dtype=np.float32))[None]  # [1, d]
    with torch.inference_mode():
        if headset.arch.family == "medusa":
            out = headset.heads.head(depth, state)  # the path is not read: independent heads
        else:
            embed = torch.from_numpy(weights.embed)  # [V, d]
            out = headset.heads.path_state(depth, state, embed[list(path)][None])  # type: ignore[union-attr]
        logits = out @ torch.from_numpy(weights.lm_head)[headset.token_map].T  # [1, V_d]
    q = np.zeros(headset.arch.vocab_size)
    q[headset.token_map.numpy()] = policy.probs(logits.numpy())[0]
    return q


def node_path(result, node: int) -> list[int]:
    tokens = []
    while node != -1:
        tokens.insert(0, result.nodes[node].token)
        node = result.nodes[node].parent
    return tokens


def own_path_mismatches(result, headset: HeadSet, weights, policy: SamplingPolicy, h: np.ndarray,
                        pending: int) -> list[str]:
    """Every parent whose recorded q is not its own head's law on its own path, and every node
    whose recorded q is not its parent's q at its token."""
    bad = []
    for parent in result.distributions:
        want = head_law(headset, weights, policy, h, [pending] + node_path(result, parent))
        got = result.distributions[parent]
        problem = probs_differ(got, want)  # the proposer's heads run batched: fp32 rounding of another order
        if problem is not None:
            bad.append(f"q of parent {parent} (path {node_path(result, parent)}) {problem}")
    for i, node in enumerate(result.nodes):
        if node.q != result.distributions[node.parent][node.token]:  # the same number, recorded twice
            bad.append(f"node {i}: q {node.q} != its parent's q at token {node.token}")
    return bad


def children_law_p(proposer, target, context: Sequence[int], policy: SamplingPolicy, proposals: int,
                   without_replacement: bool) -> float:
    """Are the children drawn from the law the proposal records?  Over `proposals` seeded
    proposals from one frontier, each child is counted in the cell (its parent's path, its
    token), and the law recorded for its parent (renormalized past its earlier siblings when
    drawn without replacement, as Sequoia reads it) is added to the expected counts."""
    observed: dict[tuple, float] = {}
    expected: dict[tuple, float] = {}
    for seed in range(proposals):
        proposer.begin(policy, np.random.default_rng(seed))
        result = proposer.propose(context, "m")
        drawn: dict[int, list[int]] = {}
        for node in result.nodes:
            before = drawn.setdefault(node.parent, [])
            q = result.distributions[node.parent]
            law = without_replacement_q(q, before) if without_replacement else q
            key = tuple(node_path(result, node.parent))
            observed[key + (node.token,)] = observed.get(key + (node.token,), 0.0) + 1
            for x in np.flatnonzero(law):
                expected[key + (int(x),)] = expected.get(key + (int(x),), 0.0) + law[x]
            before.append(node.token)
    if set(observed) - set(expected):
        return 0.0  # a child the recorded law gives probability zero
    cells = sorted(expected)
    o = np.array([observed.get(c, 0.0) for c in cells])
    e = np.array([expected[c] for c in cells])
    return chi_square_p(o, e / e.sum())
