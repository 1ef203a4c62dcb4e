"""Kangaroo's adapter (docs/drafters.md, "Kangaroo") and its artifact.

Draft = A o M[:l]: the target's first l layers, then the adapter A, then the target's own LM
head.  A is one multi-head attention layer and two norms, no FFN, as in the official Kangaroo
code: h = x + Attn(Norm_in(x)); out = Norm_out(h); logits = LM_head(out).  Its modules are
instances of the target's OWN classes (its RMSNorm and attention, built from the target's
config), so the adapter matches the architecture (Qwen2's q/k/v biases, grouped KV heads,
rotary embedding) without copied modeling code.  The output norm starts as a copy of the
target's final norm and the attention's output projection at zero, so an untrained adapter is
the target's final norm and LM head on the shallow state (an early exit).

The adapter's attention keeps KV rows of its own: cache layer L (after the target's L layers)
of the draft backend's cache.

Artifact: `adapter.safetensors` (bf16) and a manifest binding the target checkpoint and
tokenizer, the architecture (exit layer, shapes, model type), the recipe and the metrics;
loading re-checks every checksum and refuses another target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from draftwise.artifacts import Manifest, read_manifest, staged_artifact, write_manifest
from draftwise.errors import ArtifactError, ContractError, InputError

KIND = "kangaroo_adapter"
WEIGHTS = "adapter.safetensors"


class AdapterMismatch(ContractError):
    """The adapter was trained for another target, tokenizer or architecture."""


@dataclass(frozen=True)
class AdapterArch:
    model_type: str  # the target's (llama, qwen2): the classes the adapter's modules come from
    layers: int  # L of the target: the adapter's cache layer index
    exit_layer: int  # l: the adapter reads the residual stream after the first l layers
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int

    def __post_init__(self) -> None:
        if not 1 <= self.exit_layer < self.layers:
            raise InputError(f"exit layer must be in [1, {self.layers - 1}], got {self.exit_layer}")

    @classmethod
    def of(cls, model: nn.Module, exit_layer: int) -> "AdapterArch":
        config = model.config
        return cls(str(config.model_type), int(config.num_hidden_layers), exit_layer, int(config.hidden_size),
                   int(config.num_attention_heads), int(getattr(config, "num_key_value_heads", None)
                                                        or config.num_attention_heads), int(config.vocab_size))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class KangarooAdapter(nn.Module):
    """x [B, R, d] (the residual stream after layer l) -> the LM head's input [B, R, d]."""

    def __init__(self, model: nn.Module, exit_layer: int) -> None:
        super().__init__()
        self.arch = AdapterArch.of(model, exit_layer)
        inner = model.model
        first = inner.layers[0]
        config = model.config
        eps = float(getattr(config, "rms_norm_eps", 1e-6))
        self.input_layernorm = type(first.input_layernorm)(config.hidden_size, eps=eps)
        # the target's attention class on the target's config; index 0 at construction (a
        # Qwen2 attention reads its layer type there), then the adapter's own cache slot
        self.self_attn = type(first.self_attn)(config=config, layer_idx=0)
        self.self_attn.layer_idx = self.arch.layers
        self.norm = type(inner.norm)(config.hidden_size, eps=eps)
        with torch.no_grad():
            self.norm.weight.copy_(inner.norm.weight)
            nn.init.zeros_(self.self_attn.o_proj.weight)
        self.to(dtype=model.dtype, device=next(model.parameters()).device)
        self._cache_kwarg = _cache_kwarg(self.self_attn)

    def forward(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None, cache: object) -> torch.Tensor:
        attended, _ = self.self_attn(hidden_states=self.input_layernorm(x), position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, **{self._cache_kwarg: cache})
        return self.norm(x + attended)  # [B, R, d]

    def cache_layers(self) -> int:
        return 1


def _cache_kwarg(attention: nn.Module) -> str:
    import inspect

    params = inspect.signature(attention.forward).parameters
    return next(name for name in ("cache", "past_key_values", "past_key_value") if name in params)


@dataclass(frozen=True)
class AdapterTarget:
    checkpoint: str
    tokenizer_hash: str


