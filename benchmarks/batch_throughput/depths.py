"""How deep each method verifies in a batch, forward by forward: the closed loop of
`concurrency.sh` at one batch size for plain batched decoding, fixed-depth prompt lookup and the
batch-aware gate behind the guard, with the rows each request verified per shared forward, the
forwards' seconds by their widest request, and the tokens each request published per round, so a
gap between two methods can be read off the forwards rather than guessed from the totals.

Usage: python benchmarks/batch_throughput/depths.py [TARGET=smollm2-135m] [BATCH=2] [BACKEND=transformers]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from dataclasses import replace

import torch

from draftwise.api import open_decoder
from draftwise.bench.closed_loop import run_closed_loop
from draftwise.workloads import first_turn_prompts

PROMPT_READ = 40  # a forward with a request this wide reads a prompt: not a decoding step


def main(target: str = "smollm2-135m", batch: str = "2", backend: str = "transformers") -> None:
    torch.set_num_threads(2)
    size = int(batch)
    lookup = dict(lookup=10, ngram=2, candidates=1) if backend == "llamacpp" else {}  # concurrency.sh's
    fixed = open_decoder(proposer="prompt-lookup", target=target, backend=backend, guard=False, **lookup)
    gated = open_decoder(proposer="prompt-lookup", target=target, backend=backend, gate="auto", batch=8, **lookup)
    plain = fixed.plain()
    prompts = [(f"HumanEval/{i}", ids) for i, ids in
               enumerate(first_turn_prompts(plain.target.chat_prompt, "humaneval:0-15"))]
    config = replace(plain.spec.generation, max_new_tokens=64)
    print(f"{target} on {backend}, B = {size}, {len(prompts)} HumanEval first turns, 64 new tokens")
    for name, decoder in (("plain", plain), ("lookup", fixed), ("lookup-gate", gated)):
        engine = decoder.batch(size)
        start = time.perf_counter()
        run = run_closed_loop(engine, prompts, size, config)
        wall = time.perf_counter() - start
        tokens = sum(len(trace.tokens) for trace in run.requests)
        steady = [r for r in engine.rounds if max(r.rows) < PROMPT_READ]
        print(f"\n{name}: {tokens / wall:.2f} tok/s, {wall:.1f} s; {len(engine.rounds)} forwards, "
              f"{len(steady)} steady ({sum(r.seconds for r in steady):.1f} s), "
              f"{len(engine.rounds) - len(steady)} reading prompts ({sum(r.seconds for r in engine.rounds) - sum(r.seconds for r in steady):.1f} s)")
        widest: dict[int, list[float]] = {}
        for r in steady:
            widest.setdefault(max(r.rows), []).append(r.seconds)
        print("  steady forwards by their widest request's rows (count x median ms): " + ", ".join(
            f"{n}: {len(v)} x {statistics.median(v) * 1e3:.0f}" for n, v in sorted(widest.items())))
        reads = [r for r in engine.rounds if max(r.rows) >= PROMPT_READ]
        print("  prompt forwards (rows per request: ms): " + ", ".join(
            f"{'+'.join(str(n) for n in r.rows)}: {r.seconds * 1e3:.0f}" for r in reads))
        published = Counter(c for trace in run.requests for c in trace.chunk_tokens)
        print("  tokens a request published per round (count): " + ", ".join(
            f"{k}: {v}" for k, v in sorted(published.items())))
        if engine.harm is not None:
            arms = Counter(f"{r.arm.value}{' (explored)' if r.explored else ''}" for r in engine.harm.ledger)
            estimates = {a.value: round(v, 2) for a, v in engine.harm.estimates(size).items()}
            print(f"  guard rounds: {dict(arms)}; estimates at B = {size} (tok/s): {estimates}")


if __name__ == "__main__":
    main(*sys.argv[1:])
