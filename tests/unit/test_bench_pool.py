"""ModelPool: one load per (model, backend, role); a draft never shares its target's backend
object (one KV cache each); a failed load is remembered with its reason."""

import pytest

import draftwise.bench.pool as pool_module
from draftwise.bench.pool import ModelPool, ModelUnavailable


def test_roles_are_separate_and_loads_are_cached(monkeypatch):
    loads = []
    monkeypatch.setattr(pool_module, "load_backend", lambda model, kind, threads, dtype="float32", strict=False: loads.append(model) or object())
    pool = ModelPool(threads=1, seed=0)
    target = pool.backend("m", "transformers")
    assert pool.backend("m", "transformers") is target
    draft = pool.backend("m", "transformers", role="draft")
    assert draft is not target and pool.backend("m", "transformers", role="draft") is draft
    assert loads == ["m", "m"]


def test_failed_load_is_remembered(monkeypatch):
    calls = []

    def fail(model, kind, threads, dtype="float32", strict=False):
        calls.append(model)
        raise OSError("no such file")

    monkeypatch.setattr(pool_module, "load_backend", fail)
    pool = ModelPool(threads=1, seed=0)
    for _ in range(2):
        with pytest.raises(ModelUnavailable, match="no such file"):
            pool.backend("missing", "llamacpp")
    assert calls == ["missing"]


def test_the_like_for_like_llama_is_its_own_object_with_draftwise_context_settings(tmp_path, monkeypatch):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    opened = []
    monkeypatch.setattr(llama_cpp, "Llama", lambda **kwargs: opened.append(kwargs) or object())
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    pool = ModelPool(threads=2, seed=0)
    users = pool.llama(str(model), None)
    like = pool.llama(str(model), None, draftwise_context=True)
    assert like is not users and pool.llama(str(model), None, draftwise_context=True) is like and len(opened) == 2
    defaults = llama_cpp.llama_context_default_params()  # what draftwise's backend leaves them at
    assert "yarn_attn_factor" not in opened[0]  # the peer as users run it keeps Llama's own defaults
    for key in ("yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "no_perf"):
        assert opened[1][key] == getattr(defaults, key)
    assert opened[1]["yarn_attn_factor"] < 0  # "the model's own", not Llama's 1.0
    assert opened[0]["n_threads"] == opened[1]["n_threads_batch"] == 2
