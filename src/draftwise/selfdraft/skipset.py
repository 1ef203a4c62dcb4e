"""A skip set z in {0,1}^{2L} over a decoder's sublayers, and the artifact that stores a searched one.

z[2i] = 1 skips layer i's attention sublayer, z[2i + 1] = 1 its MLP sublayer (Draft & Verify
skips them separately).  A skipped sublayer adds nothing to the residual stream, so the draft
pass is the target with those terms removed.  The artifact (`draftwise skip search`) is a
directory with `skip.json` (the vector) and a manifest binding the target checkpoint and
tokenizer, the backend and threads it was measured on, the development prompts' hash, the
objective f and the trials: a skip set measured on one target is refused by another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from draftwise.artifacts import Manifest, read_manifest, staged_artifact, write_manifest
from draftwise.errors import ArtifactError, ContractError, InputError

KIND = "skip_set"
FILE = "skip.json"
RULES = ("every-other", "empty")  # skip sets named by a rule rather than a searched artifact (empty: a test reference)


class SkipSetMismatch(ContractError):
    """The skip set was searched for another target or tokenizer."""


@dataclass(frozen=True)
class SkipSet:
    z: tuple[int, ...]  # [2L]: z[2i] attention of layer i, z[2i + 1] its MLP; 1 = skipped

    def __post_init__(self) -> None:
        if not self.z or len(self.z) % 2 or any(v not in (0, 1) for v in self.z):
            raise InputError(f"a skip vector holds 0/1 per attention and MLP sublayer (even length), got {self.z!r}")

    @property
    def layers(self) -> int:
        return len(self.z) // 2

    def skips_attention(self, layer: int) -> bool:
        return bool(self.z[2 * layer])

    def skips_mlp(self, layer: int) -> bool:
        return bool(self.z[2 * layer + 1])

    @property
    def skipped(self) -> int:
        """Sublayers left out."""
        return sum(self.z)

    @property
    def depth(self) -> int:
        """Layers the draft pass must walk: past the last one that runs, nothing is left to compute."""
        running = [i for i in range(self.layers) if not (self.skips_attention(i) and self.skips_mlp(i))]
        return running[-1] + 1 if running else 0

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers whose attention runs: the only ones the draft keeps KV rows for."""
        return tuple(i for i in range(self.layers) if not self.skips_attention(i))

    def bits(self) -> str:
        return "".join(str(v) for v in self.z)

    def digest(self) -> str:
        return hashlib.sha256(self.bits().encode()).hexdigest()

    def check(self, num_layers: int) -> None:
        if self.layers != num_layers:
            raise InputError(f"skip vector for {self.layers} layers ({len(self.z)} entries); the target has {num_layers}")

    @classmethod
    def none(cls, num_layers: int) -> "SkipSet":
        """Nothing skipped: the draft pass is the target itself (a test reference)."""
        return cls((0,) * (2 * num_layers))

    @classmethod
    def every_other(cls, num_layers: int) -> "SkipSet":
        """The simple rule the search is compared with: layers 1, 3, 5, ... skipped whole."""
        return cls(tuple(v for i in range(num_layers) for v in ((i % 2,) * 2)))

    @classmethod
    def shallow(cls, num_layers: int, exit_layer: int) -> "SkipSet":
        """The first `exit_layer` layers run, every later one is skipped (Kangaroo's trunk)."""
        if not 1 <= exit_layer < num_layers:
            raise InputError(f"exit layer must be in [1, {num_layers - 1}] for {num_layers} layers, got {exit_layer}")
        return cls(tuple(0 if i < exit_layer else 1 for i in range(num_layers) for _ in range(2)))

    @classmethod
    def parse_bits(cls, text: str) -> "SkipSet":
        if not text or set(text) - {"0", "1"}:
            raise InputError(f"skip bits must be a string of 0 and 1, got {text!r}")
        return cls(tuple(int(c) for c in text))


@dataclass(frozen=True)
class SkipTarget:
    checkpoint: str
    tokenizer_hash: str


@dataclass(frozen=True, eq=False)
class SkipArtifact:
    skip: SkipSet
    target: SkipTarget
    manifest_hash: str
    provenance: Mapping[str, Any]

    def check_target(self, checkpoint: str, tokenizer_hash: str) -> None:
        if tokenizer_hash != self.target.tokenizer_hash or checkpoint != self.target.checkpoint:
            raise SkipSetMismatch(
                f"skip set searched for {self.target.checkpoint} (tokenizer {self.target.tokenizer_hash[:12]}…), not "
                f"{checkpoint} (tokenizer {tokenizer_hash[:12]}…): search one for this target (draftwise skip search)"
            )


HISTORY = "history.json"  # a searched set's trials, in order


def save_skip(directory: Path, skip: SkipSet, target: SkipTarget, provenance: Mapping[str, Any],
              history: list[dict[str, Any]] | None = None) -> Manifest:
    """Write the artifact atomically: `skip.json`, the search history if any, and the manifest
    (checksummed)."""
    with staged_artifact(Path(directory), KIND) as staging:
        (staging / FILE).write_text(json.dumps({"z": list(skip.z), "bits": skip.bits(), "layers": skip.layers,
                                                "skipped": skip.skipped}, indent=2) + "\n")
        if history is not None:
            (staging / HISTORY).write_text(json.dumps(history, indent=1) + "\n")
        return write_manifest(staging, KIND, {
            **dict(provenance),
            "target": {"checkpoint": target.checkpoint, "tokenizer_hash": target.tokenizer_hash},
        })


def load_skip(directory: Path) -> SkipArtifact:
    manifest = read_manifest(Path(directory), kind=KIND, required=(FILE,))
    try:
        body = json.loads((Path(directory) / FILE).read_text())
        skip = SkipSet(tuple(int(v) for v in body["z"]))
        bound = manifest.provenance["target"]
        target = SkipTarget(str(bound["checkpoint"]), str(bound["tokenizer_hash"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{directory}: not a valid skip set ({exc})") from exc
    return SkipArtifact(skip, target, manifest.hash, manifest.provenance)


def resolve_skip(spec: str, num_layers: int, checkpoint: str, tokenizer_hash: str) -> tuple[SkipSet, str]:
    """The skip set `spec` names for a target of `num_layers` layers, and where it came from:
    a rule (every-other, empty), a bit string (bits:0101...), or a `skip search` directory."""
    if spec == "every-other":
        return SkipSet.every_other(num_layers), spec
    if spec == "empty":
        return SkipSet.none(num_layers), spec
    if spec.startswith("bits:"):
        skip = SkipSet.parse_bits(spec.removeprefix("bits:"))
        skip.check(num_layers)
        return skip, spec
    if not Path(spec).is_dir():
        raise InputError(f"skip must be {', '.join(RULES)}, bits:0101..., or a `draftwise skip search` directory; "
                         f"{spec!r} is none of these")
    artifact = load_skip(Path(spec))
    artifact.check_target(checkpoint, tokenizer_hash)
    artifact.skip.check(num_layers)
    return artifact.skip, artifact.manifest_hash
