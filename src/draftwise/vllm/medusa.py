"""draftwise's Medusa heads as vLLM 0.32 can load them.

`draftwise heads export` writes vLLM's Medusa layout with draftwise's draft vocabulary: LM heads
of `truncated_vocab_size` rows and a `token_map`.  vLLM 0.32's loader refuses every such
checkpoint ("Following weights were not initialized from checkpoint: {'token_map'}": its
`MedusaModel.load_weights` sets `token_map` as a parameter but leaves it out of the names it
reports loaded).  This writes the variant vLLM does load: the same residual blocks, one shared
LM head (`original_lm_head`) over the full vocabulary, the target's own LM head, and no
`token_map`.  The heads then draft over the whole vocabulary rather than the draft vocabulary
(the restricted head's rows are the target's rows for those tokens, so on the draft vocabulary
the logits are the same); vLLM verifies every draft, so the output is unchanged.

    python -m draftwise.vllm.medusa EXPORT_DIR VLLM_CHECKPOINT_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from draftwise.artifacts import staged_artifact, write_manifest
from draftwise.heads.interchange import read_export
from draftwise.vllm.checkpoint import LM_HEAD, WEIGHTS

ARTIFACT_KIND = "vllm_medusa_full_vocabulary"
HEAD_PREFIXES = ("blocks.",)  # what is kept of the export: the residual blocks


def full_vocabulary(config: dict[str, Any], tensors: dict[str, Any], lm_head: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, tensors) with one full-vocabulary LM head and no token map; inputs not modified."""
    if lm_head.shape[0] != config["vocab_size"]:
        raise ValueError(f"the target's LM head has {lm_head.shape[0]} rows, the heads' vocabulary {config['vocab_size']}")
    config = {**config, "truncated_vocab_size": config["vocab_size"], "original_lm_head": True}
    kept = {name: t for name, t in tensors.items() if name.startswith(HEAD_PREFIXES)}
    return config, {**kept, "lm_heads.0.weight": lm_head.clone()}


def write_full_vocabulary(export: Path, checkpoint: Path, out: Path) -> Path:
    from safetensors.torch import load_file, save_file

    source = read_export(export)
    config = json.loads((export / "config.json").read_text())
    heads = load_file(str(export / WEIGHTS))
    dtype = heads["blocks.0.layers.0.weight"].dtype  # the heads' own dtype: the shared LM head follows it
    config, tensors = full_vocabulary(config, heads, load_file(str(checkpoint / WEIGHTS))[LM_HEAD].to(dtype))
    with staged_artifact(out, ARTIFACT_KIND) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
        write_manifest(staging, ARTIFACT_KIND, {"export": str(export), "export_hash": source.hash,
                                                "checkpoint": str(checkpoint)})
    return out


if __name__ == "__main__":
    print(write_full_vocabulary(*(Path(a) for a in sys.argv[1:4])))
