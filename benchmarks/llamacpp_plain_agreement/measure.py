"""Why llama-cpp-python's plain greedy generation differs from draftwise's llama.cpp plain decoding.

Decodes the first turns of Spec-Bench development questions greedily four ways on ONE model file:

  peer        the bench's `llamacpp-plain` peer as it runs (LlamaCppExecutor: `Llama.generate(prompt)`,
              the whole prompt in one batch, then one row per step)
  dw          draftwise plain decoding as the bench runs it (DraftwiseExecutor, `dw:proposer=none,backend=llamacpp`:
              prompt[:-1] in 512-row chunks, the last prompt token alone in the first step, then one row per step)
  peer-split  llama-cpp-python fed like draftwise: `reset(); eval(prompt[:-1]); generate([prompt[-1]], reset=False)`
  dw-whole    draftwise's llama.cpp backend fed like `Llama.generate`: `extend(prompt)` (the whole prompt in one
              batch, its last row's logits pick the first token), then verify/commit one row per step
  peer-like   the bench's like-for-like peer, `llamacpp-plain:feed=draftwise` (peer-split's feed, on a `Llama`
              opened with draftwise's context settings: bench/pool.py `draftwise_context_settings`)

and compares them token for token.  peer-split and dw-whole record each step's logits (top-2 margin) so a
divergence can be told apart from an argmax tie; the first step's logits of the four are compared too.
It also dumps the llama_context_params of draftwise's backend and of the bench's two `Llama`s, field by field.

    PYTHONPATH=src .venv/bin/python benchmarks/llamacpp_plain_agreement/measure.py \
        --model smollm2-135m --workload spec-bench:10 --new 96 --out benchmarks/llamacpp_plain_agreement/runs/<machine>-<date>/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import llama_cpp
import numpy as np

from draftwise.bench.executors import prepare
from draftwise.bench.methods import MethodDefaults, parse_method
from draftwise.bench.pool import ModelPool
from draftwise.runtime.round import GenerationConfig
from draftwise.workloads import first_turn_prompts

GREEDY = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0)


def cparams_dict(params) -> dict:
    out = {}
    for name, _ in params._fields_:
        value = getattr(params, name)
        if isinstance(value, (int, float, bool)):
            out[name] = value
    return out


def margin(row: np.ndarray) -> tuple[int, float]:
    top = np.argsort(row)[::-1][:2]
    return int(top[0]), float(row[top[0]] - row[top[1]])


def dw_backend_decode(backend, prompt: list[int], new: int, whole: bool) -> tuple[list[int], list[float], np.ndarray]:
    """Plain greedy decode on draftwise's llama.cpp backend; whole=True feeds the prompt in one batch."""
    backend.reset()
    if whole:
        logits = backend.extend(prompt).logits[0].copy()  # [V]
    else:
        backend.extend(prompt[:-1]) if len(prompt) > 1 else None
        logits = np.array(backend.verify(prompt[-1], None).logits[0])  # [V]
        backend.commit([])
    first = logits.copy()
    tokens, margins = [], []
    eos = backend.info.eos_token_ids
    while True:
        token, gap = margin(logits)
        tokens.append(token)
        margins.append(gap)
        if token in eos or len(tokens) >= new:
            break
        logits = np.array(backend.verify(token, None).logits[0])
        backend.commit([])
    backend.reset()
    return tokens, margins, first


def llama_split_decode(llama, prompt: list[int], new: int, eos) -> tuple[list[int], list[float], np.ndarray]:
    """llama-cpp-python fed as draftwise feeds it: prompt[:-1] by eval, the last token alone in generate."""
    llama.reset()
    if len(prompt) > 1:
        llama.eval(prompt[:-1])
    assert llama.n_tokens == len(prompt) - 1
    tokens, margins, first = [], [], None
    iterator = llama.generate([prompt[-1]], reset=False, **GREEDY)
    for token in iterator:
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(llama.n_vocab(),))
        if first is None:
            first = row.copy()
        picked, gap = margin(row)
        assert picked == token, (picked, token)  # llama.cpp's greedy sampler = first argmax of these logits
        tokens.append(int(token))
        margins.append(gap)
        if token in eos or len(tokens) >= new:
            break
    iterator.close()
    return tokens, margins, first


def llama_whole_first_logits(llama, prompt: list[int]) -> np.ndarray:
    llama.reset()
    llama.eval(prompt)
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(llama.n_vocab(),)).copy()


