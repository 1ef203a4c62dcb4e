"""Target-sample membership: sample the target under the policy at the current node and
descend while a child carries the sample.  Needs no q, so it is exact for any proposer and
any sampling policy: every emitted token is a plain target sample.  With `draws`
(`sampling.PositionDraws`, as the engine passes them), the sample at each position takes that
position's draw, so the text is plain decoding's at the same seed."""

from __future__ import annotations

import numpy as np

from draftwise.runtime.contracts import TopologyKind
from draftwise.runtime.sampling import PositionDraws, SamplingPolicy, sample, sample_with
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import TargetLogits
from draftwise.verify.base import ALL_RELATIONS, ALL_SEMANTICS, Selection, VerifierCapabilities, child_with_token


class MembershipVerifier:
    capabilities = VerifierCapabilities(
        name="membership", semantics=ALL_SEMANTICS, relations=ALL_RELATIONS,
        topologies=frozenset({TopologyKind.SEQUENCE, TopologyKind.SET, TopologyKind.TREE}),
        exact=True, any_candidates=True,
    )

    def select(
        self, round_: CompiledRound, target: TargetLogits, policy: SamplingPolicy, rng: np.random.Generator,
        draws: PositionDraws | None = None,
    ) -> Selection:
        accepted: list[int] = []
        row = -1
        best = target.argmax() if policy.greedy else None  # argmax is the whole policy at T = 0
        while True:
            if best is not None:
                token = int(best[row + 1])
            elif draws is not None:  # the token at this position takes that position's draw, as plain decoding's does
                position = round_.prefix_len + (int(round_.depth[row]) if row >= 0 else 0)
                token = sample_with(target.probs(row + 1, policy), draws.uniform(position))
            else:
                token = sample(target.probs(row + 1, policy), rng)
            child = child_with_token(round_, row, token)
            if child is None:
                return Selection(tuple(accepted), token)
            accepted.append(child)
            row = child
