"""Tiny randomly initialised Llamas behind the real transformers backend, the exact joint law
of their first two emitted tokens, and the chi-square test the distribution tests share.
Round 1, with room for two tokens, verifies a depth-1 draft (in the forward that reads the
prompt) and emits both: a rejected draft's residual sample, or an accepted draft and its bonus.

The models are small enough for thousands of seeded generations in seconds, and peaked
(initializer_range 0.6) so that target and draft disagree often: every residual branch of a
verifier is exercised."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from scipy.stats import chisquare

from draftwise.backends.base import BackendInfo
from draftwise.backends.transformers import TransformersBackend
from draftwise.backends.transformers_batch import TorchLogits
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.logits import NumpyLogits

V = 8
PROMPT = [1, 2, 3]


class TinyTokenizer:
    """Text <-> ids for an 8-token vocabulary: enough for the backend's tokenize/decode calls."""

    def __call__(self, text, add_special_tokens=True):
        return type("Encoding", (), {"input_ids": [ord(c) % V for c in text]})()

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


class LogitsPathBackend:
    """The same backend, but its verify hands the verifier the logits through a chosen path:
    NumpyLogits over a host copy (the reference) or TorchLogits forced through the batched
    torch pass (what an accelerator runs; on the CPU the backend would pick NumPy itself)."""

    def __init__(self, backend: TransformersBackend, path: str) -> None:
        self._backend, self._path = backend, path

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def verify(self, *args, **kwargs):
        logits = self._backend.verify(*args, **kwargs).logits  # [1 + N, V]
        return NumpyLogits(logits.numpy()) if self._path == "numpy" else TorchLogits(logits, on_device=True)


LOGITS_PATHS = {path: (lambda backend, path=path: LogitsPathBackend(backend, path)) for path in ("numpy", "torch")}


def exact_joint(target: TransformersBackend, policy: SamplingPolicy, prompt: Sequence[int] = PROMPT) -> np.ndarray:
    """[V, V]: P(first emitted token = a, second = b) after `prompt` under the target alone."""

    def next_probs(tokens: Sequence[int]) -> np.ndarray:
        target.reset()
        target.extend(list(tokens[:-1]))
        # the NumPy reference on the model's logits: the law the torch path is tested against
        p = policy.probs(target.verify(tokens[-1], None).logits[0].numpy())
        target.rollback()
        return p

    p1 = next_probs(list(prompt))
    return np.stack([p1[x] * next_probs([*prompt, x]) for x in range(V)])


def first_two_counts(target, proposer, verifier, policy: SamplingPolicy, samples: int) -> np.ndarray:
    """[V, V] counts of the first two emitted tokens over `samples` seeded generations."""
    counts = np.zeros((V, V))
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, policy=policy, seed=seed)
        result = SpeculativeDecoder(target, [proposer], verifier, config).generate(PROMPT)
        assert result.records[0].nodes > 0, "round 1 must verify drafts for the test to mean anything"
        counts[result.tokens[0], result.tokens[1]] += 1
    return counts


def chi_square_p(counts: np.ndarray, joint: np.ndarray) -> float:
    """Goodness of fit of `counts` to the law `joint`; cells expecting < 5 are pooled so the
    chi-square approximation holds."""
    samples = counts.sum()
    expected = joint.ravel() * samples
    big = expected >= 5
    observed, pooled, pooled_observed = counts.ravel()[big], expected[~big].sum(), counts.ravel()[~big].sum()
    expected = expected[big]
    if pooled == 0 and pooled_observed > 0:
        return 0.0  # tokens the law never emits
    if pooled > 0:  # no small cell: no pooled cell (an empty one would read 0 / 0)
        observed, expected = np.append(observed, pooled_observed), np.append(expected, pooled)
    return float(chisquare(observed, expected).pvalue)
