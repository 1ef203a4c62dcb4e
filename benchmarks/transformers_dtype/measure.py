"""float32 vs bfloat16 on the transformers backend: one-row decode steps, verify cost t(n) of
chains, and how long greedy plain decoding agrees between the two (plus, in bfloat16, whether
greedy prompt lookup still equals plain decoding).

Both copies of the model are loaded side by side and every timing interleaves them (A B, then
B A, ...), so a slow spell of a shared machine lands on both.  Raw medians go to a JSON file.

    PYTHONPATH=src python benchmarks/transformers_dtype/measure.py --target smollm2-135m --out DIR/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftwise.api import open_decoder
from draftwise.measure.dtype import DtypeTiming, cpu_bf16_flags, time_one_row_steps
from draftwise.measure.profile import machine_description, profile_verify_cost
from draftwise.measure.load import load_backend
from draftwise.runtime.round import GenerationConfig
from draftwise.spec import DecoderSpec
from draftwise.workloads import messages_for, parse_workload

DTYPES = ("float32", "bfloat16")


def first_difference(a, b) -> int | None:
    """Index of the first token where two outputs part; None when they agree throughout."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--prefix-len", type=int, default=256)
    parser.add_argument("--passes", type=int, default=3, help="interleaved passes of every timing")
    parser.add_argument("--steps", type=int, default=6, help="one-row steps per dtype per pass")
    parser.add_argument("--workload", default="humaneval:0-4")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--spec-check", type=int, default=5, help="prompts on which bf16 prompt lookup is checked")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = tuple(int(r) for r in args.rows.split(","))
    backends = {d: load_backend(args.target, "transformers", args.threads, dtype=d) for d in DTYPES}
    result: dict = {"target": args.target, "checkpoint": backends["float32"].info.checkpoint,
                    "threads": torch.get_num_threads(), "machine": machine_description(),
                    "cpu_bf16_flags": list(cpu_bf16_flags()), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "torch": torch.__version__, "shared_machine": True}

    # (a) one-row decode steps
    timing = DtypeTiming(prefix_len=args.prefix_len, steps=args.steps, passes=2 * args.passes)
    step = time_one_row_steps(backends, timing)
    result["one_row_step_median_s"] = step
    result["one_row_speedup_bf16"] = step["float32"] / step["bfloat16"]
    print("one-row step", step, f"bf16 speedup {result['one_row_speedup_bf16']:.2f}x", flush=True)
    save(args.out, result)

    # (b) verify cost of chains t(n): a profile per dtype per pass, the order alternating
    profiles: dict[str, list[list[float]]] = {d: [] for d in DTYPES}
    for sweep in range(args.passes):
        for d in DTYPES if sweep % 2 == 0 else DTYPES[::-1]:
            measured = profile_verify_cost(backends[d], prefix_len=args.prefix_len, rows=rows, repeats=2, chain=True)
            profiles[d].append(measured["absolute_s"])
    verify = {d: [statistics.median(p[i] for p in profiles[d]) for i in range(len(rows))] for d in DTYPES}
    result["verify_rows"] = list(rows)
    result["verify_median_s"] = verify
    result["verify_relative"] = {d: [v / verify[d][0] for v in verify[d]] for d in DTYPES}
    result["verify_speedup_bf16"] = [f / b for f, b in zip(verify["float32"], verify["bfloat16"])]
    print("verify", json.dumps(result["verify_speedup_bf16"]), flush=True)
    save(args.out, result)

    # (c) greedy agreement of plain decoding, and bf16 prompt lookup == bf16 plain
    generation = GenerationConfig(max_new_tokens=args.new_tokens)
    decoders = {d: open_decoder(DecoderSpec(target=args.target, backend="transformers", dtype=d, generation=generation),
                                loader=lambda model, kind, role, d=d: backends[d], proposer="none") for d in DTYPES}
    questions = parse_workload(args.workload).questions
    agreement, plain_tps = [], {d: [] for d in DTYPES}
    plain_outputs = []
    for i, question in enumerate(questions):
        prompt = backends["float32"].chat_prompt(messages_for(question, 0, []))
        outputs = {}
        for d in DTYPES if i % 2 == 0 else DTYPES[::-1]:
            out = decoders[d].generate(prompt)
            outputs[d] = out.tokens
            plain_tps[d].append(out.stats.tokens_per_s)
        plain_outputs.append((prompt, outputs))
        part = first_difference(outputs["float32"], outputs["bfloat16"])
        agreement.append({"question": question.question_id, "prompt_tokens": len(prompt),
                          "tokens": [len(outputs["float32"]), len(outputs["bfloat16"])], "first_difference": part})
        print("agreement", agreement[-1], flush=True)
        result["greedy_agreement"] = agreement
        save(args.out, result)
    result["plain_tokens_per_s_median"] = {d: statistics.median(v) for d, v in plain_tps.items()}
    # greedy prompt lookup against plain decoding of the same dtype: exact speculative decoding
    # reproduces its target, but only as far as a forward of many rows computes the same logits
    # as a one-row step (the target's own batch invariance)
    checks: dict[str, list] = {d: [] for d in DTYPES}
    for d in DTYPES:
        lookup = open_decoder(DecoderSpec(target=args.target, backend="transformers", dtype=d, generation=generation),
                              loader=lambda model, kind, role, d=d: backends[d], proposer="prompt-lookup")
        for prompt, outputs in plain_outputs[: args.spec_check]:
            out = lookup.generate(prompt)
            checks[d].append({"identical_to_plain": out.tokens == outputs[d], "draft_tokens": int(sum(out.from_draft)),
                              "first_difference": first_difference(out.tokens, outputs[d])})
    result["prompt_lookup_vs_plain"] = checks
    print("prompt lookup vs plain", checks, flush=True)
    save(args.out, result)


def save(out: Path, result: dict) -> None:
    """After every section: a run stopped part way keeps what it measured."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - started:.0f} s")
