"""Draft steps only: B requests' k=4 chain steps on the 0.5B draft, batched (one draft_many per step)
vs per request (forks, one extend per request per step); interleaved, 2 repeats."""
import time
import statistics
import torch
from draftwise.measure.load import load_backend
from draftwise.backends.transformers_batch import TransformersBatch
from draftwise.backends.batch import Extend
from draftwise.workloads import first_turn_prompts
K = 4


def batched(d, prompts, B):
    tb = TransformersBatch.from_backend(d, B)
    slots = [tb.open() for _ in range(B)]
    tb.draft_many([Extend(s, tuple(prompts[i])) for i, s in enumerate(slots)])
    t = time.perf_counter()
    for _ in range(K):
        tb.draft_many([Extend(s, (13,)) for s in slots])
    return (time.perf_counter() - t) * 1e3


def per_request(d, prompts, B):
    forks = [d.fork() for _ in range(B)]
    for f, p in zip(forks, prompts):
        f.reset()
        f.extend(p)
    t = time.perf_counter()
    for _ in range(K):
        for f in forks:
            f.extend([13])
    return (time.perf_counter() - t) * 1e3


def main():
    torch.set_num_threads(2)
    d = load_backend("qwen2.5-coder-0.5b", "transformers", 2)
    prompts = first_turn_prompts(d.chat_prompt, "humaneval:0-7")
    res = {}
    for rep in range(2):
        for B in (1, 2, 4, 8):
            for name, fn in (("batched", batched), ("per-request", per_request))[:: 1 if rep % 2 == 0 else -1]:
                res.setdefault((B, name), []).append(fn(d, prompts, B))
                print(B, name, round(res[(B, name)][-1], 1), "ms for", K, "steps", flush=True)
    for (B, name), v in sorted(res.items()):
        print(f"B={B} {name}: {statistics.median(v):.0f} ms per round of {K} draft steps (runs {[round(x) for x in v]})")


if __name__ == "__main__":
    main()
