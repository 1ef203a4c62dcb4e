"""`--proposer a+b`: parsed against the registry (a family's own name may hold '+'), keys routed
to the members that declare them, bad unions refused before loading with a specific error."""

import pytest

from draftwise.errors import InputError
from draftwise.parse import spec_from_options, union_members
from draftwise.plan import check
from draftwise.spec import DrafterSpec, UnionDrafter


def test_hydra_plus_plus_is_one_family_and_a_member():
    assert isinstance(spec_from_options({"proposer": "hydra++"}).drafter, DrafterSpec)
    assert union_members("prompt-lookup+hydra++") == ["prompt-lookup", "hydra++"]
    assert union_members("hydra+++prompt-lookup") == ["hydra++", "prompt-lookup"]


def test_keys_go_to_the_members_that_declare_them_and_the_shape_adds_up():
    spec = spec_from_options({"proposer": "prompt-lookup+draft-model", "lookup": "5", "k": "3", "draft": "x"})
    union = spec.drafter
    assert isinstance(union, UnionDrafter) and union.name == "prompt-lookup+draft-model"
    lookup, draft = union.members
    assert lookup.config.num_tokens == 5 and draft.config.k == 3
    assert union.shape.rows == 5 + 3 and union.shape.depth == 5 and union.shape.branches
    assert spec.uses_draft_model
    assert check(spec) == "greedy"  # greedy at temperature 0; membership when sampling


@pytest.mark.parametrize("name, match", [
    ("prompt-lookup+", "does not start with a registered family"),
    ("prompt-lookup+none", "does not start with a registered family"),
    ("prompt-lookup+auto", "does not start with a registered family"),
    ("prompt-lookup++hydra", "does not start with a registered family"),
    ("prompt-lookup+prompt-lookup", "two or more distinct families"),
    ("prompt-lookup+kangaroo", "target's own layers"),
    ("layer-skip+prompt-lookup", "target's own layers"),
])
def test_bad_unions_are_refused(name, match):
    with pytest.raises(InputError, match=match):
        spec_from_options({"proposer": name})


def test_a_key_no_member_declares_is_refused_with_their_keys():
    with pytest.raises(InputError, match="k configures none of prompt-lookup, hydra"):
        spec_from_options({"proposer": "prompt-lookup+hydra", "k": "3"})


def test_a_union_needing_a_draft_model_says_so_before_loading():
    with pytest.raises(InputError, match="needs draft=MODEL"):
        check(spec_from_options({"proposer": "prompt-lookup+draft-model"}))


def test_a_planned_tree_inside_a_union_is_checked_as_for_the_member_alone():
    check(spec_from_options({"proposer": "prompt-lookup+hydra", "tree": "auto"}))  # planned after loading
    with pytest.raises(InputError, match="pass --draft MODEL"):  # what the member alone would be told
        check(spec_from_options({"proposer": "prompt-lookup+draft-model", "tree": "auto"}))


@pytest.mark.parametrize("options, guarded", [
    ({"proposer": "prompt-lookup+hydra"}, True),  # a model source: its proposal is paid every round
    ({"proposer": "prompt-lookup+draft-model", "draft": "x"}, True),
    ({"proposer": "prompt-lookup+hydra", "guard": "false"}, False),  # the user's word wins
    ({"proposer": "prompt-lookup"}, False),  # a single source keeps the gate alone
    ({"proposer": "hydra"}, False),
    ({"proposer": "prompt-lookup", "guard": "true"}, True),
])
def test_a_union_with_a_model_source_runs_behind_the_guard_alone(options, guarded):
    from draftwise.spec import fitted_generation

    assert (fitted_generation(spec_from_options(options)).guard is not None) is guarded
