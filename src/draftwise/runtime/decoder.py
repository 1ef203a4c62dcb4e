"""A request decoded alone: a one-slot engine running the decoder's own rounds.

`SpeculativeDecoder` is a request's decoder (`runtime.round.RequestRounds`) that can also decode
by itself: `generate` and `rounds` submit the prompt to an engine whose one slot is the
decoder's own target, so a lone request runs exactly the code every request of a batch runs.
The engine (and with it the do-no-harm guard's estimates) lives as long as the decoder: the
next request starts where the last one left off.
"""

from __future__ import annotations

from typing import Callable, Generator, Sequence

from draftwise.backends.base import Backend, BackendInfo
from draftwise.backends.batch import VerifyCall
from draftwise.runtime.guard import DoNoHarm
from draftwise.runtime.cost_profile import BatchCostProfile
from draftwise.errors import BackendError
from draftwise.runtime.logits import TargetLogits
from draftwise.proposers.base import Proposer
from draftwise.runtime.engine import Engine, Failed, Finished, Tokens
from draftwise.runtime.round import GenerationConfig, GenerationResult, RequestRounds
from draftwise.runtime.strategy import RoundStrategy
from draftwise.verify.base import Verifier


class SpeculativeDecoder(RequestRounds):
    """A request's decoder that decodes alone on its target (see the module docstring)."""

    def __init__(self, target: Backend, proposers: Sequence[Proposer], verifier: Verifier,
                 config: GenerationConfig = GenerationConfig()) -> None:
        super().__init__(target, proposers, verifier, config)
        gate, guard = config.gate, config.guard
        # a lone request's t(n) prices its shadows: the batch-1 profile where one was measured
        profile = None if gate is None else gate.batch_profile or BatchCostProfile({1: gate.profile})
        strategy = RoundStrategy(DoNoHarm(guard) if guard is not None and self.proposers else None, profile,
                                 target.info.prompt_shares_round)
        self.engine = Engine(OneSlot(target), default=config, strategy=strategy)

    def generate(self, prompt: Sequence[int], on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        rounds = self.rounds(prompt)
        while True:
            try:
                emitted = next(rounds)
            except StopIteration as done:
                result: GenerationResult = done.value
                return result
            if on_tokens is not None:
                on_tokens(emitted)

    def rounds(self, prompt: Sequence[int]) -> Generator[list[int], None, GenerationResult]:
        """Decode round by round: yields each round's published tokens (never empty) and returns
        the `GenerationResult`.  Closing the generator early leaves the target consistent."""
        engine = self.engine
        request = engine.submit(prompt, self.config, decoder=self)
        try:
            while True:
                for event in engine.step():
                    if isinstance(event, Tokens):
                        yield list(event.tokens)
                    elif isinstance(event, Finished):
                        return event.result
                    elif isinstance(event, Failed):
                        raise event.error
        finally:
            if request in engine.active or request in engine.queued:
                engine.cancel(request)  # its round's `finally` rolls the target back
                engine.step()
            engine.forwards.clear()


class OneSlot:
    """One `Backend` as an engine's backend of one slot: a verify of that slot is the backend's own
    (the decoder commits, rolls back and resets its target itself)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.info: BackendInfo = backend.info
        self._open = False

    @property
    def max_slots(self) -> int:
        return 1

    def open(self) -> int:
        if self._open:
            raise BackendError("the one slot of this backend is taken")
        self._open = True
        return 0

    def close(self, slot: int) -> None:
        self._open = False

    def verify_many(self, calls: Sequence[VerifyCall]) -> list[TargetLogits]:
        return [self.backend.verify(call.pending, call.round_, call.unread) for call in calls]
