"""Medusa heads in other projects' layouts (`draftwise.heads.interchange`): checkpoints written
here in FasterDecoding/TGI's and vLLM's layouts (tiny, random, safetensors) import as head sets
whose depth-i logits are the foreign math (x + SiLU(W x + b) per layer, then the head's LM head);
draftwise -> vLLM -> draftwise gives identical logits; contradictions and pickles are refused."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from draftwise.artifacts import write_manifest
from draftwise.backends.base import BackendInfo, TokenWeights
from draftwise.cli.heads import heads_app
from draftwise.errors import ArtifactError, InputError
from draftwise.heads.arch import DraftVocab, HeadArch, MedusaHeads
from draftwise.heads.artifact import KIND, TOKEN_MAP, WEIGHTS, HeadTarget, load_heads, save_heads
from draftwise.heads.interchange import CHOICES, CONFIG, MEDUSA_WEIGHTS, VLLM_WEIGHTS, export_vllm, import_medusa, read_export
from draftwise.proposers.heads import HeadsConfig, HeadsProposer
from draftwise.topology.templates import parse_template
from tests.helpers import assert_rows_close

D, V, K, L = 8, 40, 3, 2
CHECKPOINT, TOKENIZER = "toy-target", "tok" * 8


def _rand(*shape: int, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 0.5).to(dtype)


def _target(seed: int = 0) -> TokenWeights:
    gen = torch.Generator().manual_seed(seed)
    lm = _rand(V, D, gen=gen, dtype=torch.bfloat16).float()  # a bf16 checkpoint, as loaded in float32
    return TokenWeights(embed=lm.numpy(), lm_head=lm.numpy())


def _resblocks(x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    for w, b in layers:
        x = x + torch.nn.functional.silu(x @ w.float().T + b.float())
    return x


def _imported_logits(directory: Path, h: torch.Tensor, weights: TokenWeights) -> torch.Tensor:
    """[K, B, V] full-vocabulary logits of an imported head set (-inf outside its draft vocabulary)."""
    heads = load_heads(directory)
    vocab = DraftVocab(torch.from_numpy(weights.lm_head), heads.token_map)
    states = torch.stack([heads.heads.head(i, h) for i in range(1, heads.arch.num_heads + 1)])  # [K, B, d]
    return vocab.full(heads.heads.logits(states, vocab))


def write_fasterdecoding(directory: Path, *, own_lm_head: bool = True, dtype: torch.dtype = torch.float16,
                         config: dict | None = None, seed: int = 1) -> dict[str, torch.Tensor]:
    """medusa_lm_head.safetensors as FasterDecoding's trainer saves its ModuleList of
    Sequential(ResBlock x L, Linear(d, V, bias=False)), and its MedusaConfig."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for k in range(K):
        for j in range(L):
            tensors[f"{k}.{j}.linear.weight"] = _rand(D, D, gen=gen, dtype=dtype)
            tensors[f"{k}.{j}.linear.bias"] = _rand(D, gen=gen, dtype=dtype)
        if own_lm_head:
            tensors[f"{k}.{L}.weight"] = _rand(V, D, gen=gen, dtype=dtype)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / MEDUSA_WEIGHTS))
    body = {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": "toy/base",
            "transformers_version": "4.40.0", **(config or {})}
    (directory / CONFIG).write_text(json.dumps(body))
    return tensors


def fasterdecoding_logits(tensors: dict[str, torch.Tensor], h: torch.Tensor, weights: TokenWeights) -> torch.Tensor:
    out = []
    for k in range(K):
        x = _resblocks(h, [(tensors[f"{k}.{j}.linear.weight"], tensors[f"{k}.{j}.linear.bias"]) for j in range(L)])
        lm = tensors.get(f"{k}.{L}.weight")
        out.append(x @ (torch.from_numpy(weights.lm_head) if lm is None else lm.float()).T)
    return torch.stack(out)


