"""draftwise.vllm without vLLM: the checkpoint fix-up, method strings, and the custom_class
proposer's logic on hand-made inputs (the arrays vLLM passes)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from draftwise.errors import InputError
from draftwise.vllm.checkpoint import EMBED, LM_HEAD, fix_for_vllm, save_for_vllm
from draftwise.vllm.methods import PROPOSER_ENV, CustomDrafterConfig, parse_method, parse_schedule
from draftwise.vllm.proposer import DraftwiseProposer, propose_batch


def test_tied_embedding_is_materialised_and_architectures_set():
    head = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    tensors, config, fixes = fix_for_vllm({LM_HEAD: head}, {"model_type": "llama", "tie_word_embeddings": True,
                                                            "architectures": None})
    assert torch.equal(tensors[EMBED], head) and tensors[EMBED].data_ptr() != head.data_ptr()
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert fixes.materialised_embedding and fixes.architectures == ("LlamaForCausalLM",)


def test_complete_checkpoint_is_left_alone():
    embed, head = torch.zeros(4, 3), torch.ones(4, 3)
    tensors, config, fixes = fix_for_vllm({EMBED: embed, LM_HEAD: head},
                                          {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    assert tensors[EMBED] is embed and config["architectures"] == ["Qwen2ForCausalLM"]
    assert not fixes.materialised_embedding and fixes.architectures is None


def test_untied_checkpoint_without_embedding_is_refused():
    with pytest.raises(ValueError, match="not tied"):
        fix_for_vllm({LM_HEAD: torch.ones(2, 2)}, {"model_type": "llama", "tie_word_embeddings": False})


def test_resave_writes_an_artifact_vllm_can_read(tmp_path):
    from safetensors.torch import load_file, save_file

    source = tmp_path / "src"
    source.mkdir()
    save_file({LM_HEAD: torch.ones(4, 3), "model.norm.weight": torch.ones(3)}, str(source / "model.safetensors"))
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    (source / "tokenizer.json").write_text("{}")
    out = save_for_vllm(source, tmp_path / "out", {"model": "tiny"})
    weights = load_file(str(out / "model.safetensors"))
    assert set(weights) == {EMBED, LM_HEAD, "model.norm.weight"}
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "vllm_checkpoint" and manifest["provenance"]["fixes"]["materialised_embedding"]
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])


def test_method_strings():
    assert parse_method("vllm-plain").speculative_config is None
    ngram = parse_method("vllm-ngram:k=3,ngram=5,min=1").speculative_config
    assert ngram == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 1}
    custom = parse_method("vllm-custom=prompt-lookup:k=2,schedule=1-1:5/2-8:0")
    assert custom.speculative_config == {"method": "custom_class", "model": "draftwise.vllm.proposer.DraftwiseProposer",
                                         "num_speculative_tokens": 5}
    config = CustomDrafterConfig.from_json(custom.env[PROPOSER_ENV])
    assert (config.k_for(1), config.k_for(4), config.k_for(9)) == (5, 0, 0)  # past the last range: its K
    with pytest.raises(InputError, match="takes"):
        parse_method("vllm-ngram:draft=x")
    with pytest.raises(InputError, match="unknown vLLM method"):
        parse_method("vllm-eagle")


def test_schedule_parse():
    assert parse_schedule("1-2:4/3-8:1/9:0") == ((1, 2, 4), (3, 8, 1), (9, 9, 0))


def _batch(contexts, width=32):
    """token_ids_cpu [max sequences, max_model_len] and num_tokens_no_spec as vLLM's input batch holds them."""
    ids = np.zeros((len(contexts) + 2, width), dtype=np.int32)  # spare rows: vLLM's array is wider than the batch
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = c
    return ids, np.array([len(c) for c in contexts] + [0, 0], dtype=np.int32)


def test_proposer_copies_what_followed_the_suffix():
    contexts = [[5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 4]]  # request 0 repeats "5 6": draft 7 8 9; request 1: no match
    ids, lengths = _batch(contexts)
    drafts = propose_batch(CustomDrafterConfig(k=3), [[6], [4]], lengths, ids, max_k=4, max_model_len=32)
    assert drafts == [[7, 8, 9], []]


