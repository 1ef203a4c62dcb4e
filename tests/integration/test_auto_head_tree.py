"""tree=auto for a head family under node budgets: one calibration serves every budget, each
budget keeps its own tree within it, and a tampered tree is optimized again."""

import pytest

from draftwise.errors import InputError
from draftwise.logs import progress_to
from draftwise.optimize.auto import AutoTreeConfig, auto_head_tree
from tests.helpers import make_spec
from tests.integration.tiny_heads import random_headset, save_headset
from tests.integration.tiny_models import tiny_backend

CONFIG = AutoTreeConfig(width=2, calibration_tokens=6, profile_prefix_len=16, profile_repeats=1)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


def run(spec, target, cache):
    messages: list[str] = []
    with progress_to(messages.append):
        artifact = auto_head_tree(spec, target, PROMPTS, cache, CONFIG)
    return artifact, " ".join(messages)


def test_node_budgets_share_one_calibration_and_keep_their_own_trees(tmp_path):
    target = tiny_backend(0)
    heads = save_headset(tmp_path / "heads", random_headset("hydra", target, seed=1, num_heads=3))

    def spec(nodes):
        return make_spec(proposer="hydra", heads=heads, tree="auto", tree_nodes=nodes)

    small, log = run(spec(3), target, tmp_path / "cache")
    assert "calibrating" in log and "optimizing" in log
    assert small.choice.n <= 3 and small.directory.name == "tree-n3"
    large, log = run(spec(8), target, tmp_path / "cache")
    assert "calibrating" not in log and "measuring" not in log and "optimizing" in log  # only the DP again
    assert large.choice.n <= 8 and large.directory == small.directory.parent / "tree-n8"
    assert large.acceptance_manifest_hash == small.acceptance_manifest_hash
    again, log = run(spec(3), target, tmp_path / "cache")
    assert log == "" and again.manifest_hash == small.manifest_hash
    paths = small.directory / "tree.json"
    paths.write_text(paths.read_text().replace("{", "{ ", 1))  # tampered: optimized again, not trusted
    _, log = run(spec(3), target, tmp_path / "cache")
    assert "optimizing" in log and "calibrating" not in log


@pytest.mark.parametrize("options, match", [
    ({"tree_nodes": "8"}, "tree_nodes bounds tree=auto"),
    ({"tree": "auto", "tree_nodes": "1"}, "at least 2"),
    ({"tree": "wbd:2,2", "tree_nodes": "4"}, "more than tree_nodes=4"),
])
def test_a_node_budget_without_an_auto_tree_or_too_small_is_refused(options, match):
    with pytest.raises(InputError, match=match):
        make_spec(proposer="medusa", **options)