def write_vllm(directory: Path, *, truncated: int | None = 16, bias: bool = True, original_lm_head: bool = False,
               full_rows: bool = False, logit_scale: float | None = None, prefix: str = "",
               dtype: torch.dtype = torch.bfloat16, config: dict | None = None,
               seed: int = 2) -> tuple[dict[str, torch.Tensor], dict]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    rows = V if truncated is None or full_rows else truncated
    for k in range(K):
        for j in range(L):
            tensors[f"{prefix}blocks.{k}.layers.{j}.weight"] = _rand(D, D, gen=gen, dtype=dtype)
            if bias:
                tensors[f"{prefix}blocks.{k}.layers.{j}.bias"] = _rand(D, gen=gen, dtype=dtype)
        if k == 0 or not original_lm_head:
            tensors[f"{prefix}lm_heads.{k}.weight"] = _rand(rows, D, gen=gen, dtype=dtype)
    if truncated is not None:
        tensors["token_map"] = torch.randperm(V, generator=gen)[:truncated]
    body = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": D, "vocab_size": V,
            "num_heads": K, "num_hidden_layers": L, "max_paths": 64, "topk": 10,
            "truncated_vocab_size": V if truncated is None else truncated, "medusa_fc_bias": bias,
            "original_lm_head": original_lm_head, **({"logit_scale": logit_scale} if logit_scale else {}),
            **(config or {})}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / CONFIG).write_text(json.dumps(body))
    return {k.removeprefix(prefix): v for k, v in tensors.items()}, body


def vllm_logits(tensors: dict[str, torch.Tensor], config: dict, h: torch.Tensor) -> torch.Tensor:
    """What vLLM's Medusa.compute_logits returns: [K, B, V], -inf outside the token map."""
    truncated = config["truncated_vocab_size"] < config["vocab_size"]
    token_map = tensors["token_map"].long() if truncated else None
    out = []
    for k in range(K):
        layers = [(tensors[f"blocks.{k}.layers.{j}.weight"], tensors.get(f"blocks.{k}.layers.{j}.bias", torch.zeros(D)))
                  for j in range(L)]
        x = _resblocks(h, layers)
        lm = tensors["lm_heads.0.weight" if config["original_lm_head"] else f"lm_heads.{k}.weight"].float()
        if token_map is not None and lm.shape[0] > token_map.numel():
            lm = lm[token_map]
        logits = x @ lm.T * config.get("logit_scale", 1.0)
        if token_map is None:
            out.append(logits)
        else:
            full = torch.full((h.shape[0], V), float("-inf"))
            full[:, token_map] = logits
            out.append(full)
    return torch.stack(out)


@pytest.fixture
def h() -> torch.Tensor:
    return torch.randn(5, D, generator=torch.Generator().manual_seed(7))


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """The imported heads' logits and the formula's (another matmul order): -inf at the same places."""
    assert_rows_close(got, want, "logits")


# ---- FasterDecoding / TGI ------------------------------------------------------------------------

def test_fasterdecoding_import_gives_the_heads_logits(tmp_path, h):
    tensors = write_fasterdecoding(tmp_path / "fd")
    weights = _target()
    manifest = import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out", token_weights=weights)
    heads = load_heads(tmp_path / "out")
    assert heads.arch == HeadArch("medusa", K, D, L, V, V, own_lm_head=True)
    assert heads.target == HeadTarget(CHECKPOINT, TOKENIZER)
    imported = manifest.provenance["imported"]
    assert imported["layout"] == "medusa" and imported["lm_head"] == "own"
    assert imported["config"]["base_model_name_or_path"] == "toy/base"
    assert set(imported["files"]) == {CONFIG, MEDUSA_WEIGHTS}
    assert load_file(str(tmp_path / "out" / WEIGHTS))["lm_heads.0.weight"].dtype == torch.float16  # kept exact
    _close(_imported_logits(tmp_path / "out", h, weights), fasterdecoding_logits(tensors, h, weights))


def test_tgi_v2_heads_without_lm_heads_read_the_targets(tmp_path, h):
    """TGI's MedusaHeadV2: no {k}.{L}.weight, every head ends in the base model's LM head."""
    tensors = write_fasterdecoding(tmp_path / "tgi", own_lm_head=False, dtype=torch.bfloat16)
    weights = _target()
    import_medusa(tmp_path / "tgi", CHECKPOINT, TOKENIZER, tmp_path / "out", token_weights=weights)
    heads = load_heads(tmp_path / "out")
    assert not heads.arch.own_lm_head and heads.arch.draft_vocab == V
    assert "own_lm_head" not in heads.arch.as_dict()
    _close(_imported_logits(tmp_path / "out", h, weights), fasterdecoding_logits(tensors, h, weights))
    with pytest.raises(InputError, match="vocab_size"):  # nothing tells V without the target
        import_medusa(tmp_path / "tgi", CHECKPOINT, TOKENIZER, tmp_path / "out2")


