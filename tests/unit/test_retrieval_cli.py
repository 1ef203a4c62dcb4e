"""`draftwise index build/info/verify` end to end with the embedded model's real tokenizer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from draftwise.cli.index import index_app

pytestmark = pytest.mark.model  # loads the smollm2-135m tokenizer (cached after the first use)


@pytest.fixture(scope="module")
def tokenizer():
    from draftwise.backends.transformers import load_tokenizer
    from draftwise.models import resolve

    return load_tokenizer(resolve("smollm2-135m"))


def test_build_info_verify_and_proposer(tmp_path, tokenizer):
    from draftwise.backends.transformers import tokenizer_hash_of

    from draftwise.proposers.retrieval import RestProposer, TokenizerMismatch

    tokenizer_hash = tokenizer_hash_of(tokenizer)

    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "mod.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    out = tmp_path / "idx"
    runner = CliRunner()
    built = runner.invoke(index_app, ["build", "--corpus", str(tree), "--target", "smollm2-135m", "--out", str(out)])
    assert built.exit_code == 0, built.output
    shown = runner.invoke(index_app, ["info", str(out), "--json"])
    info = json.loads(shown.output)
    assert info["tokenizer"]["hash"] == tokenizer_hash and info["corpus"][0]["files"] == 1
    assert runner.invoke(index_app, ["info", str(out)]).exit_code == 0
    assert runner.invoke(index_app, ["verify", str(out)]).exit_code == 0

    proposer = RestProposer.open(out, tokenizer_hash)
    ids = tokenizer("def sub(a, b):", add_special_tokens=False)["input_ids"]
    result = proposer.propose(ids, "m")
    deepest = max(range(len(result.nodes)), key=lambda i: result.nodes[i].depth)
    assert tokenizer.decode(list(result.path(deepest))).startswith("\n    return a - b")
    with pytest.raises(TokenizerMismatch):
        RestProposer.open(out, "0" * 64)

    tokens = out / "tokens.u32"
    tokens.write_bytes(tokens.read_bytes()[:-4])
    failed = runner.invoke(index_app, ["verify", str(out)])
    assert failed.exit_code == 1 and "tokens.u32" in failed.output


def test_empty_corpus_fails_cleanly(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(
        index_app, ["build", "--corpus", str(tmp_path / "empty"), "--target", "smollm2-135m", "--out", str(tmp_path / "i")]
    )
    assert result.exit_code == 1 and "empty index" in result.output
