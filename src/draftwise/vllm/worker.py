"""Offline generation inside .venv-vllm: one vLLM engine per method, the prompts in groups of B
for each batch size, token ids and wall time back as JSON.  Run by `draftwise.vllm.runner`:

    PYTHONPATH=src .venv-vllm/bin/python -m draftwise.vllm.worker REQUEST.json RESULT.json

Greedy (temperature 0), prompts given as token ids so that vLLM reads exactly the tokens
draftwise reads.  Imports vllm: never import this module from draftwise's own environment.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from draftwise.vllm.methods import profiling_method
from draftwise.vllm.protocol import SESSION_MARK, BatchResult, ProfileRequest, SessionRequest, VllmMethod, WorkerRequest

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}


def spec_counters(llm: Any) -> dict[str, float]:
    return {short: float(m.value) for m in llm.get_metrics()
            if (short := SPEC_COUNTERS.get(m.name)) is not None and hasattr(m, "value")}


def engine(request: WorkerRequest | ProfileRequest | SessionRequest, method: VllmMethod) -> Any:
    from vllm import LLM

    os.environ.update(method.env)  # this worker process's own environment, read by a custom proposer
    return LLM(model=request.model, dtype=request.dtype, max_model_len=request.max_model_len,
               max_num_seqs=max(request.batch_sizes), speculative_config=dict(method.speculative_config or {}) or None,
               enforce_eager=request.enforce_eager, disable_log_stats=False, seed=0,
               # each batch size re-runs the same prompts: a cached prefix would make later sizes cheaper
               enable_prefix_caching=False)


def run_method(request: WorkerRequest, method: VllmMethod) -> list[BatchResult]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = engine(request, method)
    load_s = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=request.max_tokens, ignore_eos=request.ignore_eos)
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in request.prompts]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up
    results = []
    for batch in request.batch_sizes:
        before = spec_counters(llm)
        tokens: list[tuple[int, ...]] = []
        start = time.perf_counter()
        for i in range(0, len(prompts), batch):  # each group runs as one concurrent batch
            outputs = llm.generate(prompts[i:i + batch], params, use_tqdm=False)
            tokens.extend(tuple(o.outputs[0].token_ids) for o in outputs)
        wall = time.perf_counter() - start
        after = spec_counters(llm)
        results.append(BatchResult(method=method.name, batch=batch, tokens=tuple(tokens), wall_s=wall,
                                   new_tokens=sum(len(t) for t in tokens), load_s=load_s,
                                   spec_counters={k: after[k] - before.get(k, 0.0) for k in after}))
        print(f"[vllm worker] {method.name} B={batch}: {results[-1].tokens_per_s:.1f} tok/s", file=sys.stderr, flush=True)
    del llm
    gc.collect()
    return results


def profile_step_seconds(llm: Any, request: ProfileRequest, batch: int) -> float:
    """Median seconds of one decoding step of `batch` requests (prefill subtracted out)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = 1000  # ordinary token ids, distinct per slot so that no two requests share a prefix
    prompts = [TokensPrompt(prompt_token_ids=[100 + (7 * b + 13 * i) % vocab for i in range(request.prefix_len)])
               for b in range(batch)]

    def wall(tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    wall(request.short)  # warm-up
    samples = sorted((wall(request.long) - wall(request.short)) / (request.long - request.short)
                     for _ in range(request.repeats))
    return samples[len(samples) // 2]


def run_profile(request: ProfileRequest) -> dict[str, Any]:
    """{"rows": [...], "seconds": {B: [median step seconds per n]}}."""
    seconds: dict[int, list[float]] = {b: [] for b in request.batch_sizes}
    for rows in request.rows:
        llm = engine(request, profiling_method(rows))
        for batch in request.batch_sizes:
            seconds[batch].append(profile_step_seconds(llm, request, batch))
            print(f"[vllm worker] profile n={rows} B={batch}: {seconds[batch][-1] * 1e3:.1f} ms", file=sys.stderr,
                  flush=True)
        del llm
        gc.collect()
    return {"rows": list(request.rows), "seconds": {str(b): s for b, s in seconds.items()}}


def serve(request: SessionRequest) -> None:
    """One engine; each stdin line {"prompts": [[ids]], "max_tokens": N} runs as one concurrent
    batch and is answered on stdout with SESSION_MARK + {"tokens", "wall_s", "spec_counters"}."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = engine(request, request.method)
    print(SESSION_MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        before = spec_counters(llm)
        params = SamplingParams(temperature=0.0, max_tokens=int(ask["max_tokens"]))
        start = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in ask["prompts"]], params, use_tqdm=False)
        wall = time.perf_counter() - start
        after = spec_counters(llm)
        print(SESSION_MARK + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs], "wall_s": wall,
                                 "spec_counters": {k: after[k] - before.get(k, 0.0) for k in after}}), flush=True)


def main(argv: list[str]) -> int:
    body = json.loads(open(argv[0]).read())
    if body.get("kind") == "session":
        serve(SessionRequest.from_json(body))
        return 0
    if body.get("kind") == "profile":
        with open(argv[1], "w") as handle:
            json.dump(run_profile(ProfileRequest.from_json(body)), handle)
        return 0
    request = WorkerRequest.from_json(body)
    out: dict[str, Any] = {"results": [], "errors": {}}
    for method in request.methods:
        try:
            out["results"].extend(asdict(r) for r in run_method(request, method))
        except Exception as exc:  # vLLM refused this configuration (its root cause is in the log): the others still run
            out["errors"][method.name] = f"{type(exc).__name__}: {exc}"
            print(f"[vllm worker] {method.name} failed: {exc}", file=sys.stderr, flush=True)
        with open(argv[1], "w") as handle:  # after every method: a crash keeps the earlier results
            json.dump(out, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