@pytest.mark.parametrize("config, match", [
    ({"medusa_num_heads": K + 2}, "medusa_num_heads = 5 but the weights hold 3 heads"),
    ({"medusa_num_layers": 1}, "medusa_num_layers = 1"),
    ({"hidden_size": D * 2}, "hidden_size = 16"),
    ({"vocab_size": V + 1}, "vocab_size = 41"),
])
def test_fasterdecoding_config_contradicting_the_weights_is_refused(tmp_path, config, match):
    write_fasterdecoding(tmp_path / "fd", config=config)
    with pytest.raises(ArtifactError, match=match):
        import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_wrong_head_count_is_overridden_only_on_request(tmp_path, h):
    tensors = write_fasterdecoding(tmp_path / "fd", config={"medusa_num_heads": 2})
    weights = _target()
    import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out", token_weights=weights, num_heads=2)
    heads = load_heads(tmp_path / "out")
    assert heads.arch.num_heads == 2 and heads.provenance["imported"]["source_heads"] == K
    _close(_imported_logits(tmp_path / "out", h, weights), fasterdecoding_logits(tensors, h, weights)[:2])
    with pytest.raises(InputError, match="asked for 4 heads"):
        import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out", num_heads=4)


def test_the_target_lm_head_must_fit_the_heads(tmp_path):
    write_fasterdecoding(tmp_path / "fd")
    small = TokenWeights(np.zeros((V - 1, D), np.float32), np.zeros((V - 1, D), np.float32))
    with pytest.raises(InputError, match=r"\[40, 8\] LM head"):
        import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out", token_weights=small)


def test_unknown_tensors_are_refused(tmp_path):
    tensors = write_fasterdecoding(tmp_path / "fd")
    save_file({**tensors, "sequential_head.0.weight": torch.zeros(2)}, str(tmp_path / "fd" / MEDUSA_WEIGHTS))
    with pytest.raises(ArtifactError, match="does not know: sequential_head"):
        import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out")


def test_pickles_are_refused_without_being_loaded(tmp_path, monkeypatch):
    def no_unpickling(*args, **kwargs):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr("pickle.load", no_unpickling)
    monkeypatch.setattr("pickle.loads", no_unpickling)
    directory = tmp_path / "fd"
    directory.mkdir()
    (directory / CONFIG).write_text(json.dumps({"medusa_num_heads": K, "medusa_num_layers": 1}))
    (directory / "medusa_lm_head.pt").write_bytes(b"\x80\x04not really a pickle")  # never opened
    with pytest.raises(ArtifactError, match=r"medusa_lm_head\.pt, a pickle"):
        import_medusa(directory, CHECKPOINT, TOKENIZER, tmp_path / "out")
    with pytest.raises(ArtifactError, match="never unpickles"):
        import_medusa(directory / "medusa_lm_head.pt", CHECKPOINT, TOKENIZER, tmp_path / "out")
    vllm = tmp_path / "vllm"
    vllm.mkdir()
    (vllm / CONFIG).write_text(json.dumps({"model_type": "medusa", "num_heads": K}))
    (vllm / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ArtifactError, match=r"pytorch_model\.bin, a pickle"):
        import_medusa(vllm, CHECKPOINT, TOKENIZER, tmp_path / "out")


def test_a_pickle_beside_the_safetensors_is_left_alone(tmp_path, h):
    tensors = write_fasterdecoding(tmp_path / "fd")
    (tmp_path / "fd" / "training_args.bin").write_bytes(b"\x80\x04")
    import_medusa(tmp_path / "fd", CHECKPOINT, TOKENIZER, tmp_path / "out")
    weights = _target()
    _close(_imported_logits(tmp_path / "out", h, weights), fasterdecoding_logits(tensors, h, weights))


# ---- vLLM ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [
    dict(),  # truncated vocabulary with a token map, fc bias
    dict(truncated=None, bias=False),  # full vocabulary, no bias (vLLM's default)
    dict(original_lm_head=True, prefix="medusa_heads."),
    dict(full_rows=True, logit_scale=0.5, dtype=torch.float32),  # a full LM head sliced by the map
])
def test_vllm_import_gives_the_heads_logits(tmp_path, h, variant):
    tensors, config = write_vllm(tmp_path / "vllm", **variant)
    import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "out")
    heads = load_heads(tmp_path / "out")
    assert heads.arch.own_lm_head and heads.provenance["imported"]["layout"] == "vllm"
    assert heads.arch.draft_vocab == config["truncated_vocab_size"]
    _close(_imported_logits(tmp_path / "out", h, _target()), vllm_logits(tensors, config, h))


