"""Medusa heads in the layouts other projects load: import them as a draftwise head set, and
export a draftwise Medusa head set for vLLM.

The layouts, as read in each project's source:

- FasterDecoding/Medusa (`medusa/model/medusa_model.py`, `medusa/model/medusa_model_legacy.py`,
  `medusa/train/train_legacy.py`).  `config.json` is a `MedusaConfig` (`medusa_num_heads`,
  `medusa_num_layers`, `base_model_name_or_path`; the newer one is the base model's config with
  those keys added, so `hidden_size` and `vocab_size` there are the base model's).  Head k is
  `Sequential(ResBlock x L, Linear(d, V, bias=False))`, `ResBlock(x) = x + SiLU(Linear(x))`
  with a bias, and the trainer saves that ModuleList's state dict as
  `medusa_lm_head.safetensors`: `{k}.{j}.linear.weight|bias` for block j of head k, and
  `{k}.{L}.weight` [V, d] for head k's own LM head (initialized from the base model's, then
  trained).  Its loader reads `medusa_lm_head.pt` with `torch.load` (a pickle): refused here,
  since unpickling runs code.  (Its `[ResBlock(d)] * L` repeats one module, so with L > 1 the
  layers share weights: the file then holds L equal copies, which import as they are.)
- text-generation-inference (`server/text_generation_server/layers/medusa.py`).
  `MedusaHeadV1` reads the same keys from `medusa_lm_head.safetensors` beside `config.json`;
  when a head's `{k}.{L}.weight` is missing it falls back to `MedusaHeadV2`
  (`medusa_num_layers` must be 1), which ends every head in the base model's own LM head.  Such
  a checkpoint imports as heads that share the target's LM head (draftwise's own kind).
- vLLM (`vllm/transformers_utils/configs/medusa.py`, `vllm/model_executor/models/medusa.py`,
  `vllm/v1/spec_decode/medusa.py`).  `config.json` has `model_type: "medusa"` and
  `hidden_size`, `vocab_size`, `num_heads`, `num_hidden_layers`, `max_paths`, `topk`,
  `truncated_vocab_size` (default: `vocab_size`); `from_pretrained` renames any key holding
  "num" and "heads" (or "layers") to `num_heads` (`num_hidden_layers`).  Weights (any
  `*.safetensors`, a `medusa_heads.` prefix dropped): `blocks.{k}.layers.{j}.weight`, with
  `.bias` only under `medusa_fc_bias: true`; `lm_heads.{k}.weight` [truncated_vocab_size, d],
  or with `original_lm_head: true` one `lm_heads.0.weight` that every head uses; `token_map`
  [truncated_vocab_size] (target ids), used only when `truncated_vocab_size < vocab_size`, and
  an LM head with more rows than the map is then sliced by it; `logit_scale` (default 1)
  multiplies the logits.  `MedusaProposer` drafts the argmax of every head: one top-1 chain.

Importing is exact: the imported heads compute the same depth-i logits as the source runtime
(a `logit_scale` is folded into the LM heads).  A config that contradicts its weights (head
count, layers, hidden size, vocabulary, bias) is refused, as are keys this reader does not
know: an unread tensor could change the math.  The foreign checkpoint does not carry
draftwise's hashes, so the caller binds the head set to a target (checkpoint and tokenizer);
the provenance records the source layout, its config and the sha256 of every file read.

Exporting writes vLLM's layout: `config.json`, `model.safetensors` and `medusa_choices.json`
(the tree as Medusa-style index paths), with a draftwise manifest binding all three.  What vLLM
can use of it: the heads and their LM heads (the target's restricted to the draft vocabulary
for draftwise's own heads, written under `original_lm_head` and as `lm_heads.{k}` for
versions without it), and the draft vocabulary (`token_map`, `truncated_vocab_size`).  What it
cannot: the tree.  vLLM drafts a top-1 chain (the argmax of heads 1..num_speculative_tokens)
and reads neither `max_paths`, `topk` nor `medusa_choices.json`; the tree is there for
runtimes that take Medusa choices (FasterDecoding's `medusa_generate(medusa_choices=...)`) and
for draftwise (`--tree`).  Sampled children and exact rejection verification stay draftwise's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from draftwise.artifacts import Manifest, read_manifest, sha256_file, staged_artifact, write_manifest
from draftwise.backends.base import Backend, TokenWeights
from draftwise.errors import ArtifactError, InputError
from draftwise.heads.arch import HeadArch, MedusaHeads
from draftwise.heads.artifact import HeadTarget, load_heads, save_heads
from draftwise.topology.templates import Template, chain, from_paths, max_depth, num_children

LAYOUTS = ("medusa", "vllm")  # "medusa": FasterDecoding/Medusa and text-generation-inference
CONFIG = "config.json"
MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"
VLLM_WEIGHTS = "model.safetensors"
CHOICES = "medusa_choices.json"
EXPORT_KIND = "medusa_export"
PICKLES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")

_MEDUSA_KEY = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")
_VLLM_BLOCK = re.compile(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)")
_VLLM_HEAD = re.compile(r"lm_heads\.(\d+)\.weight")


@dataclass(frozen=True)
class ForeignHeads:
    """A foreign Medusa checkpoint, read and checked: what the source runtime computes."""

    layout: str  # one of LAYOUTS
    config: dict[str, Any]
    files: dict[str, str]  # file name -> sha256, every file read
    blocks: list[list[tuple[torch.Tensor, torch.Tensor]]]  # head -> layer -> (W [d, d], b [d]), float32
    lm_heads: list[torch.Tensor] | None  # head -> [V_d, d] rows aligned with token_map; None: the target's
    token_map: torch.Tensor | None  # [V_d] target ids; None: the whole vocabulary in id order
    vocab_size: int | None  # V (None: only the target can tell, for heads on the target's LM head)
    source_heads: int  # heads in the checkpoint (blocks read: the first len(blocks))

    @property
    def hidden_size(self) -> int:
        return int(self.blocks[0][0][0].shape[0])

    @property
    def layers(self) -> int:
        return len(self.blocks[0])


def _pickle_refused(path: Path, pickled: Sequence[Path]) -> ArtifactError:
    names = ", ".join(p.name for p in pickled)
    return ArtifactError(
        f"{path}: the weights are in {names}, a pickle (torch.save); draftwise never unpickles a file, since loading "
        "one runs code. Convert it to safetensors where you trust its origin, e.g. `python -c \"import torch; from "
        "safetensors.torch import save_file; save_file(torch.load('medusa_lm_head.pt', weights_only=True), "
        "'medusa_lm_head.safetensors')\"`, and import the directory again"
    )


def _pickles(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in PICKLES and p.is_file())


def _read_json(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ArtifactError(f"{path} is not a JSON object")
    return body


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not a readable safetensors file: {exc}") from exc


def _int(config: dict[str, Any], key: str, where: Path) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArtifactError(f"{where}: {key} is {value!r}, not an integer")
    return value


def _contiguous(indices: set[int], what: str, where: Path) -> int:
    if not indices or sorted(indices) != list(range(len(indices))):
        raise ArtifactError(f"{where}: {what} are numbered {sorted(indices)}, expected 0..n-1")
    return len(indices)


def _check_count(stated: int | None, found: int, key: str, where: Path) -> None:
    if stated is not None and stated != found:
        raise ArtifactError(f"{where}: config {key} = {stated} but the weights hold {found}")


def _heads_to_use(stated: int | None, found: int, key: str, where: Path, num_heads: int | None) -> int:
    """The config's head count must match the weights; `num_heads` picks the first N instead."""
    if num_heads is not None:
        if not 1 <= num_heads <= found:
            raise InputError(f"{where}: asked for {num_heads} heads, the weights hold {found}")
        return num_heads
    if stated is not None and stated != found:
        raise ArtifactError(f"{where}: config {key} = {stated} but the weights hold {found} heads; if the config is "
                            f"wrong (some uploads are), pass the number of heads to import (--heads N)")
    return found


