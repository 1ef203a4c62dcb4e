"""--method parsing: the compact syntax, config files, peers, errors, references."""

import json
from dataclasses import replace

import pytest

from draftwise.bench.methods import (
    MethodDefaults,
    MethodError,
    check_names,
    parse_method,
    parse_pairs,
    references,
)
from draftwise.runtime.round import GenerationConfig
from draftwise.spec import CALIBRATION_WORKLOAD, AutoGate, GateProfile
from draftwise.topology.templates import parse_template

DEFAULTS = MethodDefaults(target="smollm2-135m", draft="qwen2.5-coder-0.5b", generation=GenerationConfig(max_new_tokens=32))


def test_pairs_keep_commas_of_tree_templates():
    assert parse_pairs("proposer=draft-model,tree=wbd:2,2,1,k=8") == {"proposer": "draft-model", "tree": "wbd:2,2,1", "k": "8"}
    assert parse_pairs("tree=[[0],[1],[0,0]]") == {"tree": "[[0],[1],[0,0]]"}
    assert parse_pairs("") == {}
    with pytest.raises(MethodError, match="not KEY=VALUE"):
        parse_pairs("oops,k=1")
    with pytest.raises(MethodError, match="twice"):
        parse_pairs("k=1,k=2")


def test_dw_method_full_syntax():
    m = parse_method("tree=dw:proposer=draft-model,backend=transformers,verifier=auto,draft=qwen2.5-coder-0.5b,k=8,"
                     "tree=wbd:2,2,1", DEFAULTS)
    assert (m.name, m.kind, m.backend, m.draft) == ("tree", "dw", "transformers", "qwen2.5-coder-0.5b")
    d = m.decoder
    assert d.proposer == "draft-model" and d.family_config.tree.paths == parse_template("wbd:2,2,1")
    assert d.family_config.k == 8
    assert d.generation.max_new_tokens == 32  # shared settings reach the decoder
    assert not m.is_plain


def test_dw_defaults_and_lookup_keys():
    m = parse_method("dw", DEFAULTS)
    assert m.name == "dw" and m.decoder.proposer == "prompt-lookup" and m.target == "smollm2-135m" and m.draft is None
    pl = parse_method("pl=dw:lookup=5,ngram=3,candidates=2,backend=llamacpp", DEFAULTS)
    lookup = pl.decoder.family_config
    assert (lookup.num_tokens, lookup.max_ngram, lookup.max_candidates) == (5, 3, 2)
    plain = parse_method("p=dw:proposer=none,target=other-model", DEFAULTS)
    assert plain.is_plain and plain.target == "other-model"


def test_dw_errors():
    with pytest.raises(MethodError, match="unknown key"):
        parse_method("x=dw:proposr=none", DEFAULTS)
    with pytest.raises(MethodError, match="not an integer"):
        parse_method("x=dw:proposer=draft-model,k=many", DEFAULTS)
    with pytest.raises(MethodError, match="unknown proposer"):
        parse_method("x=dw:proposer=magic", DEFAULTS)
    with pytest.raises(MethodError, match="needs draft"):
        parse_method("x=dw:proposer=draft-model", MethodDefaults("smollm2-135m", None, GenerationConfig()))
    with pytest.raises(MethodError, match="typical|heuristic|exact"):
        parse_method("x=dw:verifier=typical,proposer=draft-model,tree=wbd:2,1", DEFAULTS)  # refused in exact mode
    with pytest.raises(MethodError, match="unknown backend"):
        parse_method("x=dw:backend=vllm", DEFAULTS)
    with pytest.raises(MethodError, match="unknown method"):
        parse_method("x=vllm", DEFAULTS)


