"""The shared `--set` parsing of the training commands (heads train, adapter train)."""

import pytest

from draftwise.cli.common import split_settings, split_training_settings
from draftwise.errors import InputError


def test_training_settings_split_into_recipe_and_corpus_keys():
    own, corpus = split_training_settings(["epochs=2", "prompts=64", "lr=1e-3", "mode=sharegpt"])
    assert own == {"epochs": "2", "lr": "1e-3"} and corpus == {"prompts": "64", "mode": "sharegpt"}


def test_a_setting_without_a_key_is_refused_by_name():
    with pytest.raises(InputError, match="'=3'"):
        split_settings(["epochs=2", "=3"])
    with pytest.raises(InputError, match="'lr'"):
        split_training_settings(["lr"])
