"""Which chat prompts does the prompt feed change within a few tokens?  (picks the integration test's prompts)

For each Spec-Bench development question's first turn (at most --max-prompt tokens), draftwise's
llama.cpp backend computes the last prompt row's logits fed whole and split (`batch_shapes.py`);
where they differ, it decodes --new tokens greedily both ways and prints the first differing
position (None: the same text).  Output lines: question id, category, prompt tokens, largest
first-step logit difference, first differing token.

    PYTHONPATH=src .venv/bin/python benchmarks/llamacpp_plain_agreement/find_feed_sensitive.py --new 40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from draftwise.measure.load import load_backend
from draftwise.workloads import messages_for, parse_workload

sys.path.insert(0, str(Path(__file__).parent))
from measure import dw_backend_decode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--new", type=int, default=40)
    ap.add_argument("--max-prompt", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    backend = load_backend(args.model, "llamacpp", args.threads)

    def last_logits(chunks) -> np.ndarray:
        backend.reset()
        for chunk in chunks:
            logits = backend.extend(chunk).logits[0].copy()  # [V]
        return logits

    for question in parse_workload("spec-bench").questions:
        prompt = backend.chat_prompt(messages_for(question, 0, []))
        if len(prompt) > args.max_prompt:
            continue
        diff = float(np.abs(last_logits([prompt]) - last_logits([prompt[:-1], prompt[-1:]])).max())
        if diff == 0:
            continue
        whole, _, _ = dw_backend_decode(backend, prompt, args.new, whole=True)
        split, _, _ = dw_backend_decode(backend, prompt, args.new, whole=False)
        first = next((i for i, (a, b) in enumerate(zip(whole, split)) if a != b), None)
        print(question.question_id, question.category, len(prompt), round(diff, 3), first, flush=True)


if __name__ == "__main__":
    main()