def test_peers():
    assert parse_method("hf-plain", DEFAULTS).backend == "transformers"
    assert parse_method("hf-plain", DEFAULTS).is_plain
    a = parse_method("hf-assisted", DEFAULTS)
    assert a.draft == "qwen2.5-coder-0.5b"
    assert parse_method("pl=hf-prompt-lookup:tokens=4", DEFAULTS).lookup_tokens == 4
    assert parse_method("llamacpp-prompt-lookup", DEFAULTS).lookup_tokens == 10
    assert parse_method("llamacpp-plain", DEFAULTS).backend == "llamacpp"
    with pytest.raises(MethodError, match="needs a draft"):
        parse_method("hf-assisted", MethodDefaults("smollm2-135m", None, GenerationConfig()))
    with pytest.raises(MethodError, match="unknown key"):
        parse_method("hf-plain:tokens=3", DEFAULTS)


def test_llamacpp_plain_feed():
    users = parse_method("llamacpp-plain", DEFAULTS)
    assert users.feed == "generate" and not users.fed_like_draftwise and "feed" not in users.describe()
    like = parse_method("like=llamacpp-plain:feed=draftwise", DEFAULTS)
    assert like.fed_like_draftwise and like.is_plain and "feed=draftwise" in like.describe()
    assert parse_method("u=llamacpp-plain:feed=generate", DEFAULTS) == replace(users, name="u")
    with pytest.raises(MethodError, match="feed must be one of generate, draftwise"):
        parse_method("x=llamacpp-plain:feed=whole", DEFAULTS)
    with pytest.raises(MethodError, match="unknown key"):  # only the plain peer has a like-for-like counterpart
        parse_method("x=llamacpp-prompt-lookup:feed=draftwise", DEFAULTS)


def test_config_files(tmp_path):
    j = tmp_path / "m.json"
    j.write_text(json.dumps({"proposer": "draft-model", "k": 4, "backend": "transformers", "tree": [[0], [1], [0, 0]]}))
    m = parse_method(f"fromjson={j}", DEFAULTS)
    assert m.decoder.family_config.k == 4 and m.decoder.family_config.tree.paths == ((0,), (1,), (0, 0))
    t = tmp_path / "m.toml"
    t.write_text('method = "hf-prompt-lookup"\ntokens = 3\n')
    assert parse_method(f"fromtoml={t}", DEFAULTS).lookup_tokens == 3
    with pytest.raises(MethodError, match="not found"):
        parse_method(f"x={tmp_path}/none.json", DEFAULTS)


def test_references_per_family_prefer_draftwise_plain():
    methods = [parse_method(t, DEFAULTS) for t in (
        "hf-plain", "hf-prompt-lookup", "dwp=dw:proposer=none,backend=transformers",
        "dwl=dw:backend=transformers", "llamacpp-prompt-lookup", "cpp=dw:backend=llamacpp", "llamacpp-plain")]
    refs = references(methods)
    assert refs["hf-prompt-lookup"] == "dwp" and refs["hf-plain"] == "dwp" and refs["dwl"] == "dwp"
    assert refs["cpp"] == "llamacpp-plain" and refs["llamacpp-prompt-lookup"] == "llamacpp-plain"
    # without draftwise plain, the peer fed like draftwise is the reference, wherever it is listed
    peers = [parse_method(t, DEFAULTS) for t in ("llamacpp-plain", "like=llamacpp-plain:feed=draftwise",
                                                 "cpp=dw:backend=llamacpp")]
    assert references(peers) == {"llamacpp-plain": "like", "like": "like", "cpp": "like"}
    with_dw = peers + [parse_method("cpp-plain=dw:proposer=none,backend=llamacpp", DEFAULTS)]
    assert set(references(with_dw).values()) == {"cpp-plain"}
    lone = [parse_method("x=dw:backend=transformers", DEFAULTS)]
    assert references(lone) == {"x": None}


def test_names_must_be_unique_and_file_safe():
    with pytest.raises(MethodError, match="repeat"):
        check_names([parse_method("hf-plain", DEFAULTS), parse_method("hf-plain", DEFAULTS)])
    with pytest.raises(MethodError, match="names a file"):
        check_names([parse_method("dw:proposer=none", DEFAULTS)])


