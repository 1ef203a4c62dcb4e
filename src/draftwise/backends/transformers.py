"""PyTorch / transformers backend: tree verification through the public model call.

A round is ONE forward pass over [pending, candidate rows] with explicit position ids and
an additive 4D attention mask [1, 1, 1 + N, T + 1 + N] (every committed column visible,
candidate columns visible only for self and ancestors), on the model's own DynamicCache.
No modeling code is copied or patched.  `commit` gathers the accepted rows of every layer's
cache next to the pending row and crops the rest.  `verify_more` appends rows to the
provisional tree with one more forward whose mask shows them their provisional ancestors.
"""

from __future__ import annotations

import logging

import inspect
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from draftwise.artifacts import read_manifest, stamp_path, verify_files, write_manifest, write_stamp
from draftwise.backends.base import (BackendError, BackendInfo, ContextOverflow, TokenWeights, check_grows, check_path,
                                     tokenizer_fingerprint)
from draftwise.backends.dtype import CONCRETE_DTYPES, DEFAULT_DTYPE, TorchDtype, check_dtype
from draftwise.backends.row_padding import RowPadding
from draftwise.backends.torch_probs import policy_probs
from draftwise.models import ResolvedModel, cache_dir
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.runtime.text import check_messages, check_utf8
from draftwise.topology.compile import CompiledRound
from draftwise.runtime.logits import cached

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)


@dataclass(frozen=True, eq=False)
class TorchLogits:
    """TargetLogits over a device tensor [1 + N, V].

    On an accelerator the first `probs` call applies the policy to every row in one batched
    pass on the device and copies the result to the host once; later rows are host slices, so
    a walk costs one sync instead of one per node.  On the CPU there is no sync to save and a
    walk visits few rows, so each row goes through the NumPy reference (`SamplingPolicy.probs`,
    on a zero-copy view) when first asked for.  `on_device` forces the choice (tests run the
    batched torch pass on the CPU)."""

    logits: torch.Tensor
    on_device: bool | None = None  # None: batched torch pass on accelerators, NumPy rows on the CPU
    _cache: dict = field(default_factory=dict, init=False, repr=False)  # policy or (policy, row) -> host array

    def argmax(self) -> np.ndarray:
        return self.logits.argmax(dim=-1).cpu().numpy()

    def probs(self, row: int, policy: SamplingPolicy) -> np.ndarray:
        if self._batched:
            return self.probs_all(policy)[row]  # [V]
        return cached(self._cache, (policy, row), lambda: policy.probs(self._host(row)))  # [V]

    def probs_all(self, policy: SamplingPolicy) -> np.ndarray:
        """[1 + N, V] float64 on the host: one batched pass (on the device when batched), one copy."""
        if not self._batched:
            return policy.probs(self._host())
        return cached(self._cache, policy, lambda: self._on_device(policy).cpu().numpy())

    @property
    def _batched(self) -> bool:
        return self.logits.device.type != "cpu" if self.on_device is None else self.on_device

    def _host(self, rows: int | slice = slice(None)) -> np.ndarray:
        """Host view of `rows` ([V] or [R, V]); float32 and float64 as they are, half precisions
        widened to float32 as before (only the rows asked for)."""
        logits = self.logits[rows]
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        return logits.detach().cpu().numpy()

    def _on_device(self, policy: SamplingPolicy) -> torch.Tensor:
        with torch.inference_mode():
            return policy_probs(self.logits, policy)  # [1 + N, V] float64, on the logits' device


