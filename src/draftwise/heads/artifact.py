"""A trained head set on disk (docs/artifacts.md): `heads.safetensors` (the head weights in
bf16 (imported ones: the narrowest dtype that holds them exactly), and `token_map`, the draft
vocabulary as target ids) and a manifest binding the target checkpoint and tokenizer, the
architecture, the recipe and the training metrics.  Loading re-checks every checksum and
refuses a head set trained for another target or tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, save_file

from draftwise.artifacts import Manifest, read_manifest, staged_artifact, write_manifest
from draftwise.errors import ArtifactError, ContractError
from draftwise.heads.arch import CloverHeads, HeadArch, HydraHeads, MedusaHeads, make_heads

KIND = "draft_heads"
WEIGHTS = "heads.safetensors"
TOKEN_MAP = "token_map"  # the tensor in WEIGHTS holding the draft vocabulary [V_d] (target ids, int64)


class HeadsMismatch(ContractError):
    """The head set was trained for another target or tokenizer."""


@dataclass(frozen=True)
class HeadTarget:
    """What a head set is bound to: the target's checkpoint and its tokenizer."""

    checkpoint: str
    tokenizer_hash: str


@dataclass(frozen=True, eq=False)
class HeadSet:
    arch: HeadArch
    heads: MedusaHeads | HydraHeads | CloverHeads  # float32, eval mode
    token_map: torch.Tensor  # [V_d] target ids, most frequent first
    target: HeadTarget
    manifest_hash: str
    provenance: Mapping[str, Any]

    def check_target(self, checkpoint: str, tokenizer_hash: str) -> None:
        """Refuse another tokenizer always, and another checkpoint of it too: heads read a
        particular model's hidden states."""
        if tokenizer_hash != self.target.tokenizer_hash:
            raise HeadsMismatch(
                f"{self.arch.family} heads were trained for tokenizer {self.target.tokenizer_hash[:12]}…, the target has "
                f"{tokenizer_hash[:12]}…; train heads for this target (draftwise heads train)"
            )
        if checkpoint != self.target.checkpoint:
            raise HeadsMismatch(
                f"{self.arch.family} heads were trained for {self.target.checkpoint}, not {checkpoint}: heads read the "
                "target's own hidden states; train heads for this target (draftwise heads train)"
            )


def save_heads(directory: Path, arch: HeadArch, heads: MedusaHeads | HydraHeads | CloverHeads, token_map: torch.Tensor,
               target: HeadTarget, provenance: Mapping[str, Any], dtype: torch.dtype = torch.bfloat16) -> Manifest:
    """Write the artifact atomically (a failure leaves the old one in place).  `dtype`: of the
    weights on disk (imported heads keep their source's precision; loading reads any)."""
    tensors = {name: value.detach().to(dtype).contiguous() for name, value in heads.state_dict().items()}
    tensors[TOKEN_MAP] = token_map.detach().to(torch.int64).contiguous()
    with staged_artifact(Path(directory), KIND) as staging:
        save_file(tensors, str(staging / WEIGHTS), metadata={"family": arch.family})
        manifest = write_manifest(staging, KIND, {
            **dict(provenance),
            "arch": arch.as_dict(),
            "target": {"checkpoint": target.checkpoint, "tokenizer_hash": target.tokenizer_hash},
        })
    return manifest


def load_heads(directory: Path) -> HeadSet:
    manifest = read_manifest(Path(directory), kind=KIND, required=(WEIGHTS,))
    try:
        arch = HeadArch(**manifest.provenance["arch"])
        bound = manifest.provenance["target"]
        target = HeadTarget(str(bound["checkpoint"]), str(bound["tokenizer_hash"]))
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{directory}: the manifest lacks a valid arch or target ({exc})") from exc
    tensors = load_file(str(Path(directory) / WEIGHTS))
    token_map = tensors.pop(TOKEN_MAP, None)
    if token_map is None or token_map.shape != (arch.draft_vocab,):
        raise ArtifactError(f"{directory}/{WEIGHTS} has no token map of {arch.draft_vocab} rows")
    heads = make_heads(arch)
    expected = heads.state_dict()
    if set(tensors) != set(expected) or any(tensors[k].shape != expected[k].shape for k in expected):
        raise ArtifactError(f"{directory}/{WEIGHTS} does not hold the tensors of {arch}")
    heads.load_state_dict({k: v.float() for k, v in tensors.items()})
    heads.eval().requires_grad_(False)
    return HeadSet(arch, heads, token_map.long(), target, manifest.hash, manifest.provenance)
