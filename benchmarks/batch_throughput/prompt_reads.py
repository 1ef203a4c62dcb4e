"""Where a guarded batch's time goes next to plain batched decoding: prompt reads, steady rounds, the guard's arms.

The closed loop of `draftwise bench --concurrency` (16 HumanEval first turns, 64 new tokens, B in
flight), run with plain batched decoding and with gated prompt lookup behind the batch's guard,
interleaved.  Per run it prints the wall time, the forwards that read a prompt (rows, seconds)
and the steady ones, and for the guarded batch the guard's ledger at B (the arm of every
counted round, S or p) and its final estimates.  It shows what the guard's rounds do not see:
plain rounds keep requests of equal length in step, so they read their successors' prompts
together; speculating requests read them one by one.

    PYTHONPATH=src .venv/bin/python benchmarks/batch_throughput/prompt_reads.py --backend llamacpp --batch 8 --repeats 3 [--margin 0]
"""

from __future__ import annotations

import argparse
import time

from draftwise.api import open_decoder
from draftwise.runtime.guard import DoNoHarm, DoNoHarmConfig
from draftwise.bench.closed_loop import run_closed_loop
from draftwise.runtime.round import GenerationConfig
from draftwise.spec import DecoderSpec
from draftwise.workloads import parse_workload

PROMPT_READ_ROWS = 40  # a forward wider than this read a prompt (HumanEval prompts are 120-290 tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="llamacpp", choices=("llamacpp", "transformers"))
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", default="humaneval:0-15")
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--margin", type=float, default=None,
                        help="the guard's batch_margin (default: DoNoHarmConfig's); 0 shows the side costs it stands for")
    args = parser.parse_args()

    base = DecoderSpec(threads=2, generation=GenerationConfig(max_new_tokens=args.max_new))
    common = dict(target=args.target, backend=args.backend)
    lookup = dict(lookup=10, ngram=2, candidates=1) if args.backend == "llamacpp" else {}
    decoders = {"plain": open_decoder(base, proposer="none", **common),
                "guarded": open_decoder(base, proposer="prompt-lookup", gate="auto", batch=8, **lookup, **common)}
    plain = decoders["plain"]
    prompts = [(q.question_id, plain.target.chat_prompt([{"role": "user", "content": q.turns[0]}]))
               for q in parse_workload(args.workload).questions]
    for decoder in decoders.values():  # warm-up
        run_closed_loop(decoder.batch(args.batch), prompts[: args.batch], args.batch, decoder.spec.generation)
    for repeat in range(args.repeats):
        for name, decoder in decoders.items():
            engine = decoder.batch(args.batch)
            if engine.harm is not None and args.margin is not None:
                engine.harm = DoNoHarm(DoNoHarmConfig(batch_margin=args.margin))
            start = time.perf_counter()
            run = run_closed_loop(engine, prompts, args.batch, decoder.spec.generation)
            wall = time.perf_counter() - start
            tokens = sum(len(r.tokens) for r in run.requests)
            reads = [r for r in engine.rounds if sum(r.rows) > PROMPT_READ_ROWS]
            steady = [r for r in engine.rounds if sum(r.rows) <= PROMPT_READ_ROWS]
            line = (f"repeat {repeat} {name:8s} {tokens / wall:6.2f} tok/s  wall {wall:5.2f} s  forwards {len(engine.rounds)}"
                    f"  prompt reads {len(reads)} ({sum(sum(r.rows) for r in reads)} rows, {sum(r.seconds for r in reads):.2f} s)"
                    f"  steady {len(steady)} ({sum(sum(r.rows) for r in steady)} rows, {sum(r.seconds for r in steady):.2f} s)")
            if engine.harm is not None:
                arms = "".join("S" if r.arm.value == "speculate" else "p" for r in engine.harm.ledger if r.batch == args.batch)
                estimates = {arm.value: round(v, 1) for arm, v in engine.harm.estimates(args.batch).items()}
                line += f"\n    guard at B={args.batch}: {arms}  estimates tok/s {estimates}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