class TransformersBackend:
    def __init__(self, model, tokenizer, info: BackendInfo) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.device = torch.device(info.device)
        self._cache = None
        self._committed = 0  # KV rows that are authoritative
        self._pending_rows = 0  # provisional rows appended by the last verify (pending included)
        self._round: CompiledRound | None = None  # the provisional round (None: pending only); rows grow by verify_more
        self._cache_kwarg = _cache_kwarg(model)
        self._track = False  # keep hidden states (draft heads read them)
        self._rows_hidden: torch.Tensor | None = None  # [1 + N, d] of the provisional rows (pending first)
        self._frontier: torch.Tensor | None = None  # [d] of committed row cached_len - 1
        self._last_hidden: torch.Tensor | None = None  # [keep, d] of the last forward's kept rows
        self._track_context = False  # keep every committed row's hidden state (a layer over the context reads them)
        self._context: _GrowingRows | None = None  # [cached_len, d] committed rows' states; None: unknown
        self._read_hidden: torch.Tensor | None = None  # [R, d] every row of the last forward (context tracking)
        # verify forwards padded to the row count measured fastest here (backends/row_padding.py); None: never
        self.row_padding: RowPadding | None = None

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def load(cls, model: ResolvedModel, device: str = "cpu", dtype: TorchDtype = DEFAULT_DTYPE) -> "TransformersBackend":
        """The model in `dtype` (float32 or bfloat16; `auto` is settled by `draftwise.backends.load.load_backend`).
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
        info = BackendInfo(
            name="transformers",
            checkpoint=model.checkpoint_id,
            tokenizer_hash=tokenizer_hash_of(tokenizer),
            vocab_size=int(net.config.vocab_size),
            context_length=int(getattr(net.config, "max_position_embeddings", 2048)),
            dtype=str(net.dtype).removeprefix("torch."),  # what the weights are, as loaded: the round manifest records it
            device=device,
            eos_token_ids=frozenset(int(e) for e in eos if e is not None),
            kv_row_bytes=kv_row_bytes(net.config, net.dtype),
        )
        return cls(net, tokenizer, info)

    def fork(self) -> "TransformersBackend":
        """Another sequence on the same loaded weights: its own KV (empty until `reset`) and none of
        this one's state.  A batch gives each request's draft model one (the weights are read-only)."""
        twin = TransformersBackend(self.model, self.tokenizer, self.info)
        twin.row_padding = self.row_padding
        return twin

    # ---- state ---------------------------------------------------------------------------
    @property
    def cached_len(self) -> int:
        return self._committed

    @property
    def n_threads(self) -> int:
        # torch's intra-op pool is per process (load_backend sets it from --threads), so read it live.
        return torch.get_num_threads()

    def reserve(self, tree_rows: int) -> None:
        pass  # a tree is a 4D mask over one cache: nothing to size per branch

    def reset(self) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(config=self.model.config)
        self._committed = 0
        self._pending_rows = 0
        self._rows_hidden = None
        self._frontier = None
        self._context = _GrowingRows(self.model.config.hidden_size, self.model.dtype, self.device) \
            if self._track_context else None

    # ---- hidden states (draft heads) ------------------------------------------------------------
    def track_hidden(self, on: bool = True) -> None:
        self._track = on

    def track_context(self, on: bool = True) -> None:
        self._track_context = on
        if on:
            self._track = True
        else:
            self._context = None

    def context_hidden(self, start: int) -> np.ndarray | None:
        if self._context is None or self._context.length != self._committed or not 0 <= start <= self._committed:
            return None
        return self._context.rows(start).to(torch.float32, copy=True).cpu().numpy()

    def _keep_context(self, rows: torch.Tensor | None) -> None:
        """Append the states of rows just committed [R, d] (None: unknown, so is every later row)."""
        if self._context is not None:
            if rows is None:
                self._context = None
            else:
                self._context.append(rows)

    def frontier_hidden(self) -> np.ndarray | None:
        return None if self._frontier is None else self._frontier.float().cpu().numpy()

    def token_weights(self) -> TokenWeights:
        embed = self.model.get_input_embeddings().weight.detach().float().cpu()
        head = self.model.get_output_embeddings().weight.detach().float().cpu()
        return TokenWeights(embed.numpy(), embed.numpy() if head.data_ptr() == embed.data_ptr() else head.numpy())

    def _forward(self, ids: list[int], positions: torch.Tensor | None, mask: torch.Tensor | None, keep: int):
        """Logits of the last `keep` rows.  A forward that fails part way (out of memory) may
        have appended rows to some layers only: the cache is cut back to what it held before."""
        if self._cache is None:
            self.reset()
        self._check_room(len(ids))
        before = self._committed + self._pending_rows
        rows = len(ids)
        pad = self._padding(rows, keep, before, positions)
        if pad:
            ids, positions, mask = _padded(ids, positions, mask, pad)
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, R + pad]
        try:
            with torch.inference_mode():
                out = self.model(
                    input_ids=input_ids,
                    position_ids=positions,
                    attention_mask=mask,
                    use_cache=True,
                    **{self._cache_kwarg: self._cache},
                    logits_to_keep=keep + pad,
                    output_hidden_states=self._track,
                )
        except BaseException:
            self._crop_to(before)
            raise
        if pad:
            self._crop_to(before + rows)  # the padding rows' KV: no later row may see it
        # the last entry is the final norm's output, the LM head's input (checked by a test); the
        # kept rows are the last `keep` of the R real ones, the padding rows come after them
        self._last_hidden = out.hidden_states[-1][0, rows - keep : rows] if self._track else None  # [keep, d]
        self._read_hidden = out.hidden_states[-1][0, :rows] if self._track and self._track_context else None  # [R, d]
        return out.logits[0, :keep]  # [keep, V]

    def _padding(self, rows: int, keep: int, before: int, positions: torch.Tensor | None) -> int:
        """Padding rows for a forward of `rows` rows that reads out `keep` (0: none).  Only a
        forward that reads out every row is padded (a verify: its LM head is the product whose
        price jumps), with positions given, and where the context has room for the padding."""
        if self.row_padding is None or keep != rows or positions is None:
            return 0
        pad = self.row_padding.rows_for(rows) - rows
        return pad if before + rows + pad <= self.info.context_length else 0

    def _crop_to(self, length: int) -> None:
        """Cut every layer back to `length` rows (an absolute length: after a forward that
        failed part way, the layers need not hold the same number of rows)."""
        for layer in self._cache.layers:
            extra = layer.get_seq_length() - length if layer.is_initialized else 0
            if extra > 0:
                layer.crop(-extra)

    def _check_room(self, rows: int) -> None:
        held = self._committed + self._pending_rows
        if held + rows > self.info.context_length:
            raise ContextOverflow(f"{held} cached + {rows} new rows exceed the context of {self.info.context_length}")

    def extend(self, tokens: Sequence[int]) -> TorchLogits:
        if self._pending_rows:
            raise BackendError("extend() while a verify is provisional; commit or roll back first")
        if not tokens:
            raise BackendError("extend() needs at least one token")
        start = self._committed
        positions = torch.arange(start, start + len(tokens), device=self.device)[None]  # [1, R]
        logits = self._forward(list(tokens), positions, None, keep=1)
        self._committed += len(tokens)
        self._frontier = None if self._last_hidden is None else self._last_hidden[-1]
        self._keep_context(self._read_hidden)
        return TorchLogits(logits[-1:])

    def verify(self, pending: int, round_: CompiledRound | None, unread: Sequence[int] = ()) -> TorchLogits:
        if self._pending_rows:
            raise BackendError("verify() while a previous verify is provisional; commit or roll back first")
        n = 0 if round_ is None else round_.n
        if 1 + n > self.info.max_verify_rows:
            raise BackendError(f"round of {1 + n} rows exceeds this backend's limit of {self.info.max_verify_rows}")
        u = len(unread)
        t = self._committed + u  # the pending token's position
        ids = [int(x) for x in unread] + [int(pending)] + ([] if round_ is None else round_.token_ids.tolist())
        if round_ is None or _is_chain(round_):
            positions = torch.arange(t - u, t + 1 + n, device=self.device)[None]  # causal default mask is right
            mask = None
        else:
            positions = torch.from_numpy(np.concatenate([np.arange(t - u, t + 1), round_.position_ids]))
            positions = positions.to(self.device)[None]  # [1, U+1+N]
            mask = self._tree_mask(t, u, round_)
        logits = self._forward(ids, positions, mask, keep=1 + n)  # [1+N, V]: the unread rows' are not needed
        self._committed = t  # the unread rows are context: committed, whatever the round's outcome
        if u:
            self._keep_context(None if self._read_hidden is None else self._read_hidden[:u])
        self._pending_rows = 1 + n
        self._round = round_
        self._rows_hidden = self._last_hidden
        return TorchLogits(logits)

    def verify_more(self, round_: CompiledRound, first_row: int) -> TorchLogits:
        check_grows(self._round, self._pending_rows, self._committed + 1, round_, first_row)
        n, t = round_.n, self._committed
        if 1 + n > self.info.max_verify_rows:
            raise BackendError(f"round of {1 + n} rows exceeds this backend's limit of {self.info.max_verify_rows}")
        # the new rows follow the provisional ones in the cache, so cache column t + 1 + r is row r
        visible = torch.zeros((n - first_row, t + 1 + n), dtype=torch.bool)  # [M, T+1+N]
        visible[:, : t + 1] = True  # the committed prefix and the pending token
        visible[:, t + 1 :] = torch.from_numpy(round_.ancestor_mask[first_row:])  # self and ancestors
        positions = torch.from_numpy(round_.position_ids[first_row:]).to(self.device)[None]  # [1, M]
        logits = self._forward(round_.token_ids[first_row:].tolist(), positions, self._additive(visible),
                               keep=n - first_row)  # [M, V]
        self._pending_rows = 1 + n
        self._round = round_
        if self._rows_hidden is not None and self._last_hidden is not None:
            self._rows_hidden = torch.cat([self._rows_hidden, self._last_hidden])
        return TorchLogits(logits)

    def _tree_mask(self, t: int, u: int, round_: CompiledRound) -> torch.Tensor:
        """Additive mask [1, 1, U+1+N, T+1+N] for u unread rows, the pending row at position t and N candidates."""
        n = round_.n
        visible = torch.zeros((u + 1 + n, t + 1 + n), dtype=torch.bool)  # [U+1+N, T+1+N]
        visible[: u + 1, : t + 1] = torch.arange(t + 1)[None] <= torch.arange(t - u, t + 1)[:, None]  # causal
        visible[u + 1 :, : t + 1] = True  # candidates see the committed prefix, the unread rows and the pending token
        visible[u + 1 :, t + 1 :] = torch.from_numpy(round_.ancestor_mask)
        return self._additive(visible)

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """[Q, K] bool -> additive mask [1, 1, Q, K] in the model's dtype."""
        return additive_mask(visible, self.model.dtype, self.device)[None, None]

    def commit(self, accepted_rows: Sequence[int]) -> None:
        if not self._pending_rows:
            raise BackendError("commit() without a provisional verify")
        check_path(self._round, accepted_rows)
        t = self._committed
        k = len(accepted_rows)
        if list(accepted_rows) != list(range(k)):  # not a prefix of the row order: gather first
            src = torch.tensor([t + 1 + r for r in accepted_rows], dtype=torch.long, device=self.device)
            with torch.inference_mode():  # the cache tensors were made under inference mode
                for layer in self._cache.layers:
                    if not layer.is_initialized:  # a layer-skipping draft runs some layers' attention only
                        continue
                    layer.keys[:, :, t + 1 : t + 1 + k] = layer.keys.index_select(2, src)
                    layer.values[:, :, t + 1 : t + 1 + k] = layer.values.index_select(2, src)
        self._crop_to(t + 1 + k)
        self._committed = t + 1 + k
        self._pending_rows = 0
        if self._rows_hidden is not None:  # the last kept row predicted the new pending token
            self._frontier = self._rows_hidden[accepted_rows[-1] + 1 if k else 0]
            self._keep_context(self._rows_hidden[[0, *(r + 1 for r in accepted_rows)]])  # pending + accepted rows
            self._rows_hidden = None
        else:
            self._keep_context(None)

    def rollback(self) -> None:
        if self._pending_rows:
            self._crop_to(self._committed)
            self._pending_rows = 0
            self._rows_hidden = None

    def truncate(self, length: int) -> None:
        self.rollback()
        if length < self._committed:
            self._crop_to(length)
            self._committed = length
            self._frontier = None
            if self._context is not None:
                self._context.crop(length)

    def kv_bytes(self) -> int:
        if self._cache is None:
            return 0
        return sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in self._cache.layers
                   if layer.is_initialized)

    # ---- text ----------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        check_utf8(text)  # text that is not valid UTF-8 is refused by name (draftwise.runtime.text), as on llama.cpp
        return list(self.tokenizer(text, add_special_tokens=add_special).input_ids)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        check_messages(messages)
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Bool visibility [..., Q, K] -> the additive attention mask of the same shape in `dtype`
    (0 where a row sees a column, the dtype's minimum where it does not), on `device`."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask.to(device)


def _padded(ids: list[int], positions: torch.Tensor, mask: torch.Tensor | None, pad: int,
            ) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
    """A forward's inputs with `pad` padding rows after its R real ones: the last token again, at
    the next positions; with an explicit mask [1, 1, R, K] no real row sees a padding row and a
    padding row sees only itself ([1, 1, R + pad, K + pad]); under the causal default (None) the
    real rows come first, so none sees them either."""
    last = positions[:, -1:]  # [1, 1]
    positions = torch.cat([positions, last + torch.arange(1, pad + 1, device=positions.device)[None]], dim=1)
    if mask is not None:
        rows, columns = mask.shape[-2:]
        hidden = torch.finfo(mask.dtype).min
        grown = torch.full((1, 1, rows + pad, columns + pad), hidden, dtype=mask.dtype, device=mask.device)
        grown[..., :rows, :columns] = mask
        diag = torch.arange(pad, device=mask.device)
        grown[0, 0, rows + diag, columns + diag] = 0.0
        mask = grown
    return ids + [ids[-1]] * pad, positions, mask


def kv_row_bytes(config, dtype: torch.dtype) -> int:
    """One token's K and V over every layer: 2 * layers * kv heads * head dim * element size."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _cache_kwarg(model) -> str:
    """The forward argument that takes the KV cache: transformers renamed `past_key_values` to
    `cache` (the old name warns, and goes in 5.40); older 5.x releases know only the old one."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _is_chain(round_: CompiledRound) -> bool:
    return bool(np.array_equal(round_.parent, np.arange(-1, round_.n - 1)))


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _converted_dir(model: ResolvedModel) -> str:
    """transformers reads GGUF metadata slowly (minutes for a 150k vocabulary), so the first
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


class _GrowingRows:
    """Committed rows' hidden states [length, d], appended a round at a time into a buffer that
    doubles when full: a `torch.cat` per round copied the whole context every round (on a
    700-token prompt, 1.6 MB a round for the embedded model)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device, capacity: int = 16) -> None:
        with torch.inference_mode():  # written in place with the model's inference-mode outputs
            self._buffer = torch.zeros((capacity, width), dtype=dtype, device=device)  # [capacity, d]
        self.length = 0

    def append(self, rows: torch.Tensor) -> None:
        """Rows [R, d] after the last one."""
        end = self.length + rows.shape[0]
        with torch.inference_mode():
            if end > self._buffer.shape[0]:
                grown = self._buffer.new_zeros((max(end, 2 * self._buffer.shape[0]), self._buffer.shape[1]))
                grown[: self.length] = self._buffer[: self.length]
                self._buffer = grown
            self._buffer[self.length : end] = rows
        self.length = end

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def rows(self, start: int) -> torch.Tensor:
        """A view of rows [start, length) (overwritten by a later crop and append: copy to keep)."""
        return self._buffer[start : self.length]
