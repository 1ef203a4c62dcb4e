"""`strict=` chooses llama.cpp's bit-exact kernel set from the drafter's shape, before loading."""

import pytest

from draftwise.bench.methods import MethodDefaults, parse_method
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError
from draftwise.spec import Strict
from draftwise.parse import spec_from_options


def scope(**options: str):
    return spec_from_options({"backend": "llamacpp", **options}).strict_scope


def test_auto_takes_chain_kernels_unless_the_drafter_may_branch():
    assert scope(strict="true", proposer="none") == "chains"
    assert scope(strict="true", proposer="prompt-lookup") == "chains"
    assert scope(strict="true", proposer="prompt-lookup", candidates="4") == "trees"
    assert scope(strict="true", proposer="auto") == "trees"  # any candidate may branch
    assert scope(strict="false", proposer="prompt-lookup") is None
    assert scope(strict="trees", proposer="none") == "trees"  # the reference of tree methods


def test_chains_refuses_a_branching_drafter_and_bad_words_are_named():
    with pytest.raises(InputError, match="may propose a tree"):
        spec_from_options({"backend": "llamacpp", "strict": "chains", "proposer": "prompt-lookup", "candidates": "4"})
    with pytest.raises(InputError, match="chains or trees"):
        Strict.parse("maybe")
    assert Strict.parse("YES") is Strict.AUTO and Strict.parse("0") is Strict.OFF


def test_bench_families_separate_kernel_sets():
    defaults = MethodDefaults(target="smollm2-135m", draft=None, generation=GenerationConfig())
    family = {name: parse_method(f"{name}=dw:backend=llamacpp,{cfg}", defaults).family for name, cfg in {
        "plain": "proposer=none", "sp": "proposer=none,strict=true", "st": "proposer=none,strict=trees",
        "sl": "proposer=prompt-lookup,strict=true", "slt": "proposer=prompt-lookup,candidates=4,strict=true"}.items()}
    assert family["sp"] == family["sl"] != family["plain"]
    assert family["st"] == family["slt"] != family["sp"]
