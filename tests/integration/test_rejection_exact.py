"""Rejection sampling is exact: on tiny random models the first two emitted tokens follow the
target's exact joint law (chi-square, fixed seed), and a planted bug (sampling q instead of
the residual after a rejection) is caught by the same test."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from draftwise.backends.base import BackendInfo
from draftwise.backends.transformers import TransformersBackend
from draftwise.engine import GenerationConfig, SpeculativeDecoder
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.sampling import SamplingPolicy, sample
from draftwise.verify.base import Selection
from draftwise.verify.rejection import RejectionVerifier, accept_probability

V = 8
PROMPT = [1, 2, 3]
SAMPLES = 2000


class TinyTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids)


def tiny_backend(seed: int) -> TransformersBackend:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.6, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    info = BackendInfo(name="transformers", checkpoint=f"tiny-llama-seed{seed}", tokenizer_hash="tiny", vocab_size=V,
                       context_length=64, dtype="float32", device="cpu", eos_token_ids=frozenset({V + 1}))
    return TransformersBackend(model, TinyTokenizer(), info)


def exact_joint(target: TransformersBackend) -> np.ndarray:
    policy = SamplingPolicy(temperature=1.0)

    def next_probs(tokens):
        target.reset()
        target.extend(tokens[:-1])
        p = target.verify(tokens[-1], None).probs(0, policy)
        target.rollback()
        return p

    p1 = next_probs(PROMPT)
    return np.stack([p1[x] * next_probs(PROMPT + [x]) for x in range(V)])  # [V, V]


class ResidualIsQ(RejectionVerifier):
    """Planted bug: after a rejection, sample the proposal q instead of (p - q)+."""

    def select(self, round_, target, policy, rng):
        accepted, row = [], -1
        while True:
            p = target.probs(row + 1, policy)
            children = round_.children_of(row)
            if not children:
                return Selection(tuple(accepted), sample(p, rng))
            (child,) = children
            q = round_.q_dist[0][row]
            x = int(round_.token_ids[child])
            if rng.random() < accept_probability(float(p[x]), float(q[x])):
                accepted.append(child)
                row = child
                continue
            return Selection(tuple(accepted), sample(q, rng))


def p_value(verifier, target, draft, joint) -> float:
    proposer = DraftModelProposer(draft, "tiny", DraftConfig(k=2, confidence_threshold=0.0))
    counts = np.zeros((V, V))
    for seed in range(SAMPLES):
        config = GenerationConfig(max_new_tokens=2, policy=SamplingPolicy(temperature=1.0), seed=seed)
        tokens = SpeculativeDecoder(target, [proposer], verifier, config).generate(PROMPT).tokens
        counts[tokens[0], tokens[1]] += 1
    expected = joint.ravel() * SAMPLES
    big = expected >= 5  # pool the sparse cells so the chi-square approximation holds
    observed = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    return float(chisquare(observed, expected).pvalue)


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_backend(0), tiny_backend(1)
    return target, draft, exact_joint(target)


def test_rejection_matches_exact_target_law(models):
    target, draft, joint = models
    assert p_value(RejectionVerifier(), target, draft, joint) > 1e-3


def test_planted_bug_is_caught(models):
    target, draft, joint = models
    assert p_value(ResidualIsQ(), target, draft, joint) < 1e-6