def test_a_key_of_another_proposer_is_refused_not_ignored():
    from draftwise.bench.methods import MethodError, parse_method

    with pytest.raises(MethodError, match="k configures draft-model, layer-skip, kangaroo, not prompt-lookup"):
        parse_method("pl=dw:proposer=prompt-lookup,k=3", DEFAULTS)


def test_gate_key(tmp_path):
    m = parse_method("g=dw:gate=auto", DEFAULTS)
    assert m.decoder.gate == AutoGate() and "gate=auto" in m.describe()
    # the llama-cpp-python lookup peer runs with logits_all=True (the pool's fix); its description says so
    assert "logits_all=True" in parse_method("llamacpp-prompt-lookup", DEFAULTS).describe()
    assert "logits_all" not in parse_method("llamacpp-plain", DEFAULTS).describe()
    assert parse_method("g=dw:gate=" + str(tmp_path), DEFAULTS).decoder.gate == GateProfile(tmp_path)
    assert parse_method("dw", DEFAULTS).decoder.gate is None
    with pytest.raises(MethodError, match="neither"):
        parse_method("g=dw:gate=" + str(tmp_path / "missing"), DEFAULTS)
    with pytest.raises(MethodError, match="proposer none"):
        parse_method("g=dw:proposer=none,gate=auto", DEFAULTS)


def test_auto_proposer_key():
    m = parse_method("a=dw:proposer=auto", DEFAULTS)
    assert m.decoder.proposer == "auto" and m.decoder.drafter.calibration == CALIBRATION_WORKLOAD
    assert m.draft == DEFAULTS.draft and not m.is_plain  # the draft is a candidate; auto is never the reference
    assert parse_method("a=dw:proposer=auto,calibration=humaneval:3-4", DEFAULTS).decoder.drafter.calibration == "humaneval:3-4"
    with pytest.raises(MethodError, match="calibration= configures proposer=auto"):
        parse_method("a=dw:proposer=none,calibration=humaneval:0-1", DEFAULTS)
    with pytest.raises(MethodError, match="drop --gate"):
        parse_method("a=dw:proposer=auto,gate=auto", DEFAULTS)
    with pytest.raises(MethodError, match="no proposer fits"):  # Sequoia needs sampled trees: no candidate drafts one
        parse_method("a=dw:proposer=auto,verifier=sequoia", DEFAULTS)
    # rejection sampling needs q: no lookup proposer has it, the self-drafters (the target's own layers) do
    assert parse_method("a=dw:proposer=auto,verifier=rejection", DEFAULTS).decoder.proposer == "auto"


def test_a_long_json_tree_is_a_template_not_a_path():
    """A 32-node Sequoia tree as JSON paths is longer than a file name may be: it must parse
    as a template without the filesystem being asked whether it is a tree directory."""
    paths = [[0]] + [[0] * d for d in range(2, 33)]
    tree = json.dumps(paths, separators=(",", ":"))
    assert len(tree) > 255
    m = parse_method(f"t=dw:proposer=draft-model,tree={tree},relation=iid", DEFAULTS)
    assert m.decoder.family_config.tree.paths == tuple(tuple(p) for p in paths)


def test_a_heuristic_method_is_labelled_and_never_ranked_as_exact():
    from draftwise.bench.report import _winner
    from draftwise.runtime.sampling import SamplingPolicy

    sampling = MethodDefaults(target="smollm2-135m", draft=None,
                              generation=GenerationConfig(policy=SamplingPolicy(temperature=0.8)))
    typical = parse_method("t=dw:proposer=prompt-lookup,candidates=4,verifier=typical,exact=false", sampling)
    assert typical.heuristic and "HEURISTIC" in typical.describe()
    assert not parse_method("p=dw:proposer=prompt-lookup", sampling).heuristic

    def method(speedup, heuristic, questions=2, errors=0):
        return {"overall": {"questions": questions, "errors": errors, "speedup": speedup, "tokens_per_s": speedup,
                            "mismatches": None}, "plain": False, "heuristic": heuristic}

    summary = {"workload": {"questions": 2}, "settings": {"temperature": 0.8},
               "methods": {"typical": method(3.0, True), "sequoia": method(1.2, False)}}
    assert "**sequoia**, 1.20x" in _winner(summary)


