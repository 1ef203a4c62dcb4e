"""L_teacher needs the target's law at every training row.  Two ways to have it, timed here at
the shapes of the embedded model's head training (d = 576, a draft vocabulary of 8192 rows,
4 heads x 256 rows per step, the 69,723-token cached stream):

  recompute: the target's logits at a row are its LM head applied to the cached final-norm
             state, so each step multiplies [B, d] x [d, V_d] per head (no gradient);
  top-k:     one pass over the stream stores the top-k logits and the remaining mass per
             position (k = 32: ids int32 + logits fp16), and each step gathers them and
             rebuilds a [B, V_d] target (the remaining mass spread over the other rows: lossy).

Against a Hydra++ training step (4 heads of 4 residual layers + the shared LM head, forward
and backward).  One thread; run under `nice` on a shared machine, so read the ratios only.

    OMP_NUM_THREADS=1 PYTHONPATH=src nice -n 15 .venv/bin/python benchmarks/heads_training/teacher_storage.py \
        > benchmarks/heads_training/runs/<machine>-<date>-teacher-storage/result.json
"""

from __future__ import annotations

import json
import time

import torch

torch.set_num_threads(1)
D, VD, B, HEADS, N, K = 576, 8192, 256, 4, 69_723, 32


def timed(fn, repeats: int = 5) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(VD, D, generator=g) / D ** 0.5  # the LM head's draft rows [V_d, d]
    hidden = torch.randn(4096, D, generator=g).to(torch.bfloat16)  # a slice of the stream [n, d]
    pick = torch.randint(0, 4096, (B,), generator=g)
    blocks = [torch.nn.Sequential(*(torch.nn.Linear(D, D) for _ in range(4))) for _ in range(HEADS)]

    def step() -> None:  # the heads' own work in a step: forward and backward through the LM head
        loss = torch.zeros(())
        for block in blocks:
            logits = block(hidden[pick].float()) @ rows.T  # [B, V_d]
            loss = loss + torch.logsumexp(logits, -1).mean()
        loss.backward()

    def recompute() -> None:
        with torch.no_grad():
            for _ in range(HEADS):
                torch.softmax(hidden[pick].float() @ rows.T, dim=-1)  # [B, V_d]

    with torch.no_grad():
        top = (hidden[:2048].float() @ rows.T).topk(K, dim=-1)  # a stored slice: [2048, K]
    ids, values = top.indices.to(torch.int32), top.values.to(torch.float16)

    def gather() -> None:
        for _ in range(HEADS):
            p = torch.softmax(values[pick % 2048].float(), dim=-1) * 0.9  # [B, K]; 0.1: the remaining mass
            target = torch.full((B, VD), 0.1 / (VD - K))  # the rest spread evenly (the lossy part)
            target.scatter_(1, ids[pick % 2048].long(), p)

    def one_pass_chunk() -> None:  # 4096 of the stream's N positions
        with torch.no_grad():
            (hidden.float() @ rows.T).topk(K, dim=-1)

    t_step, t_re, t_gather, t_chunk = timed(step, 3), timed(recompute), timed(gather), timed(one_pass_chunk, 2)
    result = {
        "step_seconds": round(t_step, 4),
        "recompute_seconds_per_step": round(t_re, 4),
        "recompute_share_of_step": round(t_re / t_step, 3),
        "topk_gather_seconds_per_step": round(t_gather, 4),
        "topk_one_pass_seconds": round(t_chunk * N / 4096, 1),
        "topk_storage_mb": round(N * K * (4 + 2) / 1e6, 1),
        "steps_per_epoch": 198,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
