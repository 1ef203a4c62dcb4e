"""Reading what `draftwise export vllm` wrote: the artifact's files and the method they name."""

from __future__ import annotations

import json
from pathlib import Path

from draftwise.artifacts import read_manifest
from draftwise.vllm.protocol import VllmMethod

ARTIFACT_KIND = "vllm_export"
CONFIG_FILE = "speculative_config.json"
CUSTOM_FILE = "custom_class.json"  # the same choice run by draftwise's own proposer inside vLLM


def load_exported_method(directory: Path, custom: bool = False) -> VllmMethod:
    """The exported speculative_config (or with `custom` its custom_class form) as a method the
    worker runs (a null config: plain); the artifact's checksums are verified first."""
    name = CUSTOM_FILE if custom else CONFIG_FILE
    read_manifest(directory, kind=ARTIFACT_KIND, required=(name,))
    body = json.loads((Path(directory) / name).read_text())
    return VllmMethod(f"vllm-export{'-custom' if custom else ''}={directory}", body.get("speculative_config"),
                      env=dict(body.get("env") or {}))
