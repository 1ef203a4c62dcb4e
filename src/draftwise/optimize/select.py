"""Hardware-aware tree selection: pick (n, d) by predicted time per committed token.

Cost model (one round, in plain-decoding steps, so t(1) = 1 is one ordinary decode step):
    time(n, d)     = t(n) + D      t(n): verify n rows (root included); D: drafting the tree
    time per token = time(n, d) / G(n, d)
    speedup        = G(n, d) / time(n, d)   (over plain decoding, which commits 1 token per t(1))
D is d * c with c one draft step (the flat model, and the toy oracle's), or, given the draft's
own profiles (a verify of r rows, an extend of r tokens), the forwards the draft-model
proposer really runs (`draft_round_steps`): a draft on a CPU is compute-bound like the
target, so a wide level costs more than a narrow one, and a catch-up more the more tokens the
last round published.  A flat c calibrated on width-4 trees priced a one-token chain's
drafting far above what the round-cost ledger measured (benchmarks/tree_grid/).
G(n, d) is Sequoia's optimum (`sequoia_dp`): expected tokens committed per round.  A longer
acceptance length is worth nothing if verification and drafting eat it: the round cost, not
G alone, decides, which is why every grid point is kept for plotting.

Ties (equal time per token) go to the smaller n, then the smaller d: the cheaper tree to
compile and verify.  With c > 0 the chosen tree's depth therefore equals the chosen d.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from draftwise.errors import InputError
from draftwise.artifacts import ArtifactError, Manifest, read_manifest, stable_hash, staged_artifact, write_manifest
from draftwise.optimize.acceptance import AcceptanceProfile
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.sequoia_dp import Paths, solve, validate_paths

ARTIFACT_KIND = "tree"
DATA_FILE = "tree.json"
FLAT_DRAFT_MODEL = "d * c"
PROFILED_DRAFT_MODEL = "draft verify profile"


def draft_round_steps(paths: Paths, expected_tokens: float, draft_forward: Callable[[float], float],
                      catch_up: Callable[[float], float] | None = None) -> float:
    """What the draft-model proposer spends on one round of this tree, in plain target steps;
    draft_forward(r): one draft verify of r rows (every row's logits), catch_up(r): one draft
    extend of r tokens (the last row's logits only; default draft_forward), same unit.  It
    runs (proposers/draft_model.py):
    - a catch-up extend over the tokens it has not read: the round's published ones, G on
      average, plus the pending token when the tree is deeper than one level (level 2 re-reads
      it, so the draft keeps the context without it); its last row gives level 1's distribution;
    - for each level l >= 2, one verify over the rows of level l - 1 (level 2: the pending row
      too).  The deepest level's tokens are drawn and never fed."""
    depth = max(map(len, paths), default=0)
    if depth == 0:
        return 0.0
    width = Counter(len(path) for path in paths)  # level -> nodes
    steps = (catch_up or draft_forward)(max(1.0, expected_tokens + (1 if depth > 1 else 0)))
    for level in range(2, depth + 1):
        steps += draft_forward(width[level - 1] + (1 if level == 2 else 0))
    return float(steps)


@dataclass(frozen=True)
class GridPoint:
    """One (n, d) considered; the numbers are None where no tree of n nodes and depth <= d fits."""

    n: int
    d: int
    expected_tokens: float | None
    time: float | None
    time_per_token: float | None
    speedup: float | None


@dataclass(frozen=True)
class TreeChoice:
    n: int  # nodes including the root: rows per verification
    d: int  # depth = draft steps
    expected_tokens: float  # G
    time_per_token: float  # (t(n) + D) / G, plain-decoding steps per committed token
    speedup: float  # G / (t(n) + D)
    paths: Paths  # Medusa/vLLM slot paths, root excluded, parent before child
    draft_cost: float  # c used (by the flat model only)
    grid: tuple[GridPoint, ...]  # every (n, d) considered, row-major in n then d
    draft_model: str = FLAT_DRAFT_MODEL  # FLAT_DRAFT_MODEL (d c) or PROFILED_DRAFT_MODEL (t_d per forward)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "TreeChoice":
        return cls(
            n=int(body["n"]), d=int(body["d"]), expected_tokens=float(body["expected_tokens"]),
            time_per_token=float(body["time_per_token"]), speedup=float(body["speedup"]),
            paths=validate_paths(body["paths"]), draft_cost=float(body["draft_cost"]),
            grid=tuple(GridPoint(**point) for point in body["grid"]),
            draft_model=str(body.get("draft_model", FLAT_DRAFT_MODEL)),  # trees saved before it were flat
        )


def optimize_tree(
    p: Sequence[float] | Sequence[Sequence[float]] | np.ndarray,
    profile_t: Callable[[int], float],
    c: float,
    n_range: Iterable[int],
    d_max: int,
    draft_forward: Callable[[float], float] | None = None,
    draft_catch_up: Callable[[float], float] | None = None,
) -> TreeChoice:
    """Search n in n_range (root included) and d in 0..d_max for the least time per token.

    p: positional acceptance [W] or [D, W]; profile_t(n): verification time of n rows in
    plain-decoding steps (e.g. `VerifyCostProfile.relative_at`); c: one draft step, same unit.
    draft_forward(r): one draft forward of r rows in the same unit; when given, each (n, d)'s
    tree is priced by `draft_round_steps` (its catch-up by draft_catch_up, if given) instead of d * c.
    """
    ns = sorted({int(n) for n in n_range})
    if not ns or ns[0] < 1:
        raise InputError(f"n_range must hold node counts >= 1 (the root counts), got {ns}")
    if not np.isfinite(c) or c < 0:
        raise InputError(f"draft cost c must be finite and >= 0, got {c}")
    table = solve(p, ns[-1], d_max)
    grid: list[GridPoint] = []
    for n in ns:
        t_n = float(profile_t(n))
        if not np.isfinite(t_n) or t_n <= 0:
            raise InputError(f"profile_t({n}) = {t_n}: verification time must be positive")
        for d in range(d_max + 1):
            if not table.feasible(n, d):
                grid.append(GridPoint(n, d, None, None, None, None))
                continue
            g = table.value(n, d)
            drafting = (d * c if draft_forward is None
                        else draft_round_steps(table.paths(n, d), g, draft_forward, draft_catch_up))
            time = t_n + drafting
            grid.append(GridPoint(n, d, g, time, time / g, g / time))
    feasible = [pt for pt in grid if pt.expected_tokens is not None]
    if not feasible:
        raise InputError(f"no tree fits n in {ns}, depth <= {d_max} and the slot width of p")
    best = min(feasible, key=lambda pt: (pt.time_per_token, pt.n, pt.d))
    return TreeChoice(
        n=best.n, d=best.d, expected_tokens=best.expected_tokens, time_per_token=best.time_per_token,
        speedup=best.speedup, paths=table.paths(best.n, best.d), draft_cost=float(c), grid=tuple(grid),
        draft_model=FLAT_DRAFT_MODEL if draft_forward is None else PROFILED_DRAFT_MODEL,
    )


@dataclass(frozen=True)
class TreeArtifact:
    """A loaded tree artifact and what it was optimized against."""

    choice: TreeChoice
    acceptance_manifest_hash: str
    hardware_manifest_hash: str
    draft_hardware_manifest_hash: str | None  # the draft's verify profile, None for the flat d c model
    draft_catch_up_manifest_hash: str | None  # the draft's extend profile, if it priced the catch-up
    policy: Mapping[str, Any]
    manifest_hash: str
    directory: Path


def save_tree_artifact(
    directory: Path, choice: TreeChoice, acceptance_manifest_hash: str,
    hardware_manifest_hash: str, policy: Mapping[str, Any], draft_hardware_manifest_hash: str | None = None,
    draft_catch_up_manifest_hash: str | None = None,
) -> Manifest:
    """Write kind "tree": the manifest hash binds topology, acceptance, hardware (the target's
    and, when it priced the drafting, the draft's) and policy."""
    provenance = {
        "topology_hash": stable_hash([list(path) for path in choice.paths]),
        "acceptance_manifest": acceptance_manifest_hash,
        "hardware_manifest": hardware_manifest_hash,
        "draft_hardware_manifest": draft_hardware_manifest_hash,
        "draft_catch_up_manifest": draft_catch_up_manifest_hash,
        "policy": dict(policy),
        "n": choice.n,
        "d": choice.d,
    }
    with staged_artifact(directory, ARTIFACT_KIND) as staging:
        (staging / DATA_FILE).write_text(json.dumps(choice.to_json(), indent=1) + "\n")
        manifest = write_manifest(staging, ARTIFACT_KIND, provenance)
    return manifest


def load_tree_artifact(
    directory: Path, *, acceptance_manifest_hash: str | None = None, hardware_manifest_hash: str | None = None,
    draft_hardware_manifest_hash: str | None = None, draft_catch_up_manifest_hash: str | None = None,
) -> TreeArtifact:
    """Read and verify a tree artifact; if expected input hashes are given, a mismatch is an error."""
    manifest = read_manifest(directory, kind=ARTIFACT_KIND, required=(DATA_FILE,))
    choice = TreeChoice.from_json(json.loads((Path(directory) / DATA_FILE).read_text()))
    prov = manifest.provenance
    if prov.get("topology_hash") != stable_hash([list(path) for path in choice.paths]):
        raise ArtifactError(f"{directory}: the tree's paths do not match its recorded topology hash")
    for label, expected, key in (("acceptance", acceptance_manifest_hash, "acceptance_manifest"),
                                 ("hardware", hardware_manifest_hash, "hardware_manifest"),
                                 ("draft hardware", draft_hardware_manifest_hash, "draft_hardware_manifest"),
                                 ("draft catch-up", draft_catch_up_manifest_hash, "draft_catch_up_manifest")):
        if expected is not None and prov.get(key) != expected:
            raise ArtifactError(
                f"{directory} was optimized for {label} artifact {str(prov.get(key))[:12]}…, not {expected[:12]}…"
            )
    return TreeArtifact(choice=choice, acceptance_manifest_hash=prov["acceptance_manifest"],
                        hardware_manifest_hash=prov["hardware_manifest"],
                        draft_hardware_manifest_hash=prov.get("draft_hardware_manifest"),
                        draft_catch_up_manifest_hash=prov.get("draft_catch_up_manifest"), policy=dict(prov["policy"]),
                        manifest_hash=manifest.hash, directory=Path(directory))


def check_compatible(acceptance: Mapping[str, Any], profile: VerifyCostProfile) -> None:
    """A tree optimized from artifacts of different configurations predicts nothing."""
    if acceptance.get("target") != profile.model:
        raise InputError(f"acceptance was measured on {acceptance.get('target')}, the profile on {profile.model}")
    if acceptance.get("backend") != profile.backend:
        raise InputError(f"acceptance was measured on backend {acceptance.get('backend')}, the profile on {profile.backend}")
    threads = acceptance.get("threads")
    if threads and profile.threads and int(threads) != int(profile.threads):
        raise InputError(f"acceptance was measured with {threads} threads, the profile with {profile.threads}")


def check_draft_profile(acceptance: Mapping[str, Any], target: VerifyCostProfile, draft: VerifyCostProfile) -> None:
    """The draft's profile must time the draft that was calibrated, on the target's backend and threads."""
    drafts = {p.get("checkpoint") for p in acceptance.get("proposers", []) if p.get("name") == "draft-model"}
    if draft.model not in drafts:
        raise InputError(f"the draft profile times {draft.model}; the calibration drafted with "
                         f"{', '.join(sorted(map(str, drafts))) or 'no draft model'}")
    if draft.backend != target.backend or int(draft.threads) != int(target.threads):
        raise InputError(f"the draft profile was measured on {draft.backend} with {draft.threads} threads, the target's "
                         f"on {target.backend} with {target.threads}")
    if draft.absolute_s is None or target.absolute_s is None:
        raise InputError("pricing the draft by its profile needs measured seconds in both profiles")


def draft_steps(draft: VerifyCostProfile, target: VerifyCostProfile) -> Callable[[float], float]:
    """A draft profile as r -> plain target steps (its seconds over the target's t(1)): what
    `draft_round_steps` takes for a verify or a catch-up."""
    step = target.absolute_at(1)
    return lambda rows: draft.absolute_at(rows) / step


def load_draft_steps(directory: Path, acceptance: Mapping[str, Any],
                     target: VerifyCostProfile) -> tuple[Callable[[float], float], str]:
    """A draft profile artifact, checked against the calibration and the target's profile, as
    `draft_steps`, with its manifest hash (which the tree artifact binds)."""
    draft = VerifyCostProfile.load(directory)
    check_draft_profile(acceptance, target, draft)
    return draft_steps(draft, target), read_manifest(directory).hash


def optimize_from_artifacts(
    acceptance_dir: Path, profile_dir: Path, out: Path, *, max_depth: int,
    max_nodes: int | None = None, draft_cost: float | None = None, draft_profile_dir: Path | None = None,
    draft_catch_up_dir: Path | None = None,
) -> tuple[TreeChoice, Manifest]:
    """Load an acceptance and a verify-profile artifact, check they describe one configuration,
    optimize over n = the profile's first row .. min(max_nodes, its last row), and save the tree
    artifact in `out`.  With `draft_profile_dir` (the draft's own verify profile) drafting is
    priced forward by forward (`draft_round_steps`, seconds over the target's t(1)), its
    catch-up by `draft_catch_up_dir` (the draft's extend profile) when given.  Else c
    defaults to the calibration's measured proposer cost per depth over the profile's t(1)
    (both in seconds), i.e. plain-decoding steps."""
    acceptance = AcceptanceProfile.load(acceptance_dir)
    cost = VerifyCostProfile.load(profile_dir)
    check_compatible(acceptance.provenance, cost)
    draft_forward, draft_catch_up, draft_hash, catch_up_hash = None, None, None, None
    if draft_catch_up_dir is not None and draft_profile_dir is None:
        raise InputError("a catch-up profile prices part of the drafting: give the draft's verify profile too")
    if draft_profile_dir is not None:
        if draft_cost is not None:
            raise InputError("give a flat draft cost or a draft profile, not both")
        draft_cost = 0.0
        draft_forward, draft_hash = load_draft_steps(draft_profile_dir, acceptance.provenance, cost)
        if draft_catch_up_dir is not None:
            draft_catch_up, catch_up_hash = load_draft_steps(draft_catch_up_dir, acceptance.provenance, cost)
    elif draft_cost is None:
        if cost.absolute_s is None or "draft_step_seconds" not in acceptance.provenance:
            raise InputError("no measured draft cost: pass --draft-cost (plain-step units)")
        draft_cost = float(acceptance.provenance["draft_step_seconds"]) / cost.absolute_at(1)
    last = cost.max_rows if max_nodes is None else min(max_nodes, cost.max_rows)
    choice = optimize_tree(acceptance.matrix, cost.relative_at, draft_cost, range(cost.rows[0], last + 1), max_depth,
                           draft_forward, draft_catch_up)
    manifest = save_tree_artifact(out, choice, read_manifest(acceptance_dir).hash, read_manifest(profile_dir).hash,
                                  acceptance.provenance.get("policy", {}), draft_hash, catch_up_hash)
    return choice, manifest
