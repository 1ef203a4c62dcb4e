"""`--tree auto` on tiny models: the first use measures the verify profile, calibrates and
optimizes; the second reuses all three; another sampling policy gets its own artifacts; a
tampered cached artifact is measured again, never reused."""

import pytest

from draftwise.logs import progress_to
from draftwise.optimize.auto import AutoTreeConfig, auto_tree
from draftwise.runtime.sampling import SamplingPolicy
from tests.integration.tiny_models import tiny_backend

CONFIG = AutoTreeConfig(width=2, max_nodes=6, max_depth=3, calibration_tokens=8, profile_prefix_len=16,
                        profile_repeats=1)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


def run(target, draft, policy, cache, prompts=PROMPTS):
    messages: list[str] = []
    with progress_to(messages.append):
        artifact = auto_tree(target, draft, policy, prompts, cache, CONFIG)
    return artifact, " ".join(messages)


def test_auto_tree_measures_once_then_reuses_and_recomputes_stale_artifacts(tmp_path):
    target, draft = tiny_backend(0), tiny_backend(1)
    greedy = SamplingPolicy()
    first, log = run(target, draft, greedy, tmp_path)
    assert "measuring" in log and "calibrating" in log and "optimizing" in log
    assert 1 <= first.choice.n <= CONFIG.max_nodes and first.choice.d <= CONFIG.max_depth
    assert dict(first.policy) == greedy.as_dict()

    second, log = run(target, draft, greedy, tmp_path)
    assert log == ""  # every artifact reused
    assert second.manifest_hash == first.manifest_hash and second.directory == first.directory

    sampled, log = run(target, draft, SamplingPolicy(temperature=1.0), tmp_path)
    assert "calibrating" in log and sampled.directory != first.directory

    # other calibration prompts are another acceptance profile, hence another tree
    others, log = run(target, draft, greedy, tmp_path, prompts=[[7, 6, 5], [3, 2, 1, 0]])
    assert "calibrating" in log and others.directory != first.directory

    acceptance = first.directory.parent / "acceptance" / "acceptance.json"
    acceptance.write_text(acceptance.read_text().replace("[", "[ ", 1))  # same JSON, different bytes
    third, log = run(target, draft, greedy, tmp_path)
    assert "calibrating" in log and "measuring" not in log  # only the tampered artifact is redone
    assert third.acceptance_manifest_hash != "" and third.directory == first.directory


def test_auto_gate_profile_measures_every_row_count_once_then_reuses(tmp_path):
    from draftwise.optimize.auto import auto_gate_profile, gate_rows

    assert gate_rows(11) == tuple(range(1, 12))
    assert gate_rows(65) == (*range(1, 17), 24, 32, 48, 64, 65)
    target = tiny_backend(0)
    messages: list[str] = []
    with progress_to(messages.append):
        profile = auto_gate_profile(target, 11, tmp_path, CONFIG)
    assert profile.rows == tuple(range(1, 12)) and profile.model == target.info.checkpoint
    assert any("measuring" in m for m in messages)
    messages.clear()
    with progress_to(messages.append):
        again = auto_gate_profile(target, 11, tmp_path, CONFIG)
    assert messages == [] and again.absolute_s == profile.absolute_s
    (data,) = tmp_path.glob("gate/*/rows-11/verify_profile.json")
    data.write_text(data.read_text().replace("[", "[ ", 1))  # tampered: measured again, not trusted
    with progress_to(messages.append):
        auto_gate_profile(target, 11, tmp_path, CONFIG)
    assert any("measuring" in m for m in messages)
    chains = auto_gate_profile(target, 11, tmp_path, CONFIG, chain=True)  # another shape: its own artifact
    assert chains.provenance["shape"].startswith("chain") and len(list(tmp_path.glob("gate/*/rows-11"))) == 2


def test_a_gate_profile_is_used_only_for_the_target_it_measured(tmp_path):
    from draftwise.build import gate_config
    from tests.helpers import make_spec
    from draftwise.runtime.cost_profile import VerifyCostProfile

    target = tiny_backend(0)
    for name, model in (("mine", target.info.checkpoint), ("other", "some-other-model")):
        VerifyCostProfile.from_absolute([1, 2], [0.1, 0.3], model=model, backend="transformers", threads=2,
                                        machine="test").save(tmp_path / name)
    config = gate_config(make_spec(gate=str(tmp_path / "mine")), target)
    assert config.profile.relative == pytest.approx((1.0, 3.0))
    with pytest.raises(ValueError, match="some-other-model"):
        gate_config(make_spec(gate=str(tmp_path / "other")), target)


def test_a_transformers_target_keys_its_measured_artifacts_by_its_thread_count(tmp_path):
    import torch

    from draftwise.optimize.auto import auto_gate_profile

    target = tiny_backend(0)
    before = torch.get_num_threads()
    assert target.n_threads == before
    first = auto_gate_profile(target, 3, tmp_path, CONFIG)
    assert first.threads == before
    try:
        torch.set_num_threads(1 if before != 1 else 2)  # another thread count: another cost profile
        messages: list[str] = []
        with progress_to(messages.append):
            other = auto_gate_profile(target, 3, tmp_path, CONFIG)
    finally:
        torch.set_num_threads(before)
    assert any("measuring" in m for m in messages) and other.threads != first.threads
    assert len(list(tmp_path.glob("gate/*/rows-3"))) == 2


