"""The near-tie rule for greedy output on the llama.cpp backend (see test_llamacpp_engine.py).

llama.cpp's CPU kernels are not batch-invariant, so a speculative decoder's greedy output may
part from plain decoding where plain decoding itself was a near-tie (top-2 logit margin below
NEAR_TIE); anywhere else a divergence is a bug.
"""

import numpy as np

NEAR_TIE = 1.0  # above the measured batching noise (max 0.76), see test_llamacpp_backend.py


def top2_margin(backend, tokens) -> float:
    backend.reset()
    backend.extend(tokens[:-1])
    logits = np.array(backend.verify(tokens[-1], None).logits[0])
    backend.rollback()
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def assert_matches_plain(backend, prompt, got, reference) -> bool:
    """True if identical; a divergence is allowed only where plain decoding was a near-tie."""
    if got == reference:
        return True
    first = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), min(len(got), len(reference)))
    margin = top2_margin(backend, list(prompt) + list(reference[:first]))
    assert margin < NEAR_TIE, f"diverged at token {first} where plain decoding had a clear margin {margin:.2f}"
    return False