def test_vllm_renames_medusa_config_keys_as_vllm_does(tmp_path, h):
    tensors, config = write_vllm(tmp_path / "vllm", config={"num_heads": None, "num_hidden_layers": None})
    body = {k: v for k, v in json.loads((tmp_path / "vllm" / CONFIG).read_text()).items() if v is not None}
    body.update(medusa_num_heads=K, medusa_num_layers=L)  # MedusaConfig.from_pretrained renames these
    (tmp_path / "vllm" / CONFIG).write_text(json.dumps(body))
    import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "out")
    _close(_imported_logits(tmp_path / "out", h, _target()), vllm_logits(tensors, config, h))


@pytest.mark.parametrize("config, match", [
    ({"num_heads": K - 1}, "num_heads = 2 but the weights hold 3 heads"),
    ({"num_hidden_layers": L + 1}, "num_hidden_layers = 3"),
    ({"hidden_size": D + 1}, "hidden_size = 9"),
    ({"vocab_size": 12}, "truncated_vocab_size = 16 for a vocab_size of 12"),
    ({"truncated_vocab_size": 20}, "token_map"),
    ({"medusa_fc_bias": False}, "vLLM would drop the bias"),
])
def test_vllm_config_contradicting_the_weights_is_refused(tmp_path, config, match):
    write_vllm(tmp_path / "vllm", config=config)
    with pytest.raises(ArtifactError, match=match):
        import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "out")


def test_vllm_truncated_without_a_token_map_is_refused(tmp_path):
    tensors, _ = write_vllm(tmp_path / "vllm")
    save_file({k: v for k, v in tensors.items() if k != "token_map"}, str(tmp_path / "vllm" / "model.safetensors"))
    with pytest.raises(ArtifactError, match="needs a token_map"):
        import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "out")


# ---- draftwise -> vLLM -> draftwise ----------------------------------------------------------------

def _draftwise_heads(directory: Path, *, draft_vocab: int = 16, seed: int = 3) -> torch.Tensor:
    """A trained-looking shared-LM-head set (bf16 on disk, as training writes it); returns its token map."""
    gen = torch.Generator().manual_seed(seed)
    arch = HeadArch("medusa", K, D, L, V, draft_vocab)
    heads = MedusaHeads(arch)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(_rand(*p.shape, gen=gen))
    token_map = torch.randperm(V, generator=gen)[:draft_vocab]
    save_heads(directory, arch, heads, token_map, HeadTarget(CHECKPOINT, TOKENIZER), {"family": "medusa"})
    return token_map


@pytest.mark.parametrize("draft_vocab", [16, V])
def test_round_trip_through_vllm_gives_identical_logits(tmp_path, h, draft_vocab):
    weights = _target()
    _draftwise_heads(tmp_path / "heads", draft_vocab=draft_vocab)
    manifest = export_vllm(tmp_path / "heads", tmp_path / "vllm", [[0], [1], [0, 0], [0, 1], [0, 0, 0]],
                           target=weights)
    assert read_export(tmp_path / "vllm").hash == manifest.hash
    config = json.loads((tmp_path / "vllm" / CONFIG).read_text())
    assert config["model_type"] == "medusa" and config["num_heads"] == K and config["num_hidden_layers"] == L
    assert config["truncated_vocab_size"] == draft_vocab and config["medusa_fc_bias"] and config["original_lm_head"]
    assert (config["max_paths"], config["topk"]) == (3, 2)
    assert json.loads((tmp_path / "vllm" / CHOICES).read_text()) == [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    exported = load_file(str(tmp_path / "vllm" / VLLM_WEIGHTS))
    assert ("token_map" in exported) == (draft_vocab < V)
    assert all(v.dtype == torch.bfloat16 for k, v in exported.items() if k != "token_map")
    # what vLLM computes from the export is what draftwise computes from the heads
    want = _imported_logits(tmp_path / "heads", h, weights)
    _close(vllm_logits(exported, config, h), want)
    # back: with the target, the LM heads are recognized as the target's; without, they are the heads' own
    import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "shared", token_weights=weights)
    import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "own")
    original, shared, own = (load_heads(tmp_path / n) for n in ("heads", "shared", "own"))
    assert shared.arch == original.arch and own.arch.own_lm_head
    if draft_vocab < V:
        assert torch.equal(shared.token_map, original.token_map)
    assert torch.equal(_imported_logits(tmp_path / "shared", h, weights), want)  # same weights, same code: bit for bit
    # the heads' own LM heads hold the target's rows, but a per-head matmul need not round like the shared one
    _close(_imported_logits(tmp_path / "own", h, weights), want)


