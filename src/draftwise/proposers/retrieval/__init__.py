"""REST retrieval drafting: a suffix-array datastore, prefix-count tries, a tree proposer.

Modules, one role each: `corpus` (readers, tokenizer adapter), `exclusion` (benchmark
decontamination), `index` (build / load / verify), `query` (longest-suffix search,
continuations), `trie` (prefix counts, pruning), `proposer` (`RestProposer`).
"""

from draftwise.proposers.retrieval.index import (
    BuildReport,
    RestIndex,
    RestIndexError,
    TokenizerMismatch,
    build_from_token_documents,
    build_index,
    index_info,
    verify_index,
)
from draftwise.proposers.retrieval.proposer import RestProposer, RestStats
from draftwise.proposers.retrieval.query import QueryConfig
from draftwise.proposers.retrieval.trie import Trie, build_trie, prune

__all__ = [
    "BuildReport",
    "QueryConfig",
    "RestIndex",
    "RestIndexError",
    "RestProposer",
    "RestStats",
    "TokenizerMismatch",
    "Trie",
    "build_from_token_documents",
    "build_index",
    "build_trie",
    "index_info",
    "prune",
    "verify_index",
]
