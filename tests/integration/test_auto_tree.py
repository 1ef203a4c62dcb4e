"""`--tree auto` on tiny models: the first use measures the verify profile, calibrates and
optimizes; the second reuses all three; another sampling policy gets its own artifacts; a
tampered cached artifact is measured again, never reused."""

from draftwise.optimize.auto import AutoTreeConfig, auto_tree
from draftwise.sampling import SamplingPolicy
from tests.integration.tiny_models import tiny_backend

CONFIG = AutoTreeConfig(width=2, max_nodes=6, max_depth=3, calibration_tokens=8, profile_prefix_len=16,
                        profile_repeats=1)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


def run(target, draft, policy, cache):
    messages: list[str] = []
    artifact = auto_tree(target, draft, policy, PROMPTS, cache, CONFIG, progress=messages.append)
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

    acceptance = first.directory.parent / "acceptance" / "acceptance.json"
    acceptance.write_text(acceptance.read_text().replace("[", "[ ", 1))  # same JSON, different bytes
    third, log = run(target, draft, greedy, tmp_path)
    assert "calibrating" in log and "measuring" not in log  # only the tampered artifact is redone
    assert third.acceptance_manifest_hash != "" and third.directory == first.directory
