"""What a drafter family declares once, so that nothing above it compares its name.

A family is the counterpart of a verifier's capabilities: its config dataclass (typed
fields, defaults defined there), its probability contract and candidate shape as functions
of that config (known before any model is loaded, so negotiation refuses a bad pairing
first), and a factory from the loaded backends.  `proposers/registry.py` lists the families;
adding a drafter is one module with a `FAMILY` plus one line there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Protocol, TypeVar

from draftwise.backends.base import Backend
from draftwise.runtime.contracts import ProposerContract, SamplingRelation
from draftwise.errors import InputError
from draftwise.proposers.base import Proposer

C = TypeVar("C")


@dataclass(frozen=True)
class CandidateShape:
    """The most a family's proposal holds in one round, from its config alone."""

    rows: int  # candidate rows; 0 = unknown in advance (bounded by the round's tree limits)
    depth: int  # deepest candidate; 0 = unknown in advance
    branches: bool  # some node may have several children (a tree or a one-position set)


class DraftPasses(Protocol):
    """Where a self-drafter of a batch's request gets its draft backend: a slot on the pass every
    request with the same skip set and exit shares (`backends.layer_skip_batch.ComposedDrafts`)."""

    def slot(self, draft: Any) -> Backend:
        """A slot, for one request, of the batch running `draft`'s composed pass."""


@dataclass(frozen=True)
class DrafterResources:
    """What a factory may use: the loaded target, the draft model where the family needs one,
    and in a batch the shared composed passes of the self-drafters (None alone: a request's
    self-drafter runs its own pass)."""

    target: Backend
    draft: Backend | None = None
    passes: DraftPasses | None = None


@dataclass(frozen=True)
class DrafterFamily(Generic[C]):
    name: str
    config: type[C]
    contract: Callable[[C], ProposerContract]
    shape: Callable[[C], CandidateShape]
    build: Callable[[C, DrafterResources], Proposer]
    summary: str
    needs_draft_model: bool = False
    free_to_ask: bool = False  # proposing costs ~nothing, so a cost gate may cut it (the gate prices t(n) only)
    auto_candidate: bool = False  # `--proposer auto` may choose it
    auto_tree: bool = False  # `tree=auto` is planned for it from measured artifacts
    # each request of a batch may run its own proposer: it holds no model state (no draft KV,
    # no target hidden states) that requests sharing one loaded model would share
    batched: bool = False
    # it reads the target's hidden states (`backends.base.supports_hidden`): a batch runs it where
    # the batch backend keeps them per slot (transformers)
    reads_hidden: bool = False
    # it drafts with the target's own layers (layer skip, Kangaroo): its draft and the verify share
    # the target's state, so it runs alone (no batches, no unions with other sources)
    drafts_on_target: bool = False
    # the config whose rounds `draftwise calibrate` counts: width-W trees of depth D, children
    # drawn by the given relation (None: the family cannot be calibrated)
    calibrated: Callable[[int, int, SamplingRelation], C] | None = None

    def make(self, config: C, resources: DrafterResources) -> Proposer:
        if self.needs_draft_model and resources.draft is None:
            raise InputError(f"proposer {self.name} needs a draft model (--draft MODEL, sharing the target's tokenizer)")
        return self.build(config, resources)


class DrafterRegistry:
    """Families by name; an unknown name is refused with the list of known ones."""

    def __init__(self, families: Iterable[DrafterFamily[Any]]) -> None:
        self._families: dict[str, DrafterFamily[Any]] = {}
        for family in families:
            if family.name in self._families or family.name in RESERVED_NAMES:
                raise ValueError(f"drafter family {family.name!r} registered twice or under a reserved name")
            self._families[family.name] = family

    def get(self, name: str) -> DrafterFamily[Any]:
        if name not in self._families:
            raise InputError(f"unknown proposer {name!r}; choose {', '.join(self.choices())}")
        return self._families[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._families)

    def choices(self) -> tuple[str, ...]:
        """Every word `--proposer` accepts: none (plain decoding), the families, auto."""
        return ("none", *self._families, "auto")

    def families(self) -> tuple[DrafterFamily[Any], ...]:
        return tuple(self._families.values())

    def with_family(self, family: DrafterFamily[Any]) -> "DrafterRegistry":
        """A new registry with one more family (the library's own is never changed)."""
        return DrafterRegistry([*self._families.values(), family])


RESERVED_NAMES = ("none", "auto")