def test_the_winner_line_ranks_complete_methods_and_names_the_rest():
    from draftwise.bench.report import _winner

    def method(speedup, questions, errors=0):
        return {"overall": {"questions": questions, "errors": errors, "speedup": speedup, "tokens_per_s": speedup,
                            "mismatches": 0}, "plain": False, "heuristic": False}

    summary = {"workload": {"questions": 60}, "settings": {"temperature": 0.0},
               "methods": {"full": method(1.3, 60), "one-error": method(1.1, 59, errors=1), "early": method(2.5, 5)}}
    line = _winner(summary)
    assert "**full**, 1.30x" in line and "provisional" not in line  # 'early' is not compared with them
    assert "Not ranked (did not attempt all 60 questions): early." in line
    partial = {**summary, "methods": {"a": method(1.2, 26), "b": method(1.4, 27)}}
    assert "**b**, 1.40x (partial run, at most 27 of 60 questions per method: a provisional ranking)" in _winner(partial)


def test_tree_auto_is_a_bench_method_too():
    from draftwise.topology.tree_spec import AutoTree

    m = parse_method("t=dw:proposer=draft-model,tree=auto", DEFAULTS)
    assert m.decoder.family_config.tree == AutoTree() and m.draft == DEFAULTS.draft
    assert "tree=auto" in m.describe()
    with pytest.raises(MethodError, match="tree configures draft-model"):
        parse_method("t=dw:proposer=prompt-lookup,tree=auto", DEFAULTS)


def test_kangaroo_eta_auto_is_a_bench_method_too():
    from draftwise.proposers.kangaroo import AutoAdapter, AutoEta

    m = parse_method("k=dw:proposer=kangaroo,eta=auto,adapter=auto", DEFAULTS)
    assert m.decoder.family_config.eta == AutoEta() and m.decoder.family_config.adapter == AutoAdapter()
    assert "adapter=auto" in m.describe() and "eta=auto" in m.describe()
    assert parse_method("k=dw:proposer=kangaroo", DEFAULTS).decoder.family_config.eta == 0.6  # not the default
    with pytest.raises(MethodError, match=r"\[0, 1\), got 1.5"):
        parse_method("k=dw:proposer=kangaroo,eta=1.5", DEFAULTS)


def test_vllm_methods_are_parsed_with_their_own_strings_and_checked_against_vllm_plain():
    methods = [parse_method(t, DEFAULTS) for t in (
        "vllm-plain", "ng=vllm-ngram:k=4,ngram=3", "vllm-custom=prompt-lookup:k=4", "mine=vllm-custom=prompt-lookup",
        "dwp=dw:proposer=none,backend=transformers")]
    assert [(m.name, m.kind, m.vllm) for m in methods[:4]] == [
        ("vllm-plain", "vllm", "vllm-plain"), ("ng", "vllm", "vllm-ngram:k=4,ngram=3"),
        ("vllm-custom=prompt-lookup:k=4", "vllm", "vllm-custom=prompt-lookup:k=4"),
        ("mine", "vllm", "vllm-custom=prompt-lookup")]
    # vLLM's kernels are not draftwise's: its methods are checked against vLLM's own plain decoding
    refs = references(methods)
    assert refs["ng"] == refs["mine"] == "vllm-plain" and refs["dwp"] == "dwp"
    assert "vLLM" in methods[1].describe()


@pytest.mark.parametrize("text,words", [("vllm-ngram:k=0", "k must be >= 1"), ("vllm-bogus", "unknown vLLM method"),
                                        ("x=vllm-custom=rest", "not supported yet"),
                                        ("vllm-ngram:depth=3", "takes")])
def test_a_bad_vllm_method_is_refused_before_anything_loads(text, words):
    with pytest.raises(MethodError, match=words):
        parse_method(text, DEFAULTS)