def test_proposer_skips_requests_without_a_sampled_token_and_caps_k():
    ids, lengths = _batch([[5, 6, 7, 8, 9, 5, 6], [5, 6, 7, 8, 9, 5, 6]])
    drafts = propose_batch(CustomDrafterConfig(k=8), [[], [6]], lengths, ids, max_k=2, max_model_len=32)
    assert drafts == [[], [7, 8]]  # request 0 is still in prefill; K capped by num_speculative_tokens


def test_schedule_k_follows_the_decoding_batch_and_context_room():
    ids, lengths = _batch([[5, 6, 7, 8, 9, 5, 6]] * 3)
    config = CustomDrafterConfig(k=3, schedule=((1, 1, 3), (2, 8, 0)))
    assert propose_batch(config, [[6], [6], [6]], lengths, ids, 4, 32) == [[], [], []]  # B = 3: K 0
    assert propose_batch(config, [[6], [], []], lengths, ids, 4, 32)[0] == [7, 8, 9]  # B = 1 decoding
    assert propose_batch(config, [[6], [], []], lengths, ids, 4, max_model_len=9)[0] == [7]  # 9 - 7 - 1 left


def test_proposer_reads_its_config_from_the_environment(monkeypatch):
    monkeypatch.setenv(PROPOSER_ENV, CustomDrafterConfig(k=1).to_json())
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                  model_config=SimpleNamespace(max_model_len=32))
    proposer = DraftwiseProposer(vllm_config)
    proposer.load_model(object())
    ids, lengths = _batch([[5, 6, 7, 8, 9, 5, 6]])
    assert proposer.propose([[6]], lengths, ids, slot_mappings=None) == [[7]]


def test_profiling_drafter_verifies_every_row_it_is_given():
    ids, lengths = _batch([[1, 2, 3], [4, 5, 6, 7]])
    config = CustomDrafterConfig(drafter="fixed", k=3)
    assert propose_batch(config, [[3], [7]], lengths, ids, max_k=3, max_model_len=32) == [[0, 0, 0], [0, 0, 0]]
    assert propose_batch(config, [[3], [7]], lengths, ids, max_k=3, max_model_len=6) == [[0, 0], [0]]


def test_profiling_methods_and_requests():
    from draftwise.vllm.methods import profiling_method
    from draftwise.vllm.protocol import ProfileRequest
    from draftwise.vllm.runner import VllmEnvironment

    assert profiling_method(1).speculative_config is None
    method = profiling_method(5)
    assert method.speculative_config["num_speculative_tokens"] == 4
    assert CustomDrafterConfig.from_json(method.env[PROPOSER_ENV]) == CustomDrafterConfig(drafter="fixed", k=4)
    request = ProfileRequest(model="m", dtype="bfloat16", batch_sizes=(1, 8), rows=(1, 3))
    assert ProfileRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    assert VllmEnvironment(threads_bind="0-3,6").compute_threads == 5
    missing = VllmEnvironment(venv=Path("/nonexistent/.venv-vllm")).missing()
    assert missing is not None and "setup_vllm.sh" in missing


def test_bench_executor_turns_and_batches_from_a_session():
    from draftwise.bench.vllm_executor import VllmExecutor
    from draftwise.vllm.session import SessionReply

    asked = []

    def generate(batch, prompts, max_tokens):
        asked.append((batch, len(prompts), max_tokens))
        return SessionReply(tuple((7, 8, 2)[: 2 + i % 2] for i in range(len(prompts))), 0.1)

    tokenizer = SimpleNamespace(chat_prompt=lambda messages: [1, 2], detokenize=lambda ids: "".join(map(str, ids)),
                                info=SimpleNamespace(eos_token_ids=frozenset({2})))
    executor = VllmExecutor("method", generate, tokenizer, max_new_tokens=16)
    turn = executor.run([1, 2, 3])
    assert turn.tokens == (7, 8) and turn.text == "78" and turn.accept_lengths is None and asked[-1] == (1, 1, 16)
    cell = executor.run_batch([("a", [1]), ("b", [2]), ("c", [3])], batch=2, max_new_tokens=4)
    assert asked[-1] == (2, 3, 4)
    assert [r.question_id for r in cell.requests] == ["a", "b", "c"] and cell.requests[1].tokens == (7, 8, 2)
    assert all(r.chunk_tokens == (len(r.tokens),) for r in cell.requests)
