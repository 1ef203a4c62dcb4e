"""PyTorch / transformers backend: loading a model, and one sequence (`TransformersBackend`) as
a view of the slotted backend, where every forward runs (`backends/transformers_batch.py`).
No modeling code is copied or patched.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import numpy as np
import torch

from draftwise.artifacts import read_manifest, stamp_path, verify_files, write_manifest, write_stamp
from draftwise.backends.base import BackendError, BackendInfo, tokenizer_fingerprint
from draftwise.backends.batch import DraftSlot, HiddenSlotView
from draftwise.backends.dtype import CONCRETE_DTYPES, DEFAULT_DTYPE, TorchDtype, check_dtype
from draftwise.backends.row_padding import RowPadding
from draftwise.backends.transformers_batch import TransformersBatch, kv_shape, sliding_window
from draftwise.models import ResolvedModel, cache_dir

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)


class TransformersBackend(HiddenSlotView):
    """One sequence on a loaded model: a view of a one-slot `TransformersBatch`, where every rule
    of the KV cache, row padding and hidden states lives.  `batch_type`: the slotted class it runs
    on (a composed draft pass and a verify that reuses shallow rows bring their own)."""

    batch: TransformersBatch

    def __init__(self, model, tokenizer, info: BackendInfo, batch_type: type[TransformersBatch] = TransformersBatch) -> None:
        self.model, self.tokenizer, self.info = model, tokenizer, info
        batch = batch_type(self, 1)
        super().__init__(batch, batch.open())

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def load(cls, model: ResolvedModel, device: str = "cpu", dtype: TorchDtype = DEFAULT_DTYPE) -> "TransformersBackend":
        """The model in `dtype` (float32 or bfloat16; `auto` is settled by `draftwise.measure.load.load_backend`).
        A GGUF's float32 conversion is cast on load: the same bf16 weights a bf16 conversion would hold."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check_dtype(dtype, CONCRETE_DTYPES)
        source = _converted_dir(model) if model.kind == "gguf" else model.path
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            net = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), local_files_only=True)
        except OSError as exc:
            raise BackendError(
                f"cannot load {model.path!r} offline ({exc.__class__.__name__}); these machines reach no model hub: "
                "download the model elsewhere and pass its local directory or .gguf file"
            ) from exc
        net.to(device).eval()
        eos = {tokenizer.eos_token_id} | set(_as_list(getattr(net.generation_config, "eos_token_id", None)))
        # the cache holds every column: a model with an attention window runs within it, where the window is moot
        context = int(getattr(net.config, "max_position_embeddings", 2048))
        context = min(context, sliding_window(net.config) or context)
        info = BackendInfo(
            name="transformers",
            checkpoint=model.checkpoint_id,
            tokenizer_hash=tokenizer_hash_of(tokenizer),
            vocab_size=int(net.config.vocab_size),
            context_length=context,
            dtype=str(net.dtype).removeprefix("torch."),  # what the weights are, as loaded: the round manifest records it
            device=device,
            eos_token_ids=frozenset(int(e) for e in eos if e is not None),
            kv_row_bytes=kv_row_bytes(net.config, net.dtype),
        )
        return cls(net, tokenizer, info)

    def fork(self) -> "TransformersBackend":
        """Another sequence on the same loaded weights: its own KV (empty) and none of this one's
        state.  A batch gives each request's draft model one (the weights are read-only)."""
        twin = TransformersBackend(self.model, self.tokenizer, self.info)
        twin.row_padding = self.row_padding
        return twin

    @property
    def device(self) -> torch.device:
        return self.batch.device

    @property
    def row_padding(self) -> RowPadding | None:
        """The plan its verify forwards are padded by (backends/row_padding.py; None: never padded)."""
        return self.batch.lone_padding

    @row_padding.setter
    def row_padding(self, padding: RowPadding | None) -> None:
        self.batch.lone_padding = padding

    extend = DraftSlot.extend
    verify_more = DraftSlot.verify_more

    def track_context(self, on: bool = True) -> None:
        self.batch.track_context(self.slot, on)

    def context_hidden(self, start: int) -> np.ndarray | None:
        return self.batch.context_hidden(self.slot, start)


def kv_row_bytes(config, dtype: torch.dtype) -> int:
    """One token's K and V over every layer: 2 * layers * kv heads * head dim * element size."""
    heads, head_dim = kv_shape(config)
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _converted_dir(model: ResolvedModel) -> str:
    """transformers reads GGUF metadata slowly (the more so the larger the vocabulary), so the first
    load converts the GGUF once into a safetensors directory keyed by the GGUF's sha256."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = cache_dir().parent / "hf" / f"{Path(model.path).stem}-{model.sha256[:16]}"
    stamps = out.with_name(out.name + ".verified")  # beside the artifact: see checked_sha256
    if (out / "manifest.json").is_file():
        manifest = read_manifest(out, kind="gguf_conversion", verify=False)
        if manifest.provenance.get("gguf_sha256") == model.sha256:
            # the weights are hashed in full once, then whenever a file's size or mtime changes
            verify_files(out, manifest, stamps=stamps)
            return str(out)
    log.info("converting %s for transformers (once; cached in %s)", Path(model.path).name, out)
    folder, name = str(Path(model.path).parent), Path(model.path).name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        net = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, IndexError, struct.error) as exc:  # not a GGUF, truncated, or unsupported
        raise BackendError(f"transformers could not load {model.path!r} as a GGUF model: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    config = net.config.to_dict()
    config.pop("quantization_config", None)  # the weights are stored dequantized
    (out / "config.json").write_text(json.dumps(config, indent=2))
    net.generation_config.save_pretrained(out)
    save_model(net, str(out / "model.safetensors"))
    tokenizer.save_pretrained(out)
    manifest = write_manifest(out, "gguf_conversion", {"gguf": model.path, "gguf_sha256": model.sha256,
                                                       "dtype": "float32"})
    for name, digest in manifest.files.items():  # just hashed by write_manifest: no second full read
        write_stamp(out / name, digest, stamp_path(stamps, name))
    return str(out)


def load_tokenizer(model: ResolvedModel):
    """The model's transformers tokenizer alone (GGUF models are converted once, then cached)."""
    from transformers import AutoTokenizer

    source = _converted_dir(model) if model.kind == "gguf" else model.path
    return AutoTokenizer.from_pretrained(source, local_files_only=True)


def tokenizer_hash_of(tokenizer) -> str:
    return tokenizer_fingerprint(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
