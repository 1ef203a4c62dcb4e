"""The tokens of one `llama_decode` (a `llama_batch` struct) in arrays that numpy owns.

`llama_batch_init` mallocs one seq-id array per token, which ctypes would fill item by item;
here every field is a numpy array (`seq_ids` one [C, S] block whose row pointers llama.cpp
gets), filled with vector writes.  `llama_decode` takes the struct by value and keeps no
pointer past the call, so nothing needs `llama_batch_free`.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np


def _ptr(array: np.ndarray, ctype):
    return array.ctypes.data_as(ctypes.POINTER(ctype))


class TokenArrays:
    """Capacity C tokens, each in at most S sequences."""

    def __init__(self, capacity: int, n_seq: int) -> None:
        self.capacity = capacity
        self.n_seq = n_seq
        self.token = np.zeros(capacity, dtype=np.int32)  # [C]
        self.pos = np.zeros(capacity, dtype=np.int32)  # [C]
        self.n_seq_id = np.zeros(capacity, dtype=np.int32)  # [C]
        self.seq_ids = np.zeros((capacity, n_seq), dtype=np.int32)  # [C, S]
        self.logits = np.zeros(capacity, dtype=np.int8)  # [C] 1 = output this row
        row_type = ctypes.POINTER(llama_cpp.llama_seq_id)
        base = self.seq_ids.ctypes.data
        stride = self.seq_ids.strides[0]
        self._rows = (row_type * capacity)(*(ctypes.cast(base + i * stride, row_type) for i in range(capacity)))
        self.struct = llama_cpp.llama_batch(
            n_tokens=0,
            token=_ptr(self.token, llama_cpp.llama_token),
            embd=None,
            pos=_ptr(self.pos, llama_cpp.llama_pos),
            n_seq_id=_ptr(self.n_seq_id, ctypes.c_int32),
            seq_id=self._rows,
            logits=_ptr(self.logits, ctypes.c_int8),
        )

    def set_one(self, token: int, pos: int, seq: int, logits: bool) -> None:
        """One token in one sequence (plain decoding's step: the hot path, no numpy calls)."""
        self.token[0] = token
        self.pos[0] = pos
        self.n_seq_id[0] = 1
        self.seq_ids[0, 0] = seq
        self.logits[0] = logits
        self.struct.n_tokens = 1

    def set_rows(self, tokens: np.ndarray, positions: np.ndarray, member: np.ndarray,
                 outputs: np.ndarray | None = None) -> None:
        """Rows with their positions and sequence sets; member [R, S'] bool, S' <= S; the rows
        where `outputs` [R] is true output logits (None: all)."""
        m, s = member.shape
        self.token[:m] = tokens
        self.pos[:m] = positions
        self.n_seq_id[:m] = member.sum(axis=1)
        # a stable argsort of "not member" lists each row's sequence ids first, in increasing order;
        # llama.cpp masks a query by its FIRST sequence id, and any leaf through the row is right
        self.seq_ids[:m, :s] = np.argsort(~member, axis=1, kind="stable")
        self.logits[:m] = 1 if outputs is None else outputs
        self.struct.n_tokens = m

    def pad_to(self, rows: int) -> tuple[list[int], int, int] | None:
        """Append throwaway rows until the batch has `rows` (strict kernels: llama.cpp computes a
        one-row batch with other kernels than a batch of two or more, so a plain decoding step
        would not reproduce the rows a verify batch gets).  Each pad row repeats the last row's
        token one position further, in the last row's sequences, with logits on (the last layer
        and the LM head run only on output rows, and their kernels depend on that count too).
        Returns (sequences, first position, end position) of the pad cells to drop after the
        decode, or None when nothing was added.  Only valid when the last row is the deepest of
        its sequences (a one-row batch always is)."""
        m = self.struct.n_tokens
        if m >= rows:
            return None
        last = m - 1
        first = int(self.pos[last]) + 1
        for i in range(m, rows):
            self.token[i] = self.token[last]
            self.pos[i] = first + i - m
            self.n_seq_id[i] = self.n_seq_id[last]
            self.seq_ids[i] = self.seq_ids[last]
            self.logits[i] = 1
        self.logits[last] = 1
        self.struct.n_tokens = rows
        return [int(s) for s in self.seq_ids[last, : self.n_seq_id[last]]], first, first + rows - m
