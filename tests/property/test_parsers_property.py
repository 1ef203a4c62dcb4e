"""Every option parser, on any string: it parses, or it raises the project's InputError; never
anything else (no ValueError from int(), no TypeError, no RecursionError, no hang on a huge
tree).  Covered: `--set KEY=VALUE` splitting, `spec_from_options`, tree templates and tree
specs, bench method strings, workload strings."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftwise import spec_from_options
from draftwise.bench.methods import MethodDefaults, parse_method, parse_pairs
from draftwise.cli.common import split_settings
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError, ModelError
from draftwise.topology.templates import MAX_TEMPLATE_NODES, parse_template
from draftwise.topology.tree_spec import parse_tree
from draftwise.workloads import parse_workload

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# any text, lone surrogates (what non-UTF-8 argv bytes become) and control characters included
ANY_CHAR = st.characters(codec=None, exclude_categories=())
ANY_TEXT = st.text(ANY_CHAR, max_size=40)
PUNCT = st.sampled_from(list(":,=-[]{}./ \"'0123456789") + ["²", "①", "٣", "\udcff", "\x00", "auto", "none"])
NUMBER = st.one_of(st.integers(-3, 9), st.integers(-10**30, 10**30), st.just(10**9)).map(str)
WORDY = st.lists(st.one_of(PUNCT, NUMBER, st.text(ANY_CHAR, max_size=4)), max_size=8).map("".join)
TEXT = st.one_of(ANY_TEXT, WORDY)

JSON_PATHS = st.recursive(st.one_of(st.integers(-2, 5), st.booleans(), st.none(), st.floats(allow_nan=False)),
                          lambda children: st.lists(children, max_size=4), max_leaves=12).map(json.dumps)
TEMPLATE_KINDS = st.sampled_from(["chain", "cartesian", "wbd", "star", "", "CHAIN"])
TEMPLATE = st.one_of(
    TEXT,
    JSON_PATHS,
    st.builds(lambda kind, numbers, sep: f"{kind}:{sep.join(numbers)}", TEMPLATE_KINDS,
              st.lists(NUMBER, max_size=5), st.sampled_from([",", ", ", ",,", ";"])),
    st.integers(1, 60).map(lambda depth: "[" * depth * 40),
)


def _only_input_errors(call, *args):
    try:
        return call(*args)
    except InputError:
        return None


@SETTINGS
@given(st.lists(st.one_of(TEXT, st.builds(lambda k, v: f"{k}={v}", TEXT, TEXT)), max_size=5))
def test_split_settings(items):
    values = _only_input_errors(split_settings, items)
    if values is not None:
        assert all(key and key == key.strip() and "=" not in key for key in values)


@SETTINGS
@given(TEMPLATE)
def test_tree_templates(text):
    template = _only_input_errors(parse_template, text)
    if template is not None:
        assert 1 <= len(template) <= MAX_TEMPLATE_NODES
        assert all(path and all(isinstance(s, int) and s >= 0 for s in path) for path in template)


@SETTINGS
@given(TEMPLATE)
def test_tree_specs(text):
    _only_input_errors(parse_tree, text)


SPEC_KEYS = st.sampled_from(["proposer", "backend", "verifier", "target", "draft", "gate", "max_nodes", "max_depth",
                             "exact", "calibration", "dtype", "strict", "k", "confidence", "tree", "relation",
                             "lookup", "ngram", "candidates", "index", "rest_nodes", "heads", "tree_nodes", "skip",
                             "gamma", "adaptive", "adapter", "eta", "reuse", "bogus"])
PROPOSERS = st.sampled_from(["none", "auto", "prompt-lookup", "draft-model", "rest", "medusa", "hydra", "hydra++",
                             "clover", "layer-skip", "kangaroo", "bogus", ""])
SPEC_VALUES = st.one_of(TEXT, NUMBER, TEMPLATE, st.sampled_from(["true", "false", "auto", "none", "chains", "iid",
                                                                 "beam", "float32", "bfloat16"]))


@SETTINGS
@given(st.dictionaries(SPEC_KEYS, SPEC_VALUES, max_size=4), st.one_of(st.none(), PROPOSERS))
def test_spec_from_options(values, proposer):
    if proposer is not None:
        values = {**values, "proposer": proposer}
    _only_input_errors(spec_from_options, values)


DEFAULTS = MethodDefaults("smollm2-135m", None, GenerationConfig(max_new_tokens=8))
METHOD_KINDS = st.sampled_from(["dw", "hf-plain", "hf-assisted", "hf-prompt-lookup", "llamacpp-plain",
                                "llamacpp-prompt-lookup", "vllm", "", "x.json", "x.toml"])
PAIRS = st.lists(st.builds(lambda k, v: f"{k}={v}", st.one_of(SPEC_KEYS, st.sampled_from(["tokens", "feed"]), TEXT),
                           SPEC_VALUES), max_size=3).map(",".join)
METHOD = st.one_of(
    TEXT,
    st.builds(lambda name, kind, pairs: f"{name}{kind}:{pairs}", st.sampled_from(["", "NAME=", "a=", "=", "x,y="]),
              METHOD_KINDS, PAIRS),
)


@SETTINGS
@given(METHOD)
def test_bench_methods(text):
    _only_input_errors(parse_method, text, DEFAULTS)


@SETTINGS
@given(st.one_of(TEXT, PAIRS))
def test_bench_method_pairs(text):
    _only_input_errors(parse_pairs, text)


WORKLOAD = st.one_of(
    TEXT,
    st.builds(lambda kind, rest: f"{kind}:{rest}", st.sampled_from(["humaneval", "spec-bench", "specbench", "prompts",
                                                                     "gsm8k", ""]),
              st.one_of(TEXT, st.builds(lambda a, sep, b: f"{a}{sep}{b}", NUMBER, st.sampled_from(["-", "--", ":", ""]),
                                        NUMBER))),
    st.builds(lambda cats, limit: f"spec-bench:{cats}:{limit}", st.sampled_from(["all", "coding", "math,coding", "",
                                                                                 "nope", "²"]), NUMBER),
)


@SETTINGS
@given(WORKLOAD)
def test_workloads(text):
    workload = _only_input_errors(parse_workload, text)
    if workload is not None:
        assert workload.questions


@pytest.mark.parametrize("text", ["chain:1000000000", "cartesian:100000,100000,100000", "wbd:" + ",".join(["9"] * 40),
                                  "[" * 100_000, "[[[0]]]", "[[0],[0]]", "[[" + "0," * 5000 + "0]]"])
def test_templates_that_used_to_hang_or_crash(text):
    with pytest.raises(InputError):
        parse_template(text)


@pytest.mark.parametrize("text", ["humaneval:²", "humaneval:1-²", "spec-bench:all:²", "humaneval:" + "9" * 5000])
def test_workloads_that_used_to_crash(text):
    with pytest.raises(InputError):
        parse_workload(text)


@SETTINGS
@given(st.one_of(TEXT, st.builds(lambda stem, n: stem * n, st.sampled_from(["a", "x/", "~", "~u", "\udcff", "."]),
                                 st.integers(1, 400))))
def test_model_names(text):
    """A model name is an alias, a file, a directory, a hub id, or refused by name."""
    from draftwise.models import resolve

    _only_input_errors_or(ModelError, resolve, text, False)


def _only_input_errors_or(extra, call, *args):
    try:
        return call(*args)
    except (InputError, extra):
        return None
