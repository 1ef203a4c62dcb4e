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