def first_difference(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def write(args, captured: dict, differing: dict, rows: list, prompts: int, seconds: float) -> dict:
    """The result file, rewritten after every prompt (a run stopped midway keeps what it measured)."""
    counts = {name: sum(r["pairs"][name]["agree"] for r in rows) for name in rows[0]["pairs"]}
    result = {
        "model": args.model,
        "workload": args.workload,
        "new_tokens": args.new,
        "threads": args.threads,
        "llama_cpp_python": llama_cpp.__version__,
        "prompts": prompts,
        "prompts_done": len(rows),
        "agree_counts": counts,
        "dw_backend_split_equals_dw_engine": sum(r["dw_backend_split_equals_dw_engine"] for r in rows),
        "context_params_differing_from_draftwise (draftwise's, Llama's)": differing,
        "context_params": captured,
        "seconds": round(seconds, 1),
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--workload", default="spec-bench:10")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)

    generation = GenerationConfig(max_new_tokens=args.new)
    defaults = MethodDefaults(target=args.model, draft=None, generation=generation)
    pool = ModelPool(threads=args.threads, seed=0)

    captured = {}
    original = llama_cpp.llama_init_from_model

    def capture(model, params):
        captured.setdefault("draftwise", cparams_dict(params))
        return original(model, params)

    llama_cpp.llama_init_from_model = capture
    try:
        dw = prepare(parse_method("dw=dw:proposer=none,backend=llamacpp", defaults), pool, generation)
    finally:
        llama_cpp.llama_init_from_model = original
    peer = prepare(parse_method("peer=llamacpp-plain", defaults), pool, generation)
    like = prepare(parse_method("like=llamacpp-plain:feed=draftwise", defaults), pool, generation)
    llama = peer.llama
    captured["llama_cpp_python"] = cparams_dict(llama.context_params)
    captured["llama_cpp_python_feed_draftwise"] = cparams_dict(like.llama.context_params)
    differing = {other: {k: (v, captured[other].get(k)) for k, v in captured["draftwise"].items()
                         if captured[other].get(k) != v}
                 for other in ("llama_cpp_python", "llama_cpp_python_feed_draftwise")}
    # a second, private draftwise backend for the low-level runs (the bench's stays untouched)
    from draftwise.measure.load import load_backend
    backend = load_backend(args.model, "llamacpp", args.threads)
    eos = backend.info.eos_token_ids

    prompts = first_turn_prompts(backend.chat_prompt, args.workload)
    rows = []
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        runs = {
            "peer": list(peer.run(prompt, args.new).tokens),
            "dw": list(dw.run(prompt, args.new).tokens),
        }
        runs["peer-split"], m_peer_split, f_peer_split = llama_split_decode(llama, prompt, args.new, eos)
        runs["peer-like"] = list(like.run(prompt, args.new).tokens)
        runs["dw-whole"], m_dw_whole, f_dw_whole = dw_backend_decode(backend, prompt, args.new, whole=True)
        dw_split_tokens, m_dw_split, f_dw_split = dw_backend_decode(backend, prompt, args.new, whole=False)
        f_peer_whole = llama_whole_first_logits(llama, prompt)
        pairs = {}
        for a, b in (("peer", "dw"), ("peer-split", "dw"), ("peer-like", "dw"), ("peer", "dw-whole"),
                     ("peer", "peer-split"), ("dw", "dw-whole")):
            d = first_difference(runs[a], runs[b])
            entry = {"agree": d is None, "first_difference": d}
            if d is not None:  # margins at the divergence, under each feeding (same context up to d)
                split_m = m_peer_split if runs["peer-split"][:d] == runs[a][:d] else None
                whole_m = m_dw_whole if runs["dw-whole"][:d] == runs[a][:d] else None
                entry["top2_margin_at_difference"] = {
                    "split_feed": None if split_m is None or d >= len(split_m) else round(split_m[d], 4),
                    "whole_feed": None if whole_m is None or d >= len(whole_m) else round(whole_m[d], 4),
                }
            pairs[f"{a} vs {b}"] = entry
        row = {
            "index": i,
            "prompt_tokens": len(prompt),
            "new_tokens": {k: len(v) for k, v in runs.items()},
            "pairs": pairs,
            "dw_backend_split_equals_dw_engine": dw_split_tokens == runs["dw"],
            "first_step_logits_max_abs_diff": {
                "peer whole vs dw-backend whole": float(np.abs(f_peer_whole - f_dw_whole).max()),
                "peer split vs dw-backend split": float(np.abs(f_peer_split - f_dw_split).max()),
                "whole vs split (dw backend)": float(np.abs(f_dw_whole - f_dw_split).max()),
            },
            "min_top2_margin_first_16": {"split": round(min(m_dw_split[:16]), 4), "whole": round(min(m_dw_whole[:16]), 4)},
        }
        rows.append(row)
        print(json.dumps({"index": i, "prompt_tokens": len(prompt),
                          **{k: v["first_difference"] for k, v in pairs.items()}}), flush=True)
        counts = write(args, captured, differing, rows, len(prompts), time.perf_counter() - t0)
    print(json.dumps({"agree_counts": counts, "differing_params": differing}, indent=1))


if __name__ == "__main__":
    main()
