"""The transformers backend's dtype: it reaches the model and the round manifest, an unknown one
is refused before loading, `auto` measures only where the CPU computes bf16 natively and caches
its choice, and greedy speculative decoding still equals plain decoding in bfloat16."""

from __future__ import annotations

import pytest
import torch

from draftwise.api import open_decoder
from draftwise.measure import dtype as dtype_module
from draftwise.measure.dtype import DtypeTiming, choose_dtype
from draftwise.measure.load import load_backend
from draftwise.preflight import preflight
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError
from draftwise.spec import DecoderSpec
from draftwise.parse import spec_from_options

WORDS = [f"w{i}" for i in range(28)]
PROMPT = "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2 w3 w4 w5 w6 w7 w1 w2 w3"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama with a word-level tokenizer, saved as a local transformers directory
    (the path a GGUF conversion also loads through)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", "<pad>", *WORDS])}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtype_reaches_the_model_and_the_manifest(tiny_dir, dtype):
    backend = load_backend(tiny_dir, "transformers", threads=1, dtype=dtype)
    assert backend.model.dtype == getattr(torch, dtype)
    assert backend.info.dtype == dtype
    assert backend.info.kv_row_bytes == 2 * 2 * 2 * 8 * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    spec = DecoderSpec(target=tiny_dir, backend="transformers", dtype=dtype, generation=GenerationConfig(max_new_tokens=4))
    decoder = open_decoder(spec, loader=lambda model, kind, role: backend, proposer="none")
    assert decoder.engine.manifest.dtype == dtype
    assert f'"dtype":"{dtype}"' in decoder.engine.manifest.to_json()


def test_unknown_dtype_is_refused_before_loading():
    with pytest.raises(InputError, match="unknown dtype 'float16'; choose one of float32 | bfloat16 | auto"):
        spec_from_options({"dtype": "float16"})
    with pytest.raises(InputError, match="unknown dtype 'half'"):
        DecoderSpec(dtype="half")
    with pytest.raises(InputError, match="unknown dtype 'fp32'"):
        load_backend("no/such/model", "transformers", dtype="fp32")  # refused before the model is looked up
    assert spec_from_options({"dtype": "bfloat16"}).dtype == "bfloat16"


def test_llamacpp_refuses_a_transformers_dtype():
    with pytest.raises(InputError, match="configures the transformers backend"):
        preflight(spec_from_options({"backend": "llamacpp", "dtype": "bfloat16", "proposer": "none"}))


def test_cli_refuses_an_unknown_dtype():
    from typer.testing import CliRunner

    from draftwise.cli import app

    result = CliRunner().invoke(app, ["generate", "hi", "--dtype", "float16"])
    assert result.exit_code == 2
    assert "unknown dtype 'float16'" in result.output


@pytest.mark.parametrize("proposer", [{"proposer": "prompt-lookup"},
                                      {"proposer": "prompt-lookup", "candidates": "3"}])  # a chain, then a tree
def test_greedy_speculative_equals_plain_in_bfloat16(tiny_dir, proposer):
    """On a tiny model the logit gaps dwarf bf16 rounding, so the verify path (chains, 4D tree
    masks in the model's dtype) must reproduce plain decoding token for token.  At scale bf16
    is not batch-invariant and it may not (benchmarks/transformers_dtype/README.md)."""
    backend = load_backend(tiny_dir, "transformers", threads=1, dtype="bfloat16")
    spec = DecoderSpec(target=tiny_dir, backend="transformers", dtype="bfloat16",
                       generation=GenerationConfig(max_new_tokens=48))
    decoder = open_decoder(spec, loader=lambda model, kind, role: backend, **proposer)
    speculative = decoder.generate(PROMPT)
    plain = decoder.plain().generate(PROMPT)
    assert speculative.tokens == plain.tokens
    assert sum(speculative.from_draft) > 0  # the proposer's tokens were verified in bf16, not just skipped


def test_auto_without_native_bf16_is_float32_unmeasured(tiny_dir, tmp_path):
    loads = []

    def load(dtype):
        loads.append(dtype)
        return load_backend(tiny_dir, "transformers", threads=1, dtype=dtype)

    backend, decision = choose_dtype(load, "tiny", 1, "cpu", tmp_path, cpu_flags=())
    assert loads == ["float32"] and backend.info.dtype == "float32"
    assert decision.medians_s == {} and "no native bf16" in decision.reason
    assert not (tmp_path / "dtype").exists()  # nothing measured, nothing cached


def test_auto_measures_once_and_reuses_its_choice(tiny_dir, tmp_path):
    loads = []

    def load(dtype):
        loads.append(dtype)
        return load_backend(tiny_dir, "transformers", threads=1, dtype=dtype)

    timing = DtypeTiming(prefix_len=8, steps=2, passes=2)
    backend, decision = choose_dtype(load, "tiny", 1, "cpu", tmp_path, cpu_flags=("avx512_bf16",), timing=timing)
    assert sorted(loads) == ["bfloat16", "float32"]
    assert set(decision.medians_s) == {"float32", "bfloat16"}
    assert backend.info.dtype == decision.chosen and decision.directory is not None
    loads.clear()
    again, cached = choose_dtype(load, "tiny", 1, "cpu", tmp_path, cpu_flags=("avx512_bf16",), timing=timing)
    assert loads == [decision.chosen] and cached.chosen == decision.chosen and cached.medians_s == decision.medians_s
    assert again.info.dtype == decision.chosen


def test_auto_picks_bfloat16_only_beyond_the_margin():
    assert dtype_module.decide({"float32": 1.0, "bfloat16": 0.5})[0] == "bfloat16"
    assert dtype_module.decide({"float32": 1.0, "bfloat16": 0.97})[0] == "float32"  # within noise: the faithful one
    assert dtype_module.decide({"float32": 1.0, "bfloat16": 1.4})[0] == "float32"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    assert dtype_module.cpu_bf16_flags(info) == ("avx512_bf16",)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2\n")
    assert dtype_module.cpu_bf16_flags(info) == ()
    assert dtype_module.cpu_bf16_flags(tmp_path / "missing") == ()


@pytest.mark.parametrize("flags", [(), ("avx512_bf16",)])
def test_auto_through_open_decoder_is_recorded(tiny_dir, tmp_path, monkeypatch, flags):
    """`dtype=auto` end to end: the loader settles it, the resolved spec and the manifest carry
    the dtype loaded, and the choice is recorded with its evidence."""
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    monkeypatch.setattr(dtype_module, "cpu_bf16_flags", lambda *args: flags)
    spec = DecoderSpec(target=tiny_dir, backend="transformers", dtype="auto", threads=1,
                       generation=GenerationConfig(max_new_tokens=4))
    decoder = open_decoder(spec, proposer="none")
    loaded = decoder.target.info.dtype
    assert decoder.requested.dtype == "auto" and decoder.spec.dtype == loaded == decoder.engine.manifest.dtype
    (choice,) = [c for c in decoder.choices if c.what == "dtype"]
    assert choice.chosen == loaded
    if flags:
        assert "one-row step medians" in choice.detail and any((tmp_path / "auto" / "dtype").iterdir())
    else:
        assert loaded == "float32" and "no native bf16" in choice.detail
