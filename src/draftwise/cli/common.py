"""What every CLI module shares: the error exit, dim progress lines, `--set KEY=VALUE` parsing and
the options several commands take."""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.text import Text

from draftwise.errors import InputError
from draftwise.spec import DecoderSpec

err = Console(stderr=True)
DEFAULTS = DecoderSpec()  # the options' defaults, read from the spec's own


def fail(message: str) -> None:
    """Print the error as one line and exit with status 2 (bad input).  The message is plain text:
    never wrapped at the terminal's width, never read as markup ('[[0],[2]]' or '[/x]' in it)."""
    err.print(Text.assemble(("error:", "bold red"), " ", " ".join(message.splitlines())), soft_wrap=True,
              highlight=False)
    raise typer.Exit(2)


def dim(message: str) -> None:
    """A progress line on stderr."""
    err.print(message, style="dim", markup=False, highlight=False)


def split_settings(settings: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` options as a dict (a value may hold commas and '=': tree=wbd:2,2,1); a
    malformed or repeated one is refused by name."""
    values: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        if key.strip() in values:
            raise InputError(f"--set {key.strip()} given twice")
        values[key.strip()] = value.strip()
    return values


def quiet_llama_cpp() -> None:
    """llama.cpp logs every load to stderr through llama-cpp-python's logger; the CLI shows errors only."""
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)


def int_list(text: str, flag: str) -> tuple[int, ...]:
    """A comma-separated list of integers given to `flag`, or a clear error."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        fail(f"{flag} {text!r} is not a comma-separated list of integers")
        raise  # unreachable: fail exits


DTYPE_HELP = ("The transformers backend's dtype: float32 | bfloat16 | auto (the faster here, measured once and cached; "
              "float32 without native bf16). bfloat16 is another target numerically: its output may differ from float32's, "
              "and (its many-row forwards rounding unlike one-row steps) greedy speculative output may part from plain "
              "bfloat16 decoding.")


def split_training_settings(settings: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """A training command's `--set` options: (the recipe's keys, the corpus recipe's keys)."""
    from draftwise.options import config_keys
    from draftwise.training.corpus import CorpusRecipe

    values = split_settings(settings)
    corpus_keys = set(config_keys(CorpusRecipe))
    return ({k: v for k, v in values.items() if k not in corpus_keys},
            {k: v for k, v in values.items() if k in corpus_keys})