def _keys(file: Path) -> list[str]:
    try:
        with safe_open(str(file), framework="pt") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{file} is not a readable safetensors file: {exc}") from exc


def detect_layout(directory: Path) -> str:
    """'medusa' (FasterDecoding/TGI: `medusa_lm_head.safetensors`, `medusa_num_heads`) or 'vllm'
    (`model_type: "medusa"`, weights named `blocks.{k}.layers.{j}`)."""
    directory = Path(directory)
    config = _read_json(directory / CONFIG) if (directory / CONFIG).is_file() else {}
    if (directory / MEDUSA_WEIGHTS).is_file() or (directory / "medusa_lm_head.pt").is_file():
        return "medusa"
    names = [k.replace("medusa_heads.", "") for f in sorted(directory.glob("*.safetensors")) for k in _keys(f)]
    if config.get("model_type") == "medusa" or any(_VLLM_BLOCK.fullmatch(k) for k in names):
        return "vllm"
    if "medusa_num_heads" in config or any(_MEDUSA_KEY.fullmatch(k) for k in names):
        return "medusa"  # its reader names the missing file
    raise ArtifactError(f"{directory}: neither a FasterDecoding/TGI Medusa checkpoint ({MEDUSA_WEIGHTS}, "
                        f"medusa_num_heads) nor a vLLM one (model_type 'medusa', blocks.{{k}}.layers.{{j}} weights)")


