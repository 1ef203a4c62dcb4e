"""The transformers backend's floating-point type: float32, bfloat16, or auto (measured).

A GGUF target reaches transformers dequantized, and float32 is the faithful reading of those
weights; bfloat16 halves the bytes every decoding step streams through memory, which is what
a one-row step on a CPU is bound by, but it is a different model numerically: its greedy
output can part from float32's.  Worse for a speculative decoder: in bfloat16 a forward over
many rows does not round like a one-row step (other kernel blocking, every activation cut to
8 mantissa bits), so the logits of a position depend on how many rows were verified with it,
and greedy speculative output can part from plain bfloat16 decoding wherever two logits lie
within that rounding (measured: benchmarks/transformers_dtype).  The verifiers stay exact
with respect to the logits they are given; the target itself is not batch-invariant.  So
float32 stays the default: nobody gets another model's output, or loses token identity with
plain decoding, without asking for it.

`auto` asks for the faster of the two on this machine, decided by measurement
(`draftwise.measure.dtype`); this module holds the choices and their check, which every layer uses.
"""

from __future__ import annotations

from typing import Literal, get_args

from draftwise.errors import InputError

TorchDtype = Literal["float32", "bfloat16"]
DtypeChoice = Literal["float32", "bfloat16", "auto"]
DTYPES: tuple[str, ...] = get_args(DtypeChoice)
CONCRETE_DTYPES: tuple[str, ...] = get_args(TorchDtype)
DEFAULT_DTYPE: TorchDtype = "float32"  # the faithful reading of the weights: another precision is opted into


def check_dtype(name: str, allowed: tuple[str, ...] = DTYPES) -> str:
    """`name` if it is one of `allowed`, else an InputError naming the choices."""
    if name in DTYPES and name not in allowed:
        raise InputError(f"dtype {name!r} is not taken here (choose one of {' | '.join(allowed)}); "
                         "auto is settled by measurement in draftwise.measure.load.load_backend")
    if name not in allowed:
        raise InputError(f"unknown dtype {name!r}; choose one of {' | '.join(allowed)}")
    return name
