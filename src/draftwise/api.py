"""The public way in: open a decoder from a spec, generate, stream, read the statistics.

`open_decoder` is the one sequence every caller uses (the CLI, the bench, calibration):
check the spec before loading anything, load the backends, resolve every `auto` into a
recorded choice, build.  A `Decoder` holds the loaded backends, so the plain reference and
other generation lengths reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from draftwise.backends.base import Backend
from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice
from draftwise.build import build_decoder, load_backend
from draftwise.engine import GenerationResult, SpeculativeDecoder
from draftwise.resolve import Choice, check, resolve
from draftwise.spec import CALIBRATION_WORKLOAD, DecoderSpec, spec_from_options
from draftwise.text_stream import TextPieces

if TYPE_CHECKING:
    from draftwise.backends.invariance import StrictScope

# (model name, backend name, role "target" or "draft") -> a loaded backend
Loader = Callable[[str, str, str], Backend]
Prompt = str | Sequence[int]


@dataclass(frozen=True)
class Decoder:
    """A built decoder on loaded backends.  `spec` is concrete (every auto chosen);
    `requested` is what was asked for, and `choices` says what each auto became."""

    spec: DecoderSpec
    requested: DecoderSpec
    target: Backend
    draft: Backend | None
    engine: SpeculativeDecoder
    choices: tuple[Choice, ...] = ()

    @property
    def verifier(self) -> str:
        return self.engine.verifier.capabilities.name

    def prompt_ids(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids of `prompt` (text, through the chat template when `chat`; or ids as given)."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if chat:
            return self.target.chat_prompt([{"role": "user", "content": prompt}])
        return self.target.tokenize(prompt)

    def generate(self, prompt: Prompt, chat: bool = False,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        return self.engine.generate(self.prompt_ids(prompt, chat), on_tokens=on_tokens)

    def stream(self, prompt: Prompt, chat: bool = False) -> Iterator[str]:
        """The generated text, piece by piece as rounds commit it."""
        pieces = TextPieces(self.target.detokenize, self.target.info.eos_token_ids)
        rounds = self.engine.rounds(self.prompt_ids(prompt, chat))
        try:
            for tokens in rounds:
                piece = pieces.feed(tokens)
                if piece:
                    yield piece
        finally:
            rounds.close()  # an abandoned stream still leaves the target consistent
        tail = pieces.finish()
        if tail:
            yield tail

    def with_spec(self, spec: DecoderSpec) -> "Decoder":
        """Another concrete configuration on the same backends (a plain reference, another length)."""
        return replace(self, spec=spec, requested=spec, engine=build_decoder(spec, self.target, self.draft), choices=())

    def plain(self) -> "Decoder":
        return self.with_spec(self.spec.plain())

    def sized(self, max_new_tokens: int) -> "Decoder":
        generation = replace(self.spec.generation, max_new_tokens=max_new_tokens)
        return replace(self, engine=build_decoder(replace(self.spec, generation=generation), self.target, self.draft))


def default_loader(threads: int | None = None, device: str = "cpu", dtype: DtypeChoice = DEFAULT_DTYPE,
                   strict: StrictScope | None = None) -> Loader:
    def load(model: str, backend: str, role: str) -> Backend:
        # strict is the target's: a draft's rows only choose candidates, never what is published
        return load_backend(model, backend, threads, device=device, dtype=dtype,
                            strict=strict if role == "target" else None)
    return load


def open_decoder(spec: DecoderSpec | None = None, *, loader: Loader | None = None,
                 calibration: str = CALIBRATION_WORKLOAD, **options: Any) -> Decoder:
    """Check, load, resolve and build (progress goes to the `draftwise` logger at INFO).  `options` are spec keys (as `--set` and bench method
    strings take them: proposer="draft-model", draft="qwen2.5-coder-0.5b", k=4, gate="auto", ...)
    applied on top of `spec` (default: `DecoderSpec()`)."""
    spec = spec_from_options(_as_strings(options), spec or DecoderSpec())
    check(spec)
    load = loader or default_loader(spec.threads, spec.device, spec.dtype, spec.strict_scope)
    target = load(spec.target, spec.backend, "target")
    draft = load(spec.draft, spec.backend, "draft") if spec.draft and spec.uses_draft_model else None
    resolved, choices = resolve(spec, target, draft, calibration=calibration)
    engine = build_decoder(resolved, target, draft)
    return Decoder(resolved, spec, target, draft, engine, choices)



def _as_strings(options: Mapping[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in options.items()}
