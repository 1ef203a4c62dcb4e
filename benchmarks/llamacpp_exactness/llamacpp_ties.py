"""Issue 30: is every greedy divergence of a llama.cpp bench run a near-tie within the probe's bound?

For each method and question, the first turn whose tokens differ from the method's reference
(its backend's plain decoding, as the bench checked them) is replayed: plain decoding's top-2
logit margin at the parting token, on the same prompt and the reference's tokens up to there,
against the near-tie bound of the target's invariance probe (2x the largest row difference
measured for those kernels).  Later turns of that question are not counted again: their
prompts hold the earlier, already different, answer.  Writes ties.json beside the run.

    python benchmarks/llamacpp_exactness/llamacpp_ties.py RUN_DIR --workload humaneval:0-19 --workload spec-bench:40
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.measure.invariance import SHAPES, cached_probe, find_divergence
from draftwise.bench.main import finish
from draftwise.measure.load import load_backend
from draftwise.workloads import messages_for, parse_workloads


def answers(run: Path, method: str) -> dict[str, list[list[int]]]:
    out = {}
    for line in (run / "answers" / f"{method}.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["question_id"]] = [t["tokens"] for t in row["draftwise"]["turns"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("--workload", action="append", required=True)
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    summary = json.loads((args.run / "summary.json").read_text())
    questions = {q.question_id: q for q in parse_workloads(args.workload).questions}
    backends = {}
    result = {}
    for name, method in summary["methods"].items():
        reference = method.get("reference")
        if not reference or reference == name or method["backend"] != "llamacpp" or not method["config"].startswith("dw:"):
            continue
        family = method.get("family") or method["backend"] + (" strict trees" if "strict=true" in method["config"] else "")
        scope = family.split(" strict ")[1].split()[0] if " strict " in family else None  # earlier runs: trees
        if scope not in backends:
            backends[scope] = load_backend(args.target, "llamacpp", args.threads, strict=scope)
        backend = backends[scope]
        probe = cached_probe(backend, shapes=("chain",) if scope == "chains" else SHAPES)
        mine, ref = answers(args.run, name), answers(args.run, reference)
        rows = []
        for qid, turns in mine.items():
            if qid not in ref:
                continue
            for turn, (got, plain) in enumerate(zip(turns, ref[qid])):
                if got == plain:
                    continue
                texts = [backend.detokenize([t for t in ts if t not in backend.info.eos_token_ids]) for ts in ref[qid][:turn]]
                prompt = backend.chat_prompt(messages_for(questions[qid], turn, texts))
                d = find_divergence(backend, prompt, got, plain, probe)
                rows.append({"question_id": qid, "turn": turn, "token_index": d.token_index,
                             "plain_margin": d.plain_margin, "bound": d.bound, "near_tie": d.near_tie})
                break
        result[name] = {"reference": reference, "probe": probe.statement(), "divergent_questions": len(rows),
                        "near_ties": sum(r["near_tie"] for r in rows), "divergences": rows}
        print(f"{name}: {len(rows)} questions part from {reference}; {sum(r['near_tie'] for r in rows)} at near-ties "
              f"(bound {probe.near_tie_bound():.3g})")
    (args.run / "ties.json").write_text(json.dumps(result, indent=1) + "\n")
    finish(args.run)  # the report states the probe and the near-tie verdicts beside the mismatch counts


if __name__ == "__main__":
    main()