def test_export_of_imported_own_heads_round_trips(tmp_path, h):
    tensors, config = write_vllm(tmp_path / "vllm")
    import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "heads")
    export_vllm(tmp_path / "heads", tmp_path / "again")  # no target needed: the LM heads are the heads' own
    assert json.loads((tmp_path / "again" / CHOICES).read_text()) == [[0], [0, 0], [0, 0, 0]]  # the chain
    again = json.loads((tmp_path / "again" / CONFIG).read_text())
    assert not again["original_lm_head"]
    _close(vllm_logits(load_file(str(tmp_path / "again" / VLLM_WEIGHTS)), again, h), vllm_logits(tensors, config, h))


def test_export_refusals(tmp_path):
    _draftwise_heads(tmp_path / "heads")
    with pytest.raises(InputError, match="--target"):
        export_vllm(tmp_path / "heads", tmp_path / "out")
    with pytest.raises(InputError, match="depth 4 for 3 heads"):
        export_vllm(tmp_path / "heads", tmp_path / "out", parse_template("chain:4"), target=_target())
    other = TokenWeights(np.zeros((V, D), np.float32), np.zeros((V, D), np.float32))
    backend = SimpleNamespace(info=SimpleNamespace(checkpoint="another", tokenizer_hash=TOKENIZER),
                              token_weights=lambda: other)
    with pytest.raises(ValueError, match="trained for toy-target, not another"):
        export_vllm(tmp_path / "heads", tmp_path / "out", target=backend)
    assert not (tmp_path / "out").exists()


# ---- the artifact before own_lm_head, and the proposer ---------------------------------------------

def test_an_artifact_written_before_own_lm_head_still_loads(tmp_path, h):
    """The manifest's arch has no own_lm_head key (as every artifact before this change)."""
    gen = torch.Generator().manual_seed(4)
    arch = HeadArch("medusa", K, D, L, V, 16)
    heads = MedusaHeads(arch)
    tensors = {name: _rand(*v.shape, gen=gen, dtype=torch.bfloat16) for name, v in heads.state_dict().items()}
    tensors[TOKEN_MAP] = torch.arange(16)
    directory = tmp_path / "old"
    directory.mkdir()
    save_file(tensors, str(directory / WEIGHTS), metadata={"family": "medusa"})
    old_arch = {"family": "medusa", "num_heads": K, "hidden_size": D, "layers": L, "vocab_size": V, "draft_vocab": 16}
    write_manifest(directory, KIND, {"family": "medusa", "arch": old_arch,
                                     "target": {"checkpoint": CHECKPOINT, "tokenizer_hash": TOKENIZER}})
    loaded = load_heads(directory)
    assert loaded.arch == arch and not loaded.arch.own_lm_head and loaded.arch.as_dict() == old_arch
    assert torch.equal(loaded.heads.blocks[0][0].linear.weight, tensors["blocks.0.0.linear.weight"].float())


class _Target:
    """The hidden-state capability a heads proposer reads, over fixed weights and one frontier state."""

    def __init__(self, weights: TokenWeights, frontier: np.ndarray) -> None:
        self.info = BackendInfo("toy", CHECKPOINT, TOKENIZER, V, 64, "float32", "cpu", frozenset())
        self._weights, self._frontier, self.cached_len = weights, frontier, 0

    def track_hidden(self) -> None:
        pass

    def frontier_hidden(self) -> np.ndarray:
        return self._frontier

    def token_weights(self) -> TokenWeights:
        return self._weights


