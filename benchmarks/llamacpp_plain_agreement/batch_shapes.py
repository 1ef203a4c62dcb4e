"""Is a prompt's last row computed the same alone and inside a batch?  (llama.cpp CPU, one model file)

For every prefix length n of one long chat prompt, the last row's logits under three feeds of
draftwise's llama.cpp backend (`extend`, last row's logits only):
  whole   the n tokens in one batch                  (Llama.generate)
  split   n - 1 tokens, then the last one alone      (draftwise's engine)
  last2   n - 2 tokens, then the last two together   (a two-row batch)
and the largest absolute logit difference of each pair.

    PYTHONPATH=src .venv/bin/python benchmarks/llamacpp_plain_agreement/batch_shapes.py \
        --model smollm2-135m --out benchmarks/llamacpp_plain_agreement/runs/<machine>-<date>/batch_shapes_smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from draftwise.measure.load import load_backend
from draftwise.workloads import first_turn_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--workload", default="spec-bench:10", help="the longest first turn of these is the prompt")
    ap.add_argument("--lengths", default="3-80", help="prefix lengths A-B")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    backend = load_backend(args.model, "llamacpp", args.threads)
    prompt = max(first_turn_prompts(backend.chat_prompt, args.workload), key=len)
    lo, hi = (int(x) for x in args.lengths.split("-"))

    def last_logits(chunks) -> np.ndarray:
        backend.reset()
        for chunk in chunks:
            logits = backend.extend(chunk).logits[0].copy()  # [V]
        return logits

    rows = []
    for n in range(lo, min(hi, len(prompt)) + 1):
        p = prompt[:n]
        whole, split, last2 = last_logits([p]), last_logits([p[:-1], p[-1:]]), last_logits([p[:-2], p[-2:]])
        rows.append({"n": n,
                     "whole_vs_split": float(np.abs(whole - split).max()),
                     "whole_vs_last2": float(np.abs(whole - last2).max()),
                     "split_vs_last2": float(np.abs(split - last2).max()),
                     "argmax_whole_split_differ": int(whole.argmax()) != int(split.argmax())})
    summary = {name: {"lengths_differing": sum(r[name] > 0 for r in rows),
                      "max_abs": max(r[name] for r in rows)}
               for name in ("whole_vs_split", "whole_vs_last2", "split_vs_last2")}
    result = {"model": args.model, "threads": args.threads, "prompt_tokens": len(prompt), "lengths": [lo, hi],
              "summary": summary, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
