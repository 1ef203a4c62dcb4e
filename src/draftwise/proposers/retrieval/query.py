"""Longest-suffix search over a token suffix array, and the continuations that follow.

The corpus is one token stream in which every document is followed by a separator id that
no tokenizer produces (the vocabulary size).  A query never contains the separator, so no
match can span two documents; continuations stop at the first separator.

Existence of a match is monotone in the suffix length (an occurrence of the last m context
tokens contains one of the last m-1), so the longest matching length is found by binary
search over lengths, each probe being a pair of binary searches over the suffix array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.proposers.retrieval.trie import PAD

MATCH_SELECTION = (
    "at most max_matches suffix-array rows, evenly spaced over the matching range "
    "(a stratified sample of the sorted continuations; all rows when there are fewer)"
)


@dataclass(frozen=True)
class QueryConfig:
    """Query-time settings; the defaults are the one place these numbers are defined."""

    max_suffix: int = 16  # longest context suffix tried
    min_suffix: int = 2  # shortest context suffix accepted
    max_matches: int = 64  # continuations retrieved per query
    continuation_length: int = 8  # tokens per continuation (cut at document boundaries)

    def __post_init__(self) -> None:
        if not 1 <= self.min_suffix <= self.max_suffix:
            raise InputError(f"need 1 <= min_suffix <= max_suffix, got {self.min_suffix}, {self.max_suffix}")
        if self.max_matches < 1 or self.continuation_length < 1:
            raise InputError(f"max_matches and continuation_length must be >= 1, got {self}")


@dataclass(frozen=True, eq=False)
class SuffixArrays:
    """The searchable part of an index (plain arrays, typically views over a memory map)."""

    tokens: np.ndarray  # [T] uint32: documents, each followed by `separator`
    suffix: np.ndarray  # [T] int32 or int64: suffix start positions in lexicographic order
    separator: int  # id outside the vocabulary that ends every document
    # [separator + 2] int64: suffixes starting with token t are rows [first[t], first[t + 1]);
    # starting each search inside that bucket saves the bisection steps that would find it
    first_token: np.ndarray | None = None

    def bucket(self, token: int) -> tuple[int, int]:
        if self.first_token is None:
            return 0, int(self.suffix.shape[0])
        return int(self.first_token[token]), int(self.first_token[token + 1])


@dataclass(frozen=True)
class Match:
    length: int  # matched suffix length (0: no match)
    lo: int  # suffix-array range [lo, hi) of the matching suffixes
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


NO_MATCH = Match(0, 0, 0)


def _bound(arrays: SuffixArrays, pattern: list[int], lo: int, hi: int, upper: bool) -> int:
    """First suffix-array row in [lo, hi) whose suffix is >= pattern (upper: > pattern as prefix)."""
    tokens, suffix, m = arrays.tokens, arrays.suffix, len(pattern)
    while lo < hi:
        mid = (lo + hi) // 2
        start = int(suffix[mid])
        head = tokens[start : start + m].tolist()  # a shorter head (stream end) sorts first
        if head < pattern or (upper and head == pattern):
            lo = mid + 1
        else:
            hi = mid
    return lo


def suffix_range(arrays: SuffixArrays, pattern: Sequence[int]) -> tuple[int, int]:
    """Suffix-array rows [lo, hi) whose suffixes start with `pattern`."""
    pattern = [int(t) for t in pattern]
    first, last = arrays.bucket(pattern[0])
    lo = _bound(arrays, pattern, first, last, upper=False)
    hi = _bound(arrays, pattern, lo, last, upper=True)
    return lo, hi


def longest_match(arrays: SuffixArrays, context: Sequence[int], config: QueryConfig) -> Match:
    """The longest context suffix (min_suffix..max_suffix tokens) that occurs in the corpus."""
    tail = [int(t) for t in context[-config.max_suffix :]]
    for i in range(len(tail) - 1, -1, -1):  # an id the index cannot hold ends the usable suffix
        if not 0 <= tail[i] < arrays.separator:
            tail = tail[i + 1 :]
            break
    if len(tail) < config.min_suffix:
        return NO_MATCH
    best = NO_MATCH
    lo_len, hi_len = config.min_suffix, len(tail)
    while lo_len <= hi_len:  # binary search on the length: existence is monotone
        m = (lo_len + hi_len) // 2
        lo, hi = suffix_range(arrays, tail[-m:])
        if hi > lo:
            best = Match(m, lo, hi)
            lo_len = m + 1
        else:
            hi_len = m - 1
    return best


def select_rows(match: Match, max_matches: int) -> np.ndarray:
    """Suffix-array rows to read: all, or `max_matches` evenly spaced ones.  [K] int64"""
    if match.count <= max_matches:
        return np.arange(match.lo, match.hi, dtype=np.int64)
    return match.lo + (np.arange(max_matches, dtype=np.int64) * match.count) // max_matches


def continuations(arrays: SuffixArrays, match: Match, config: QueryConfig) -> np.ndarray:
    """What follows each selected occurrence: [K, L] int64, PAD after a document boundary."""
    if match.count == 0:
        return np.zeros((0, config.continuation_length), dtype=np.int64)
    rows = select_rows(match, config.max_matches)
    starts = arrays.suffix[rows].astype(np.int64) + match.length  # [K]
    offsets = starts[:, None] + np.arange(config.continuation_length)  # [K, L]
    total = arrays.tokens.shape[0]
    window = arrays.tokens[np.minimum(offsets, total - 1)].astype(np.int64)  # [K, L]
    ended = (window == arrays.separator) | (offsets >= total)
    ended = np.logical_or.accumulate(ended, axis=1)  # everything after the first boundary
    return np.where(ended, PAD, window)


def retrieve(arrays: SuffixArrays, context: Sequence[int], config: QueryConfig) -> tuple[Match, np.ndarray]:
    """Longest match and its continuations [K, L]."""
    match = longest_match(arrays, context, config)
    return match, continuations(arrays, match, config)