def test_the_proposer_drafts_the_foreign_heads_top1_chain(tmp_path, h):
    tensors, config = write_vllm(tmp_path / "vllm")
    import_medusa(tmp_path / "vllm", CHECKPOINT, TOKENIZER, tmp_path / "heads")
    frontier = h[0].numpy()
    target = _Target(_target(), frontier)
    target.cached_len = 4
    proposer = HeadsProposer("medusa", target, load_heads(tmp_path / "heads"), HeadsConfig())
    result = proposer.propose([1, 2, 3, 4, 5], "m")
    want = vllm_logits(tensors, config, h[:1])[:, 0].argmax(-1).tolist()  # vLLM's MedusaProposer: argmax per head
    assert [n.token for n in result.nodes] == want
    assert [n.parent for n in result.nodes] == [-1, 0, 1]


# ---- the CLI -------------------------------------------------------------------------------------

def test_cli_import_and_export(tmp_path, monkeypatch, h):
    weights = _target()
    backend = _Target(weights, h[0].numpy())
    loaded = []
    monkeypatch.setattr("draftwise.measure.load.load_backend", lambda name, kind: loaded.append((name, kind)) or backend)
    tensors = write_fasterdecoding(tmp_path / "fd")
    runner = CliRunner()
    done = runner.invoke(heads_app, ["import", str(tmp_path / "fd"), "--out", str(tmp_path / "heads"),
                                     "--target", "smollm2-135m"])
    assert done.exit_code == 0, done.output
    shown = json.loads(done.output)
    assert shown["layout"] == "medusa" and shown["lm_head"] == "own" and shown["source_base_model"] == "toy/base"
    assert loaded == [("smollm2-135m", "transformers")]
    _close(_imported_logits(tmp_path / "heads", h, weights), fasterdecoding_logits(tensors, h, weights))
    info = runner.invoke(heads_app, ["info", str(tmp_path / "heads")])
    assert info.exit_code == 0 and json.loads(info.output)["imported"]["layout"] == "medusa"
    done = runner.invoke(heads_app, ["export", str(tmp_path / "heads"), "--out", str(tmp_path / "vllm"),
                                     "--tree", "[[0],[1],[0,0]]"])
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "vllm" / CHOICES).read_text()) == [[0], [1], [0, 0]]
    refused = runner.invoke(heads_app, ["export", str(tmp_path / "heads"), "--out", str(tmp_path / "v2"),
                                        "--tree", "auto"])
    assert refused.exit_code == 2 and "auto" in refused.output
    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / CONFIG).write_text("{}")
    (tmp_path / "pt" / "medusa_lm_head.pt").write_bytes(b"\x80\x04")
    refused = runner.invoke(heads_app, ["import", str(tmp_path / "pt"), "--out", str(tmp_path / "x"),
                                        "--target", "smollm2-135m"])
    assert refused.exit_code == 2 and "pickle" in refused.output


@pytest.mark.model
def test_imported_heads_decode_exactly_on_the_embedded_model(tmp_path):
    """`heads import --target smollm2-135m` on a vLLM checkpoint sized for the model; decoding
    with the imported heads publishes plain greedy decoding's tokens."""
    import draftwise
    from draftwise.measure.load import load_backend

    target = load_backend("smollm2-135m", "transformers")
    vocab, d = target.token_weights().lm_head.shape
    gen = torch.Generator().manual_seed(0)
    tensors = {"token_map": torch.randperm(vocab, generator=gen)[:512]}
    for k in range(2):
        tensors[f"blocks.{k}.layers.0.weight"] = _rand(d, d, gen=gen, dtype=torch.bfloat16) * 0.02
        tensors[f"lm_heads.{k}.weight"] = _rand(512, d, gen=gen, dtype=torch.bfloat16) * 0.1
    source = tmp_path / "vllm"
    source.mkdir()
    save_file(tensors, str(source / "model.safetensors"))
    (source / CONFIG).write_text(json.dumps({"model_type": "medusa", "hidden_size": d, "vocab_size": vocab,
                                             "num_heads": 2, "num_hidden_layers": 1, "truncated_vocab_size": 512}))
    done = CliRunner().invoke(heads_app, ["import", str(source), "--out", str(tmp_path / "heads"),
                                          "--target", "smollm2-135m"])
    assert done.exit_code == 0, done.output
    decoder = draftwise.open_decoder(loader=lambda model, backend, role: target, target="smollm2-135m",
                                     backend="transformers", proposer="medusa", heads=str(tmp_path / "heads"))
    drafted = decoder.sized(12).generate("def add(a, b):")
    plain = decoder.plain().sized(12).generate("def add(a, b):")
    assert drafted.tokens == plain.tokens and len(drafted.records) > 1
