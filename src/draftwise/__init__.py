"""draftwise: exact speculative decoding, chosen by measured time per committed token.

    import draftwise
    decoder = draftwise.open_decoder(proposer="prompt-lookup", backend="transformers")
    result = decoder.generate("Write a haiku about caches.", chat=True)
    print(result.text, result.stats.tokens_per_s)

The names below are the public API; everything else is importable but may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "open_decoder": "draftwise.api",
    "Decoder": "draftwise.api",
    "DecoderSpec": "draftwise.spec",
    "spec_from_options": "draftwise.parse",
    "GenerationConfig": "draftwise.runtime.round",
    "GenerationResult": "draftwise.runtime.round",
    "SamplingPolicy": "draftwise.runtime.sampling",
    "GenerationStats": "draftwise.runtime.stats",
    "RoundRecord": "draftwise.runtime.stats",
    "DRAFTERS": "draftwise.proposers.registry",
    "DraftwiseError": "draftwise.errors",
    "InputError": "draftwise.errors",
    "ContractError": "draftwise.errors",
    "ArtifactError": "draftwise.errors",
    "ModelError": "draftwise.errors",
    "BackendError": "draftwise.errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from draftwise.api import Decoder, open_decoder
    from draftwise.runtime.round import GenerationConfig, GenerationResult
    from draftwise.errors import ArtifactError, BackendError, ContractError, DraftwiseError, InputError, ModelError
    from draftwise.proposers.registry import DRAFTERS
    from draftwise.runtime.sampling import SamplingPolicy
    from draftwise.spec import DecoderSpec
    from draftwise.parse import spec_from_options
    from draftwise.runtime.stats import GenerationStats, RoundRecord


def __getattr__(name: str) -> Any:
    """Imported on first use: `import draftwise` stays cheap, and no submodule import cycles
    through the package's own namespace."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'draftwise' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
