"""What a merged round's sources accepted together: recent walks down the union's full tree.

A heterogeneous round (`prompt-lookup+hydra++`) verifies each source s to a depth d_s.  What
the round commits depends on how the sources' proposals overlap, not only on each one's own
acceptance: where prompt lookup and the heads propose the same next token, lookup's row adds
nothing the heads did not; where lookup copies a long run that starts with the heads' token, its
deeper rows add what the heads cannot.  A model that takes the sources as independent
alternatives (`SourceGate`'s per-source rates) credits lookup with the tokens the heads already
had, so on prose, where lookup matches now and then, its rows kept being verified and the gated
union fell behind the heads alone (benchmarks/heterogeneous/).

This keeps the last rounds' walks instead: the published tokens walked down the FULL merged tree
(cut rows included), recording at each matched depth which sources own the matched row.  A walk
that matched depths 1..m tells, for ANY depth vector d, what that round would have committed:
the deepest matched depth i <= m whose row some source with d_s >= i owns (a source's rows are
prefix-closed, so that row's ancestors are kept too).  The estimate for d is the recency-weighted
mean of that over the recorded walks of rounds in which these sources proposed, blended with
the independent model's value at a fixed weight, which stands in where little is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from draftwise.topology.compile import CompiledRound
from draftwise.verify.base import child_with_token

MAX_WALKS = 128  # the newest walks kept (an older one would weigh under decay ** 128: negligible at the default)


@dataclass
class _Walk:
    present: int  # bitmask of the sources that proposed in the walk's round
    owners: list[int] = field(default_factory=list)  # [matched depth - 1] bitmask of the matched row's owners
    weight: float = 1.0
    _table: np.ndarray | None = None  # `deepest`, kept until the walk goes deeper or the width changes

    def deepest(self, sources: int, depths: int) -> np.ndarray:
        """[S, depths + 1]: [s, x] = the deepest matched depth <= x whose row source s owns (0: none)."""
        if self._table is None or self._table.shape[1] != depths + 1:
            table = np.zeros((sources, depths + 1), dtype=np.int64)
            for depth, mask in enumerate(self.owners[:depths], start=1):
                for s in range(sources):
                    if mask >> s & 1:
                        table[s, depth] = depth
            self._table = np.maximum.accumulate(table, axis=1)
        return self._table


def proposing(own: Sequence[np.ndarray]) -> int:
    """Bitmask of the sources with rows in a round (`own` [S] of [N] bool: each source's rows)."""
    return sum(1 << s for s, mask in enumerate(own) if mask.any())


class UnionWalks:
    """Recent walks of one generation's merged rounds (`SourceGate` keeps one)."""

    def __init__(self, sources: int, decay: float) -> None:
        self.sources = sources
        self.decay = decay
        self.walks: list[_Walk] = []
        # the newest walk while published tokens may still take it deeper: (walk, its round, the
        # sources' rows, the row it stands on); one walk stays open, the newest proposal's
        self._open: tuple[_Walk, CompiledRound, Sequence[np.ndarray], int] | None = None
        self._width = 16  # depths every walk's table covers (grown when a walk goes deeper)
        # the stacked tables and weights of the walks of one `present`, until the next `observe`
        # (a round asks for several depth cuts of the same round)
        self._stacked: tuple[int, np.ndarray, np.ndarray] | None = None

    def observe(self, offered: CompiledRound | None, own: Sequence[np.ndarray] | None, published: Sequence[int]) -> None:
        """Age every walk by one round, continue the open one into `published`, and start a walk
        down `offered` (`own` [S] of [N] bool: each source's rows)."""
        self._stacked = None
        for walk in self.walks:
            walk.weight *= self.decay
        if self._open is not None:
            self._open = self._walk(*self._open, published)
        if offered is None or not offered.n or own is None:
            return
        walk = _Walk(present=proposing(own))
        self.walks.append(walk)
        del self.walks[:-MAX_WALKS]
        self._open = self._walk(walk, offered, own, -1, published)

    @staticmethod
    def _walk(walk: _Walk, offered: CompiledRound, own: Sequence[np.ndarray], row: int, published: Sequence[int],
              ) -> tuple[_Walk, CompiledRound, Sequence[np.ndarray], int] | None:
        """Follow `published` down `offered` from `row`; where the walk stands if it may go on."""
        for token in published:
            match = child_with_token(offered, row, int(token))
            if match is None:
                return None
            walk.owners.append(sum(1 << s for s, mask in enumerate(own) if mask[match]))
            walk._table = None
            row = match
        return (walk, offered, own, row) if offered.children_of(row) else None

    def expected(self, depths: np.ndarray, present: int) -> tuple[np.ndarray, float]:
        """([C] recency-weighted mean committed candidates for each depth vector depths[c] [C, S]
        over the walks of rounds in which the sources `present` proposed, others perhaps too,
        their total weight).  A source outside `present` is at depth 0 in every vector asked, so
        a walk with more sources says what the present ones' rows alone would have committed: a
        source asked in some rounds only (`SourceGate.ask`) leaves the others' estimates fed by
        every round (kept apart by exact `present`, rounds where the heads were not asked had few
        walks of their own, and the replay lost on rag and extraction: benchmarks/heterogeneous/)."""
        if self._stacked is None or self._stacked[0] != present:
            chosen = [walk for walk in self.walks if walk.present & present == present]
            if not chosen:
                return np.zeros(depths.shape[0], dtype=np.float64), 0.0
            self._width = max(self._width, *(len(walk.owners) for walk in chosen))
            self._stacked = (present, np.stack([walk.deepest(self.sources, self._width) for walk in chosen]),
                             np.array([walk.weight for walk in chosen]))  # [W', S, D + 1], [W']
        _, tables, weights = self._stacked
        at = np.minimum(depths, tables.shape[2] - 1)  # [C, S]
        reached = tables[:, np.arange(self.sources)[None, :], at].max(axis=2)  # [W', C]
        total = float(weights.sum())
        return weights @ reached / total, total
