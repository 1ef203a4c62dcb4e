"""What a chain drafter in vLLM would gain, predicted from draftwise's measurements.

Greedy decoding is deterministic, so a token-only chain drafter's rounds on a workload follow
from the workload's greedy outputs alone: at each round the drafter proposes from the context,
the target accepts the longest prefix that equals the output, and emits one token more.
`replay` plays those rounds (draftwise's prompt lookup, which with prompt_lookup_min = 1 picks
the same continuation as vLLM's `ngram`: the longest suffix n-gram up to the maximum, its
earliest occurrence).  `predicted_speedup` prices each round by the measured verify profile
t_B(1 + drafted), relative to a plain batched step: committed tokens per unit of time against
plain decoding's one token per step.  Not priced: the drafter's own time (a numpy search,
small beside a forward) and vLLM's per-step overhead outside the forward (it makes rows
relatively cheaper than the profile says, so it errs on the side of predicting too little).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from draftwise.runtime.cost_profile import BatchCostProfile, VerifyCostProfile
from draftwise.proposers.prompt_lookup import PromptLookupConfig, find_continuations


@dataclass(frozen=True)
class Round:
    drafted: int  # draft tokens verified (0: the drafter found no match, a plain step)
    emitted: int  # tokens committed: accepted + the target's own (cut at the output's end)


def accepted_prefix(draft: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    for d, t in zip(draft, truth):
        if d != t:
            break
        n += 1
    return n


def replay(prompt: Sequence[int], output: Sequence[int], k: int, max_ngram: int) -> tuple[Round, ...]:
    """The rounds draftwise's prompt lookup (K tokens, n-grams up to `max_ngram`) plays over a
    greedy `output` of `prompt`."""
    ids = np.asarray([*prompt, *output], dtype=np.int64)
    config = PromptLookupConfig(num_tokens=k, max_ngram=max_ngram)
    rounds, t = [], 0
    while t < len(output):
        found = find_continuations(ids[: len(prompt) + t], config)
        draft = [int(x) for x in found[0]] if found else []
        emitted = min(accepted_prefix(draft, output[t:]) + 1, len(output) - t)
        rounds.append(Round(len(draft), emitted))
        t += emitted
    return tuple(rounds)


def predicted_speedup(rounds: Sequence[Round], profile: VerifyCostProfile) -> float:
    """Committed tokens per plain-step time over `rounds`: > 1 pays."""
    tokens = sum(r.emitted for r in rounds)
    cost = sum(profile.relative_at(1 + r.drafted) for r in rounds)
    return tokens / cost if cost else 1.0


@dataclass(frozen=True)
class BatchChoice:
    batch: int
    k: int  # 0: decode plainly at this batch size
    predicted: float  # speedup of the chosen K over no speculation (1.0 for K = 0)
    by_k: Mapping[int, float]  # every K's predicted speedup (K = 0 is 1.0)


def choose(rounds_by_k: Mapping[int, Sequence[Round]], profiles: BatchCostProfile,
           batches: Sequence[int]) -> tuple[BatchChoice, ...]:
    """Per batch size, the K that the profile of that batch size predicts fastest (0 when no
    K beats plain decoding); K whose rows exceed the profile's measured range are not priced."""
    out = []
    for batch in batches:
        profile = profiles.at(batch)
        by_k = {0: 1.0} | {k: predicted_speedup(r, profile) for k, r in sorted(rounds_by_k.items())
                           if k + 1 <= profile.max_rows}
        best = max(by_k, key=lambda k: (by_k[k], -k))  # ties: the shorter draft
        out.append(BatchChoice(batch, best, by_k[best], by_k))
    return tuple(out)


def schedule(choices: Sequence[BatchChoice]) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size: [first B, last B, K] ranges from 1 up; each
    measured batch size's K holds until the next measured size (the profile's own rule, `at`)."""
    ordered = sorted(choices, key=lambda c: c.batch)
    out = []
    for i, choice in enumerate(ordered):
        first = 1 if i == 0 else choice.batch
        last = ordered[i + 1].batch - 1 if i + 1 < len(ordered) else choice.batch
        out.append([first, last, choice.k])
    return out
