"""Greedy identity on the embedded model: SmolLM2-135M on the transformers backend, with Medusa
and Hydra heads (a chain through every head and one small tree), emits exactly what plain
decoding emits on Spec-Bench development prompts.  The heads are the ones the package ships for
this checkpoint when it ships them; otherwise random non-trivial sets built here (which are
rarely right, so there the test proves that proposing, verifying and committing head drafts
leaves the output untouched, and the shipped sets add that accepted drafts do too)."""

import pytest

from draftwise.build import build_decoder
from draftwise.runtime.round import GenerationConfig
from draftwise.heads.artifact import load_heads
from draftwise.heads.defaults import shipped_heads
from tests.helpers import make_spec
from tests.integration.conftest import GREEDY_NEW, REAL_PROMPTS
from tests.integration.tiny_heads import random_headset, save_headset

pytestmark = pytest.mark.model
CONFIG = GenerationConfig(max_new_tokens=GREEDY_NEW)
TREE = "wbd:2,1"  # two branches two deep (a random set has two heads: a round verifies 1 + 4 rows)
TREE_PROMPTS = 4  # the tree on the first prompts only: a round costs more rows, the law is the same


@pytest.fixture(scope="module")
def target(smol_target):
    return smol_target


@pytest.fixture(scope="module")
def prompts_and_plain(smol_chat_and_plain):
    assert len(smol_chat_and_plain) == REAL_PROMPTS
    return [p for p, _ in smol_chat_and_plain], [t for _, t in smol_chat_and_plain]


FAMILIES = ["medusa", "hydra", "hydra++", "clover"]


def shipped(family: str, checkpoint: str):
    return next((d for f, c, d in shipped_heads() if f == family and c == checkpoint), None)


@pytest.fixture(scope="module")
def heads_dirs(target, tmp_path_factory):
    """family -> (head-set directory, shipped?)."""
    out = {}
    for seed, family in enumerate(FAMILIES):
        directory = shipped(family, target.info.checkpoint)
        if directory is not None:
            out[family] = (directory, True)
            continue
        headset = random_headset(family, target, seed=seed, num_heads=2, draft_vocab=8192, gain=0.5, lowest_ids=True)
        out[family] = (save_headset(tmp_path_factory.mktemp(family) / "heads", headset), False)
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_heads_are_token_identical_to_plain_decoding(target, prompts_and_plain, heads_dirs, family, tree):
    directory, is_shipped = heads_dirs[family]
    assert load_heads(directory).arch.family == family
    options = {"proposer": family, "heads": directory, "verifier": "greedy", **({"tree": tree} if tree else {})}
    decoder = build_decoder(make_spec(CONFIG, **options), target)
    prompts, plain = prompts_and_plain
    cases = list(zip(prompts, plain))[: TREE_PROMPTS if tree else None]
    accepted = proposed = 0
    for prompt, reference in cases:
        result = decoder.generate(prompt)
        assert result.tokens == reference
        proposed += sum(r.nodes for r in result.records)
        accepted += sum(result.from_draft)
    assert proposed > 0
    if is_shipped:
        assert accepted > 0  # trained heads are right somewhere in the prompts x 24 tokens