def read_medusa(path: Path, num_heads: int | None = None) -> ForeignHeads:
    """Read a FasterDecoding/TGI or vLLM Medusa directory (layout detected); nothing is unpickled."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such Medusa checkpoint")
    if path.is_file() and path.suffix in PICKLES:
        raise _pickle_refused(path.parent, [path])
    if not path.is_dir():
        raise InputError(f"{path}: give the checkpoint's directory (its {CONFIG} and weights)")
    if not (path / CONFIG).is_file():
        raise ArtifactError(f"{path}: {CONFIG} is missing; a Medusa checkpoint states its heads and layers there")
    layout = detect_layout(path)
    return _read_fasterdecoding(path, num_heads) if layout == "medusa" else _read_vllm(path, num_heads)


def _read_fasterdecoding(directory: Path, num_heads: int | None) -> ForeignHeads:
    config = _read_json(directory / CONFIG)
    weights = directory / MEDUSA_WEIGHTS
    if not weights.is_file():
        if _pickles(directory):
            raise _pickle_refused(directory, _pickles(directory))
        raise ArtifactError(f"{directory}: {MEDUSA_WEIGHTS} is missing")
    tensors = _load_tensors(weights)
    parts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    unknown = []
    for key, value in tensors.items():
        match = _MEDUSA_KEY.fullmatch(key)
        if match is None:
            unknown.append(key)
            continue
        parts.setdefault(int(match[1]), {}).setdefault(int(match[2]), {})[match[3]] = value
    if unknown:
        raise ArtifactError(f"{weights}: tensors this reader does not know: {', '.join(sorted(unknown)[:5])}")
    found = _contiguous(set(parts), "heads", weights)
    layers = {k: sorted(j for j, names in head.items() if "linear.weight" in names) for k, head in parts.items()}
    count = len(layers[0])
    if count == 0 or any(v != list(range(count)) for v in layers.values()):
        raise ArtifactError(f"{weights}: every head needs residual blocks 0..L-1 with the same L, found {layers}")
    _check_count(_int(config, "medusa_num_layers", directory), count, "medusa_num_layers", directory)
    use = _heads_to_use(_int(config, "medusa_num_heads", directory), found, "medusa_num_heads", directory, num_heads)
    own = [count in head for head in parts.values()]  # {k}.{L}.weight: the head's own LM head
    if any(own) != all(own):
        raise ArtifactError(f"{weights}: some heads have their own LM head ({{k}}.{count}.weight) and some do not")
    for k, head in parts.items():
        expected = {j: {"linear.weight", "linear.bias"} for j in range(count)} | ({count: {"weight"}} if own[0] else {})
        if {j: set(names) for j, names in head.items()} != expected:
            raise ArtifactError(f"{weights}: head {k} does not hold exactly {count} blocks (linear.weight and "
                                "linear.bias)" + (" and its LM head" if own[0] else ""))
    blocks = [[(parts[k][j]["linear.weight"], parts[k][j]["linear.bias"]) for j in range(count)] for k in range(use)]
    lm_heads = [parts[k][count]["weight"] for k in range(use)] if own[0] else None
    vocab = _int(config, "vocab_size", directory)
    if lm_heads is not None:
        if vocab is not None and vocab != lm_heads[0].shape[0]:
            raise ArtifactError(f"{directory}: config vocab_size = {vocab} but the LM heads have {lm_heads[0].shape[0]} rows")
        vocab = int(lm_heads[0].shape[0])
    heads = _checked(blocks, lm_heads, _int(config, "hidden_size", directory), directory)
    return ForeignHeads("medusa", config, {CONFIG: sha256_file(directory / CONFIG), MEDUSA_WEIGHTS: sha256_file(weights)},
                        heads[0], heads[1], None, vocab, found)


def _checked(blocks: list[list[tuple[torch.Tensor, torch.Tensor]]], lm_heads: list[torch.Tensor] | None,
             hidden: int | None, where: Path) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], list[torch.Tensor] | None]:
    """Shapes agree with one hidden size (and the config's), and every tensor becomes float32."""
    d = int(blocks[0][0][0].shape[-1])
    if hidden is not None and hidden != d:
        raise ArtifactError(f"{where}: config hidden_size = {hidden} but the weights are {d} wide")
    for k, head in enumerate(blocks):
        for j, (w, b) in enumerate(head):
            if tuple(w.shape) != (d, d) or tuple(b.shape) != (d,):
                raise ArtifactError(f"{where}: head {k} block {j} has weight {tuple(w.shape)} and bias {tuple(b.shape)}, "
                                    f"expected ({d}, {d}) and ({d},)")
    if lm_heads is not None:
        rows = int(lm_heads[0].shape[0])
        for k, lm in enumerate(lm_heads):
            if lm.ndim != 2 or tuple(lm.shape) != (rows, d):
                raise ArtifactError(f"{where}: head {k}'s LM head is {tuple(lm.shape)}, expected ({rows}, {d})")
    as_float = [[(w.float(), b.float()) for w, b in head] for head in blocks]
    return as_float, None if lm_heads is None else [lm.float() for lm in lm_heads]


def _vllm_config(directory: Path) -> dict[str, Any]:
    """config.json as vLLM's MedusaConfig.from_pretrained reads it (its key renaming included)."""
    config = _read_json(directory / CONFIG)
    read = dict(config)
    for key in list(read):
        if "num" in key:
            if "heads" in key:
                read["num_heads"] = read.pop(key)
            elif "layers" in key:
                read["num_hidden_layers"] = read.pop(key)
    return read


def _read_vllm(directory: Path, num_heads: int | None) -> ForeignHeads:
    config = _read_json(directory / CONFIG)
    read = _vllm_config(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        if _pickles(directory):
            raise _pickle_refused(directory, _pickles(directory))
        raise ArtifactError(f"{directory}: no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for key, value in _load_tensors(file).items():
            name = key.replace("medusa_heads.", "")
            if name in tensors:
                raise ArtifactError(f"{directory}: tensor {name} is in more than one weights file")
            tensors[name] = value
    blocks_found: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    heads_found: dict[int, torch.Tensor] = {}
    token_map = tensors.pop("token_map", None)
    shared = tensors.pop("lm_head.weight", None)  # the parameter name under original_lm_head
    unknown = []
    for key, value in tensors.items():
        if (match := _VLLM_BLOCK.fullmatch(key)) is not None:
            blocks_found.setdefault(int(match[1]), {}).setdefault(int(match[2]), {})[match[3]] = value
        elif (match := _VLLM_HEAD.fullmatch(key)) is not None:
            heads_found[int(match[1])] = value
        else:
            unknown.append(key)
    if unknown:
        hint = (f" (FasterDecoding/TGI names: the file must be {MEDUSA_WEIGHTS})"
                if any(_MEDUSA_KEY.fullmatch(k) for k in unknown) else "")
        raise ArtifactError(f"{directory}: tensors this reader does not know: {', '.join(sorted(unknown)[:5])}{hint}")
    found = _contiguous(set(blocks_found), "heads (blocks.{k})", directory)
    layers = {k: sorted(head) for k, head in blocks_found.items()}
    count = len(layers[0])
    if any(v != list(range(count)) for v in layers.values()):
        raise ArtifactError(f"{directory}: every head needs layers 0..L-1 with the same L, found {layers}")
    _check_count(_int(read, "num_hidden_layers", directory), count, "num_hidden_layers", directory)
    use = _heads_to_use(_int(read, "num_heads", directory), found, "num_heads", directory, num_heads)
    bias = bool(read.get("medusa_fc_bias", False))
    for k, head in blocks_found.items():
        for j, names in head.items():
            if "weight" not in names or ("bias" in names) != bias:
                raise ArtifactError(
                    f"{directory}: blocks.{k}.layers.{j} holds {sorted(names)} but medusa_fc_bias is {bias}: vLLM would "
                    + ("drop the bias" if "bias" in names else "leave the bias unset")
                )
    blocks = [[(layer["weight"], layer["bias"] if bias else torch.zeros(layer["weight"].shape[0]))
               for layer in (blocks_found[k][j] for j in range(count))] for k in range(use)]
    if read.get("original_lm_head", False):
        if shared is None:
            shared = heads_found.get(0)
        if shared is None:
            raise ArtifactError(f"{directory}: original_lm_head is set but there is no lm_heads.0.weight (or lm_head.weight)")
        lm_heads = [shared] * use
    else:
        if shared is not None:
            raise ArtifactError(f"{directory}: lm_head.weight is there but original_lm_head is not set: vLLM would not read it")
        missing = [k for k in range(use) if k not in heads_found]
        if missing:
            raise ArtifactError(f"{directory}: no lm_heads.{missing[0]}.weight for head {missing[0]}")
        lm_heads = [heads_found[k] for k in range(use)]
    vocab = _int(read, "vocab_size", directory)
    if vocab is None:
        raise ArtifactError(f"{directory}: config has no vocab_size")
    truncated = _int(read, "truncated_vocab_size", directory)
    truncated = vocab if truncated is None else truncated
    if not 0 < truncated <= vocab:
        raise ArtifactError(f"{directory}: truncated_vocab_size = {truncated} for a vocab_size of {vocab}")
    kept: torch.Tensor | None = None
    if truncated < vocab:
        if token_map is None:
            raise ArtifactError(f"{directory}: truncated_vocab_size {truncated} < vocab_size {vocab} needs a token_map")
        if token_map.is_floating_point() or token_map.is_complex() or token_map.dtype == torch.bool:
            raise ArtifactError(f"{directory}: token_map holds {token_map.dtype}, not integer token ids")
        kept = token_map.long()
        if kept.shape != (truncated,) or int(kept.min()) < 0 or int(kept.max()) >= vocab or torch.unique(kept).numel() != truncated:
            raise ArtifactError(f"{directory}: token_map {tuple(token_map.shape)} is not {truncated} distinct ids below {vocab}")
    rows = []
    for k, lm in enumerate(lm_heads):
        if lm.ndim == 2 and kept is not None and lm.shape[0] == vocab and vocab > truncated:
            lm = lm[kept]  # vLLM slices a full LM head by the map
        if lm.ndim != 2 or lm.shape[0] != truncated:
            raise ArtifactError(f"{directory}: head {k}'s LM head has {lm.shape[0] if lm.ndim else '?'} rows, config "
                                f"truncated_vocab_size is {truncated}")
        rows.append(lm)
    heads = _checked(blocks, rows, _int(read, "hidden_size", directory), directory)
    scale = read.get("logit_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ArtifactError(f"{directory}: logit_scale is {scale!r}, not a number")
    lm_rows = heads[1]
    assert lm_rows is not None
    if scale != 1.0:
        lm_rows = [lm * float(scale) for lm in lm_rows]  # vLLM's LogitsProcessor scales the logits
    files_read = {CONFIG: sha256_file(directory / CONFIG), **{f.name: sha256_file(f) for f in files}}
    return ForeignHeads("vllm", config, files_read, heads[0], lm_rows, kept, vocab, found)


def _target_rows(weights: TokenWeights, token_map: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(weights.lm_head)[token_map].float()  # [V_d, d]


def import_medusa(path: Path, target_checkpoint: str, tokenizer_hash: str, out: Path, *,
                  token_weights: TokenWeights | None = None, num_heads: int | None = None) -> Manifest:
    """Write `out`, a draftwise Medusa head set bound to the given target, from a foreign Medusa
    checkpoint (FasterDecoding/TGI or vLLM).  With the target's `token_weights`, its LM head's
    shape is checked against the heads', heads without an LM head of their own read it, and heads
    whose LM heads equal it (restricted to the draft vocabulary) are stored as sharing it.
    `num_heads`: import the first N heads (for a config whose head count is known wrong)."""
    foreign = read_medusa(path, num_heads)
    d = foreign.hidden_size
    vocab = foreign.vocab_size
    if token_weights is not None:
        shape = tuple(token_weights.lm_head.shape)
        if vocab is not None and shape != (vocab, d):
            raise InputError(f"{path}: heads for a [{vocab}, {d}] LM head, the target's is {list(shape)}")
        if shape[1] != d:
            raise InputError(f"{path}: heads {d} wide, the target's hidden size is {shape[1]}")
        vocab = shape[0]
    if vocab is None:
        raise InputError(f"{path}: its heads end in the base model's LM head and the config gives no vocab_size; "
                         "pass the target's token weights (draftwise heads import --target MODEL)")
    token_map = foreign.token_map if foreign.token_map is not None else torch.arange(vocab)
    own = foreign.lm_heads is not None
    if own and token_weights is not None:
        target_rows = _target_rows(token_weights, token_map)
        assert foreign.lm_heads is not None
        own = not all(torch.equal(lm, target_rows) for lm in foreign.lm_heads)
    arch = HeadArch("medusa", len(foreign.blocks), d, foreign.layers, vocab, int(token_map.numel()), own_lm_head=own)
    heads = MedusaHeads(arch)
    with torch.no_grad():
        for k, head in enumerate(foreign.blocks):
            for j, (w, b) in enumerate(head):
                heads.blocks[k][j].linear.weight.copy_(w)
                heads.blocks[k][j].linear.bias.copy_(b)
            if own:
                assert foreign.lm_heads is not None
                heads.lm_heads[k].weight.copy_(foreign.lm_heads[k])
    heads.eval().requires_grad_(False)
    lm_head = "own" if own else ("target" if foreign.lm_heads is None else "target (the source's equal it)")
    provenance = {
        "family": "medusa",
        "imported": {"layout": foreign.layout, "source": str(path), "config": foreign.config, "files": foreign.files,
                     "source_heads": foreign.source_heads, "lm_head": lm_head},
    }
    dtype = exact_dtype(list(heads.state_dict().values()))  # the source's precision, no rounding
    return save_heads(out, arch, heads, token_map, HeadTarget(target_checkpoint, tokenizer_hash), provenance, dtype)


def _as_tree(tree: Template | Sequence[Sequence[int]] | None, num_heads: int) -> Template:
    template = chain(num_heads) if tree is None else from_paths(tree)
    if not template:
        raise InputError("the tree has no node")
    if max_depth(template) > num_heads:
        raise InputError(f"tree of depth {max_depth(template)} for {num_heads} heads")
    return template


def _leaves(template: Template) -> int:
    prefixes = {p[:-1] for p in template}
    return sum(1 for p in template if p not in prefixes)


def exact_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    """The narrowest of bfloat16, float16, float32 that holds every (float32) tensor exactly."""
    for dtype in (torch.bfloat16, torch.float16):
        if all(torch.equal(t.to(dtype).float(), t.float()) for t in tensors):
            return dtype
    return torch.float32


def export_vllm(headset_dir: Path, out: Path, tree: Template | Sequence[Sequence[int]] | None = None, *,
                target: TokenWeights | Backend | None = None) -> Manifest:
    """Write `out` in vLLM's Medusa layout from a draftwise Medusa head set.  `target`: a loaded
    backend (its binding is checked, its `token_weights()` read) or a `TokenWeights`; needed
    when the heads share the target's LM head.  `tree` (index paths; default: the chain through
    every head) goes to `medusa_choices.json` for runtimes that take Medusa choices: vLLM drafts
    a top-1 chain and ignores it.  Tensors are written in the narrowest dtype that holds them exactly."""
    headset = load_heads(headset_dir)
    arch = headset.arch
    if arch.family != "medusa":
        raise InputError(f"{headset_dir}: vLLM runs Medusa heads; these are {arch.family} heads")
    assert isinstance(headset.heads, MedusaHeads)
    template = _as_tree(tree, arch.num_heads)
    weights: TokenWeights | None
    if target is None or isinstance(target, TokenWeights):
        weights = target
    else:
        headset.check_target(target.info.checkpoint, target.info.tokenizer_hash)
        weights = target.token_weights()  # type: ignore[attr-defined]
    token_map = headset.token_map
    if arch.own_lm_head:
        rows = [lm.weight.detach().float() for lm in headset.heads.lm_heads]
    else:
        if weights is None:
            raise InputError(f"{headset_dir}: these heads end in the target's LM head; pass the target "
                             "(draftwise heads export --target MODEL)")
        if tuple(weights.lm_head.shape) != (arch.vocab_size, arch.hidden_size):
            raise InputError(f"heads for a [{arch.vocab_size}, {arch.hidden_size}] LM head, the target's is "
                             f"{list(weights.lm_head.shape)}")
        rows = [_target_rows(weights, token_map)] * arch.num_heads
    truncated = arch.draft_vocab < arch.vocab_size
    if not truncated:  # vLLM ignores the map then: rows go in id order
        order = torch.empty_like(token_map)
        order[token_map] = torch.arange(token_map.numel())
        rows = [r[order] for r in rows]
    tensors: dict[str, torch.Tensor] = {}
    for k, block in enumerate(headset.heads.blocks):
        for j, res in enumerate(block):
            tensors[f"blocks.{k}.layers.{j}.weight"] = res.linear.weight.detach().float()
            tensors[f"blocks.{k}.layers.{j}.bias"] = res.linear.bias.detach().float()
    for k, r in enumerate(rows):
        tensors[f"lm_heads.{k}.weight"] = r
    dtype = exact_dtype(list(tensors.values()))
    tensors = {k: v.to(dtype, copy=True).contiguous() for k, v in tensors.items()}  # equal heads: no shared storage
    if truncated:
        tensors["token_map"] = token_map.to(torch.int64).contiguous()
    widths = num_children(template)
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": arch.hidden_size,
        "vocab_size": arch.vocab_size,
        "num_heads": arch.num_heads,
        "num_hidden_layers": arch.layers,
        "truncated_vocab_size": arch.draft_vocab,
        "medusa_fc_bias": True,
        "original_lm_head": not arch.own_lm_head,  # one LM head for every head (the lm_heads.{k} are equal)
        "max_paths": _leaves(template),
        "topk": max(widths.values()),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    with staged_artifact(Path(out), EXPORT_KIND) as staging:
        save_file(tensors, str(staging / VLLM_WEIGHTS), metadata={"format": "pt"})
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        (staging / CHOICES).write_text(json.dumps([list(p) for p in template]) + "\n")
        manifest = write_manifest(staging, EXPORT_KIND, {
            "layout": "vllm",
            "heads": {"directory": str(headset_dir), "manifest_hash": headset.manifest_hash, "arch": arch.as_dict()},
            "target": {"checkpoint": headset.target.checkpoint, "tokenizer_hash": headset.target.tokenizer_hash},
            "tree": [list(p) for p in template],
        })
    return manifest


def read_export(directory: Path) -> Manifest:
    """Verify an export's manifest (vLLM itself reads only config.json and the weights)."""
    return read_manifest(Path(directory), kind=EXPORT_KIND, required=(CONFIG, VLLM_WEIGHTS, CHOICES))
