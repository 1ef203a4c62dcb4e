"""What every CLI module shares: the error exit, dim progress lines, `--set KEY=VALUE` parsing and
the options several commands take."""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.text import Text

from draftwise.runtime.round import GenerationConfig
from draftwise.errors import InputError
from draftwise.parse import spec_from_options
from draftwise.proposers.registry import DRAFTERS
from draftwise.spec import CALIBRATION_WORKLOAD, DecoderSpec
from draftwise.verify.registry import VERIFIERS

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


@dataclass(frozen=True)
class DecoderOptions:
    """The options of every command that opens a decoder (generate, serve): the target, the
    proposer and its keys, the verifier, the gate and the backend's settings, declared once
    (`DECODER_OPTIONS`) and turned into a spec once (`spec`)."""

    target: str
    draft: Optional[str]
    backend: str
    proposer: str
    verifier: str
    allow_heuristic: bool
    settings: tuple[str, ...]
    draft_k: Optional[int]
    tree: Optional[str]
    relation: Optional[str]
    lookup_tokens: Optional[int]
    lookup_ngram: Optional[int]
    lookup_candidates: Optional[int]
    index: Optional[str]
    gate: Optional[str]
    threads: Optional[int]
    dtype: str
    calibration_workload: str
    strict: bool

    def spec(self, generation: GenerationConfig, batch: int | None = None) -> DecoderSpec:
        """The requested spec (not yet planned) with `generation` (its `exact` from --allow-heuristic);
        `batch`: requests decoded at once, which gate=auto is planned for."""
        named = {"proposer": self.proposer, "k": self.draft_k, "tree": self.tree, "relation": self.relation,
                 "lookup": self.lookup_tokens, "ngram": self.lookup_ngram, "candidates": self.lookup_candidates,
                 "index": self.index, "gate": self.gate,
                 "calibration": self.calibration_workload if self.proposer == "auto" else None,
                 "strict": "true" if self.strict else None, "batch": batch}
        base = DecoderSpec(target=self.target, backend=self.backend, draft=self.draft, verifier=self.verifier,
                           threads=self.threads, dtype=self.dtype,
                           generation=replace(generation, exact=not self.allow_heuristic))
        options = {k: str(v) for k, v in named.items() if v is not None}
        for key, value in split_settings(list(self.settings)).items():
            if key in options and key != "proposer":
                raise InputError(f"{key} is given twice (an option and --set {key}=...)")
            options[key] = value
        return spec_from_options(options, base)


# DecoderOptions' fields as typer options: (annotation, option), in the order --help lists them
DECODER_OPTIONS: dict[str, tuple[Any, Any]] = {
    "target": (str, typer.Option(DEFAULTS.target, help="Target model: alias, .gguf file, directory or hub id.")),
    "draft": (Optional[str], typer.Option(None, help="Draft model, for a proposer that drafts with one (draft-model).")),
    "backend": (str, typer.Option(DEFAULTS.backend, help="auto | transformers | llamacpp.")),
    "proposer": (str, typer.Option(DEFAULTS.proposer, help=f"{' | '.join(DRAFTERS.choices())} (auto: the best "
                                   "predicted on this machine, from plain traces of --calibration-workload), or several "
                                   "joined by + (prompt-lookup+hydra: one tree merged from every source); "
                                   "`draftwise proposers` lists each one's keys.")),
    "verifier": (str, typer.Option(DEFAULTS.verifier, help=f"auto | {' | '.join(VERIFIERS)}.")),
    "allow_heuristic": (bool, typer.Option(False, "--allow-heuristic", help="Permit a heuristic (inexact) verifier.")),
    "settings": (list[str], typer.Option([], "--set", help="Drafter or decoder key KEY=VALUE (repeatable), e.g. "
                                         "--set k=4 --set tree=wbd:2,2,1; `draftwise proposers` lists the keys.")),
    "draft_k": (Optional[int], typer.Option(None, help="Draft chain length (= --set k=N).")),
    "tree": (Optional[str], typer.Option(None, help="Draft tree (= --set tree=...): chain:4, wbd:2,2,1, "
                                         "cartesian:3,2,2, JSON paths, a `tree optimize` directory, or auto.")),
    "relation": (Optional[str], typer.Option(None, help="Draft tree children (= --set relation=...): iid | "
                                             "without_replacement | beam.")),
    "lookup_tokens": (Optional[int], typer.Option(None, help="Prompt lookup tokens per proposal (= --set lookup=N).")),
    "lookup_ngram": (Optional[int], typer.Option(None, help="Prompt lookup max n-gram size (= --set ngram=N).")),
    "lookup_candidates": (Optional[int], typer.Option(None, help=">1: a tree of that many continuations "
                                                      "(= --set candidates=N).")),
    "index": (Optional[str], typer.Option(None, help="REST datastore for --proposer rest (= --set index=DIR).")),
    "gate": (Optional[str], typer.Option(None, help="Cost gate: verify only as deep as the measured t(n) and recent "
                                         "acceptance pay for; auto (measured once, cached) or a verify_profile directory.")),
    "threads": (Optional[int], typer.Option(None, help="CPU threads (default: all cores).")),
    "dtype": (str, typer.Option(DEFAULTS.dtype, help=DTYPE_HELP)),
    "calibration_workload": (str, typer.Option(CALIBRATION_WORKLOAD, help="Prompts that calibrate --tree auto and "
                                               "--proposer auto on first use.")),
    "strict": (bool, typer.Option(False, "--strict", help="llama.cpp: kernels whose verify rows are bit-identical to "
                                  "plain decoding's (>= 2-row decodes; for a drafter that may branch also flash "
                                  "attention, unpacked weights), rounds capped at the rows the invariance probe "
                                  "measured exact (= --set strict=true; strict=chains|trees chooses the kernel set).")),
}
assert list(DECODER_OPTIONS) == [f.name for f in fields(DecoderOptions)]


def decoder_command(command: Callable[..., Any]) -> Callable[..., Any]:
    """A command that takes the decoder options: its own parameters, then `DECODER_OPTIONS`,
    which reach it as one `options: DecoderOptions` argument (so each command declares them
    nowhere itself, and --help lists them alike everywhere)."""
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "options"]
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=annotation)
             for name, (annotation, option) in DECODER_OPTIONS.items()]

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        chosen = {name: values.pop(name) for name in DECODER_OPTIONS}
        chosen["settings"] = tuple(chosen["settings"])
        return command(options=DecoderOptions(**chosen), **values)

    run.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
    run.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != "options"},
                           **{name: annotation for name, (annotation, _) in DECODER_OPTIONS.items()}}
    return run