class RecordingBackend:
    """A real backend that notes the row count of every verify call (1 = the pending row alone)."""

    def __init__(self, backend) -> None:
        self._backend, self.verified, self.extended = backend, [], []

    def verify(self, pending, round_, unread=()):
        self.verified.append(1 if round_ is None else 1 + round_.n)
        return self._backend.verify(pending, round_, unread)

    def extend(self, tokens):
        self.extended.append(len(tokens))
        return self._backend.extend(tokens)

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_profile_spreads_its_repeats_over_shuffled_passes():
    """A slow spell of a shared machine must not land on every sample of one row count: after a
    warm-up pass, each timed pass verifies every n once, in its own order."""
    from draftwise.measure.profile import profile_verify_cost

    rows, repeats = (1, 2, 3, 4), 4
    recorder = RecordingBackend(tiny_backend(0))
    messages: list[str] = []
    with progress_to(messages.append):
        measured = profile_verify_cost(recorder, prefix_len=8, rows=rows, repeats=repeats)
    passes = [recorder.verified[i * len(rows):(i + 1) * len(rows)] for i in range(repeats + 1)]
    assert len(recorder.verified) == len(rows) * (repeats + 1)
    assert passes[0] == list(rows)  # the warm-up, untimed
    assert all(sorted(p) == list(rows) for p in passes[1:])
    assert len({tuple(p) for p in passes[1:]}) > 1  # shuffled afresh each pass
    assert measured["rows"] == list(rows) and len(measured["absolute_s"]) == len(rows)
    assert sum("pass" in m for m in messages) == repeats  # progress per pass


def test_a_profile_sampled_the_old_way_is_measured_again(tmp_path):
    """A cached profile whose repeats ran back to back (no `sampling` in its provenance) is
    remeasured with shuffled passes, not reused."""
    from draftwise.measure.profile import SAMPLING
    from draftwise.optimize.auto import ensure_profile
    from draftwise.runtime.cost_profile import VerifyCostProfile

    target = tiny_backend(0)
    old = VerifyCostProfile.from_absolute([1, 2, 3], [0.01, 0.02, 0.03], model=target.info.checkpoint,
                                          backend=target.info.name, threads=1, machine="x",
                                          provenance={"prefix_len": 8, "repeats": 1, "shape": "random tree"})
    old.save(tmp_path / "profile")
    messages: list[str] = []
    with progress_to(messages.append):
        fresh = ensure_profile(target, tmp_path / "profile", (1, 2, 3), 8, 1)
    assert any("measuring" in m for m in messages) and fresh.provenance["sampling"] == SAMPLING
    messages.clear()
    with progress_to(messages.append):
        assert ensure_profile(target, tmp_path / "profile", (1, 2, 3), 8, 1) == fresh
    assert messages == []


def test_an_extend_profile_times_catch_ups_not_verifies():
    """`extend=True` (a draft's catch-up): n tokens extended with the last row's logits, then
    truncated back, so every sample sits on the same prefix; no verify is timed."""
    from draftwise.measure.profile import EXTEND_SHAPE, profile_verify_cost, write_profile

    rows, repeats = (1, 2, 3), 2
    recorder = RecordingBackend(tiny_backend(0))
    measured = profile_verify_cost(recorder, prefix_len=8, rows=rows, repeats=repeats, extend=True)
    assert recorder.verified == []
    prefix_read, *catch_ups = recorder.extended
    assert prefix_read == 7 and sorted(catch_ups) == sorted(list(rows) * (repeats + 1))
    assert measured["rows"] == list(rows) and all(s > 0 for s in measured["absolute_s"])
    with pytest.raises(ValueError, match="not both"):
        profile_verify_cost(recorder, prefix_len=8, rows=rows, repeats=1, chain=True, extend=True)
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as directory:
        saved = write_profile(recorder, Path(directory) / "p", prefix_len=8, rows=rows, repeats=1, extend=True)
    assert saved.provenance["shape"] == EXTEND_SHAPE



@pytest.mark.parametrize("reliable,measured_again", [(True, False), (None, False), (False, True)],
                         ids=["quiet", "single-repeats", "busy"])
def test_a_profile_measured_while_the_machine_was_busy_is_never_reused(tmp_path, reliable, measured_again):
    """A cached profile whose repeats disagreed (`reliable: false`) is measured again; one whose
    repeats agreed, or of single repeats (that cannot tell), is reused."""
    from draftwise.measure.profile import SAMPLING
    from draftwise.runtime.cost_profile import VerifyCostProfile
    from draftwise.optimize.auto import ensure_profile

    target = tiny_backend(0)
    cached = VerifyCostProfile.from_absolute([1, 2, 3], [0.01, 0.02, 0.03], model=target.info.checkpoint,
                                             backend=target.info.name, threads=1, machine="x",
                                             provenance={"prefix_len": 8, "repeats": 3, "shape": "random tree",
                                                         "sampling": SAMPLING, "noise_cv": 0.05, "reliable": reliable})
    cached.save(tmp_path / "profile")
    messages: list[str] = []
    with progress_to(messages.append):
        got = ensure_profile(target, tmp_path / "profile", (1, 2, 3), 8, 2)
    assert any("measuring" in m for m in messages) is measured_again
    assert (got != cached) is measured_again
    if measured_again:  # a fresh profile records its own noise
        assert got.provenance["noise_cv"] is not None and isinstance(got.provenance["reliable"], bool)
