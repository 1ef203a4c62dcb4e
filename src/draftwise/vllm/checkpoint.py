"""A draftwise target re-saved as vLLM loads it.

Two things stop vLLM from reading the checkpoint draftwise's transformers backend converts from
a GGUF (issue 45): the tied embedding is stored once, as `lm_head.weight`, and vLLM's loader then
reads no `model.embed_tokens.weight` (every token it emits is id 0, empty text); and config.json
has `architectures: null`, which vLLM needs to pick its model class.  This module writes a copy
with both fixed, as an artifact (kind `vllm_checkpoint`) whose manifest names its source.

Run in draftwise's .venv (it owns the model cache and the GGUF conversion):
    python -m draftwise.vllm.checkpoint smollm2-135m
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from draftwise.artifacts import staged_artifact, write_manifest
from draftwise.models import ResolvedModel, cache_dir, resolve
from draftwise.optimize.auto import artifact_matches

log = logging.getLogger(__name__)

ARTIFACT_KIND = "vllm_checkpoint"
WEIGHTS = "model.safetensors"
EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
# what the copy takes besides the weights and config.json (tokenizer, chat template, generation defaults)
_SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "special_tokens_map.json", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class CheckpointFixes:
    """What `fix_for_vllm` changed: recorded in the artifact's manifest."""

    materialised_embedding: bool  # model.embed_tokens.weight written from the tied lm_head.weight
    architectures: tuple[str, ...] | None  # set in config.json (None: it was already there)

    def as_dict(self) -> dict[str, Any]:
        return {"materialised_embedding": self.materialised_embedding,
                "architectures": None if self.architectures is None else list(self.architectures)}


def architectures_for(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The causal-LM class transformers registers for the config's model_type (e.g. llama ->
    LlamaForCausalLM), the name vLLM's registry is keyed by."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = str(config.get("model_type"))
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"no causal-LM architecture is registered for model_type {model_type!r}")
    return (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type],)


def fix_for_vllm(tensors: dict[str, Any], config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], CheckpointFixes]:
    """(tensors, config) as vLLM reads them; the inputs are not modified."""
    tensors, config = dict(tensors), dict(config)
    materialise = EMBED not in tensors
    if materialise:
        if LM_HEAD not in tensors:
            raise ValueError(f"the checkpoint has neither {EMBED} nor {LM_HEAD}")
        if not config.get("tie_word_embeddings", False):
            raise ValueError(f"{EMBED} is missing and the embeddings are not tied: the checkpoint is incomplete")
        tensors[EMBED] = tensors[LM_HEAD].clone()  # its own storage: safetensors refuses shared tensors
    architectures = None
    if not config.get("architectures"):
        architectures = architectures_for(config)
        config["architectures"] = list(architectures)
    return tensors, config, CheckpointFixes(materialised_embedding=materialise, architectures=architectures)


def source_dir(model: ResolvedModel) -> Path:
    """The transformers directory draftwise decodes this model from (a GGUF is converted once)."""
    if model.kind == "gguf":
        # the transformers backend's cached conversion (keyed by the GGUF's sha256): the same weights
        # draftwise's transformers runs read, so vLLM's and draftwise's plain outputs compare
        from draftwise.backends.transformers import _converted_dir

        return Path(_converted_dir(model))
    if model.kind == "directory":
        return Path(model.path)
    raise ValueError(f"{model.name!r} is a hub id; these machines reach no hub: pass a local directory or GGUF")


def default_out(model: ResolvedModel) -> Path:
    tag = model.sha256[:16] if model.sha256 else "dir"
    return cache_dir().parent / "vllm" / f"{Path(model.path).stem}-{tag}"


def save_for_vllm(source: Path, out: Path, provenance: Mapping[str, Any]) -> Path:
    """Write the fixed copy of the transformers directory `source` to `out` (an artifact)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    tensors, config, fixes = fix_for_vllm(load_file(str(source / WEIGHTS)), config)
    with staged_artifact(out, ARTIFACT_KIND) as staging:
        save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in _SIDE_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, staging / name)
        write_manifest(staging, ARTIFACT_KIND, {**dict(provenance), "source": str(source), "fixes": fixes.as_dict()})
    return out


def vllm_checkpoint(name: str, out: Path | None = None) -> Path:
    """The vLLM-loadable directory for draftwise model `name` (alias, GGUF or directory); made
    once, then reused while its manifest verifies and names the same source checkpoint."""
    model = resolve(name)
    out = Path(out) if out is not None else default_out(model)
    provenance = {"model": name, "checkpoint": model.checkpoint_id, "source_sha256": model.sha256}
    # checksums re-checked: a truncated copy is made again, not served
    if artifact_matches(out, ARTIFACT_KIND, lambda p: p.get("checkpoint") == model.checkpoint_id):
        return out
    log.info("re-saving %s for vLLM into %s", name, out)
    return save_for_vllm(source_dir(model), out, provenance)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(vllm_checkpoint(argv[0] if argv else "smollm2-135m", Path(argv[1]) if len(argv) > 1 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
