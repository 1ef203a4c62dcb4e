"""The gate against fixed-depth prompt lookup, replayed on plain traces (no target forward):
tokens committed per plain-step unit of verify cost, and how often the round that reads the
prompt had its proposal accepted against the later rounds.  A replay runs the engine itself on a
`TraceBackend` (`draftwise.optimize.replay`), so it gates exactly as decoding does; its cost is
the measured profile's t(1 + rows) per round after the first (the first reads the prompt and is
never gated), so only the gate's depth choices differ between the two columns.

Trace sets (either kind, several allowed):
  run:RUN_DIR:TARGET       the `plain` method's tokens of a batch_throughput run (`concurrency.jsonl`),
                           prompts re-made through TARGET's chat template (humaneval:0-15 first turns)
  traces:ARTIFACT_DIR      a `plain_traces` artifact (what `--proposer auto` caches)
Profiles: a `verify_profile` artifact, or a `batch_verify_profile` artifact read at each B given.

Usage: python benchmarks/cost_gate/prompt_round.py PROFILE_DIR TRACE_SET... [--batch 1,2,4,8] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.artifacts import read_manifest
from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.runtime.gate import CostGateConfig
from draftwise.optimize.auto_proposer import TRACES_FILE
from draftwise.optimize.replay import Trace, replay
from draftwise.proposers.prompt_lookup import PromptLookupProposer
from draftwise.topology.compile import TreeLimits
from draftwise.workloads import first_turn_prompts


def run_traces(run_dir: str, target: str) -> list[Trace]:
    from draftwise.backends.transformers import load_tokenizer
    from draftwise.models import resolve

    tokenizer = load_tokenizer(resolve(target))

    def chat(messages: list[dict]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    lines = [json.loads(line) for line in (Path(run_dir) / "concurrency.jsonl").read_text().splitlines()]
    plain = next(line for line in lines if line["method"] == "plain")
    tokens = {q["question_id"]: q["tokens"] for q in plain["run"]["requests"]}
    prompts = first_turn_prompts(chat, "humaneval:0-15")
    return [Trace(tuple(p), tuple(tokens[f"HumanEval/{i}"]), 1.0, 1.0) for i, p in enumerate(prompts)]


def artifact_traces(directory: str) -> list[Trace]:
    read_manifest(Path(directory), kind="plain_traces", required=(TRACES_FILE,))  # checksums re-checked
    body = json.loads((Path(directory) / TRACES_FILE).read_text())
    return [Trace.from_dict(t) for t in body["traces"]]


def score(traces: list[Trace], profile: VerifyCostProfile, gated: bool, max_new_tokens: int) -> tuple[float, int, int, int]:
    """Tokens per plain-step unit after round 1, and round 1's accepted / offered proposals, later rounds' too."""
    cost = tokens = 0.0
    first_offered = first_taken = later_offered = later_taken = 0
    for trace in traces:
        rounds = replay(trace, PromptLookupProposer(), max_new_tokens=max(max_new_tokens, len(trace.tokens)),
                        limits=TreeLimits(), context_length=32768, gate=CostGateConfig(profile) if gated else None)
        first_offered += rounds[0].nodes > 0
        first_taken += rounds[0].accepted > 0
        for r in rounds[1:]:
            cost += profile.relative_at(1 + r.nodes)
            tokens += r.emitted
            later_offered += r.nodes > 0
            later_taken += r.accepted > 0
    return tokens / cost, first_taken, first_offered, later_taken * 1000 // max(1, later_offered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--batch", default="1")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    kind = read_manifest(Path(args.profile)).kind
    profiles = {b: BatchCostProfile.load(Path(args.profile)).at(b) for b in map(int, args.batch.split(","))} \
        if kind == "batch_verify_profile" else {1: VerifyCostProfile.load(Path(args.profile))}
    for spec in args.sets:
        source, _, rest = spec.partition(":")
        traces = run_traces(*rest.rsplit(":", 1)) if source == "run" else artifact_traces(rest)
        for b, profile in profiles.items():
            fixed, taken, offered, later = score(traces, profile, False, args.max_new_tokens)
            gate = score(traces, profile, True, args.max_new_tokens)[0]
            print(f"{spec} B={b}: fixed lookup {fixed:.3f}, gate {gate:.3f} tokens per plain step "
                  f"({gate / fixed:.3f}x fixed); round 1 accepted {taken}/{offered}, later rounds {later / 10:.1f}%")


if __name__ == "__main__":
    main()
