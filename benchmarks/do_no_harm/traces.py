"""Greedy answers of the embedded model to code and chat prompts: the traces `simulate.py` replays.

Prompt lookup is deterministic in the text, and at temperature 0 every arm publishes the same
tokens, so from (prompt, greedy answer) alone one can tell, for every position, what a lookup
round started there would propose and how much of it the target accepts.  That lets
`simulate.py` replay the do-no-harm controller's decisions on real text without a model.

    PYTHONPATH=src .venv/bin/python benchmarks/do_no_harm/traces.py \\
        --workload humaneval:0-15 --workload spec-bench:13 --max-new 128 --out benchmarks/do_no_harm/traces.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from draftwise.api import open_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.spec import DecoderSpec
from draftwise.workloads import first_turn_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", required=True)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--backend", default="transformers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    base = DecoderSpec(threads=args.threads, generation=GenerationConfig(max_new_tokens=args.max_new))
    decoder = open_decoder(base, proposer="none", backend=args.backend)  # greedy: the default policy
    traces = []
    for workload in args.workload:
        prompts = first_turn_prompts(decoder.target.chat_prompt, workload)
        for number, prompt in enumerate(prompts):
            start = time.perf_counter()
            result = decoder.generate(prompt)
            traces.append({"workload": workload, "number": number, "prompt": list(prompt),
                           "answer": list(result.tokens)})
            logging.info("%s #%d: %d tokens in %.1f s", workload, number, len(result.tokens),
                         time.perf_counter() - start)
            args.out.write_text(json.dumps({"backend": args.backend, "max_new": args.max_new, "traces": traces}))


if __name__ == "__main__":
    main()
