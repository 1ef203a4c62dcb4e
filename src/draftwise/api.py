"""The public way in: open a decoder from a spec, generate, stream, read the statistics.

`open_decoder` is the one pass every caller uses (the CLI, the bench, calibration), straight
down the stages: parse (option strings to a typed spec, `draftwise.parse`) -> plan (check
before loading, load, every `auto` resolved, `draftwise.plan`) -> build (proposers, verifier,
gate, `draftwise.build`).  Each stage calls only the stages below it.  A `Decoder` holds the
loaded backends, so the plain reference and other generation lengths reuse them.
"""

from __future__ import annotations

from typing import Any, Mapping

from draftwise.measure.load import Loader
from draftwise.build import Decoder, Prompt, build
from draftwise.parse import spec_from_options
from draftwise.plan import plan
from draftwise.spec import CALIBRATION_WORKLOAD, DecoderSpec

__all__ = ["Decoder", "Loader", "Prompt", "open_decoder"]


def open_decoder(spec: DecoderSpec | None = None, *, loader: Loader | None = None,
                 calibration: str = CALIBRATION_WORKLOAD, **options: Any) -> Decoder:
    """Parse, plan (check, load, resolve) and build (progress goes to the `draftwise` logger at
    INFO).  `options` are spec keys (as `--set` and bench method strings take them:
    proposer="draft-model", draft="qwen2.5-coder-0.5b", k=4, gate="auto", ...) applied on top of
    `spec` (default: `DecoderSpec()`)."""
    requested = spec_from_options(_as_strings(options), spec or DecoderSpec())
    return build(plan(requested, loader, calibration))


def _as_strings(options: Mapping[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in options.items()}