@dataclass(frozen=True, eq=False)
class AdapterSet:
    arch: AdapterArch
    state: Mapping[str, torch.Tensor]  # the adapter's weights as stored
    target: AdapterTarget
    manifest_hash: str
    provenance: Mapping[str, Any]

    def check_target(self, checkpoint: str, tokenizer_hash: str, model: nn.Module) -> None:
        if tokenizer_hash != self.target.tokenizer_hash or checkpoint != self.target.checkpoint:
            raise AdapterMismatch(
                f"Kangaroo adapter trained for {self.target.checkpoint} (tokenizer {self.target.tokenizer_hash[:12]}…), "
                f"not {checkpoint}: the adapter reads the target's own shallow states; train one for this target "
                "(draftwise adapter train)"
            )
        have = AdapterArch.of(model, self.arch.exit_layer)
        if have != self.arch:
            raise AdapterMismatch(f"adapter architecture {self.arch.as_dict()} does not fit the target's {have.as_dict()}")

    def build(self, model: nn.Module) -> KangarooAdapter:
        adapter = KangarooAdapter(model, self.arch.exit_layer)
        expected = adapter.state_dict()
        if set(self.state) != set(expected) or any(self.state[k].shape != expected[k].shape for k in expected):
            raise ArtifactError(f"{WEIGHTS} does not hold the tensors of a {self.arch.model_type} adapter")
        adapter.load_state_dict({k: v.to(expected[k].dtype) for k, v in self.state.items()})
        return adapter.eval().requires_grad_(False)


def save_adapter(directory: Path, adapter: KangarooAdapter, target: AdapterTarget, provenance: Mapping[str, Any],
                 dtype: torch.dtype = torch.bfloat16) -> Manifest:
    tensors = {name: value.detach().to(dtype).contiguous() for name, value in adapter.state_dict().items()}
    with staged_artifact(Path(directory), KIND) as staging:
        save_file(tensors, str(staging / WEIGHTS), metadata={"family": "kangaroo"})
        return write_manifest(staging, KIND, {
            **dict(provenance), "family": "kangaroo", "arch": adapter.arch.as_dict(),
            "target": {"checkpoint": target.checkpoint, "tokenizer_hash": target.tokenizer_hash},
        })


def load_adapter(directory: Path) -> AdapterSet:
    manifest = read_manifest(Path(directory), kind=KIND, required=(WEIGHTS,))
    try:
        arch = AdapterArch(**manifest.provenance["arch"])
        bound = manifest.provenance["target"]
        target = AdapterTarget(str(bound["checkpoint"]), str(bound["tokenizer_hash"]))
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{directory}: the manifest lacks a valid arch or target ({exc})") from exc
    return AdapterSet(arch, load_file(str(Path(directory) / WEIGHTS)), target, manifest.hash, manifest.provenance)


SHIPPED = Path(__file__).resolve().parent.parent / "data" / "adapters"


def trained_root() -> Path:
    """The cache's adapter directory: `draftwise adapter train` writes there by default."""
    from draftwise.models import cache_dir

    return cache_dir().parent / "adapters"


def trained_path(checkpoint: str) -> Path:
    """Where `draftwise adapter train` writes an adapter by default (the cache)."""
    return trained_root() / f"kangaroo-{checkpoint.replace('@', '-')}"


def adapters_for(checkpoint: str, roots: tuple[Path, ...] | None = None) -> list[Path]:
    """Every adapter bound to `checkpoint` in `roots` (default: the shipped ones, then the cache's
    adapter directory, where adapters for other exit layers can be trained with --out): the
    candidates of `adapter=auto`.  Read unverified here; loading one verifies it."""
    import json

    found = []
    for root in roots if roots is not None else (SHIPPED, trained_root()):
        for manifest in sorted(Path(root).glob("*/manifest.json")):
            try:
                body = json.loads(manifest.read_text())
                if body["kind"] == KIND and body["provenance"]["target"]["checkpoint"] == checkpoint:
                    found.append(manifest.parent)
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not an adapter (or a broken one): not a candidate
    if not found:
        raise InputError(f"adapter=auto: no Kangaroo adapter ships or was trained for {checkpoint}; train one per exit "
                         "layer (draftwise adapter train --target MODEL --set exit_layer=L --out DIR)")
    return found


def default_adapter(checkpoint: str) -> Path:
    """The adapter shipped for `checkpoint` (draftwise/data/adapters/*), else the one trained into the cache."""
    import json

    for manifest in sorted(SHIPPED.glob("*/manifest.json")):
        try:
            if json.loads(manifest.read_text())["provenance"]["target"]["checkpoint"] == checkpoint:
                return manifest.parent
        except (OSError, ValueError, KeyError, TypeError):
            continue  # load_adapter reports a broken artifact when it is asked for by path
    trained = trained_path(checkpoint)
    if (trained / "manifest.json").is_file():
        return trained
    raise InputError(f"no Kangaroo adapter ships for {checkpoint}; train one (draftwise adapter train --target MODEL) "
                     "and pass adapter=DIR")
