"""Draft & Verify's skip-set search (docs/training.md, "Skip-set search"): choose z in {0,1}^{2L} minimizing

    f(z) = measured seconds per committed token of `--proposer layer-skip` with skip set z

on development prompts (draft, verify and state costs all inside the wall time), not the
acceptance rate (z = 0 accepts everything and costs more than plain decoding).  The optimizer
is optuna's TPE sampler over one binary parameter per sublayer; the study lives in an SQLite
file in the work directory, so an interrupted search resumes where it stopped (the trials
already measured are kept, the budget counts them).  Trial 0 is the every-other-layer rule (the
simple baseline the search is compared with), then a few sparser structured sets (`starting_sets`).  The result is a skip-set
artifact with its history (f per trial), the objective's provenance (target, tokenizer, backend,
dtype, threads, the prompts and their hash, the decoding settings) and f of plain decoding and
of the rule measured in the same run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from draftwise.artifacts import stable_hash
from draftwise.backends.transformers import TransformersBackend
from draftwise.build import verifying_target
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.errors import InputError
from draftwise.options import option
from draftwise.proposers.family import DrafterResources
from draftwise.proposers.layer_skip import LayerSkipConfig, open_layer_skip
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.selfdraft.skipset import SkipSet, SkipTarget, save_skip
from draftwise.verify.registry import make_verifier
from draftwise.workloads import first_turn_prompts

log = logging.getLogger(__name__)  # progress lines (the CLI shows INFO)

OBJECTIVE = "wall seconds per committed token, greedy, summed over the development prompts"


@dataclass(frozen=True)
class SearchRecipe:
    trials: int = option(40, help="trial budget (trials already in the study count)")
    prompts: str = option("spec-bench:all:6", help="development workload (keep it disjoint from the evaluation's)")
    max_new_tokens: int = option(48, help="tokens generated per prompt and trial")
    seed: int = option(0, help="TPE sampler seed")
    startup: int = option(10, help="random trials before TPE models the objective")
    size: int = option(0, help="skip exactly this many sublayers (0: any number); the number the every-other "
                               "rule skips (L) compares the search with the rule at equal size")

    def __post_init__(self) -> None:
        if self.trials < 1 or self.max_new_tokens < 2 or self.startup < 0 or self.size < 0:
            raise InputError("a search needs >= 1 trial, >= 2 new tokens per prompt, startup >= 0 and size >= 0")


@dataclass(frozen=True)
class SearchResult:
    skip: SkipSet
    f: float
    history: list[dict[str, Any]]
    baselines: dict[str, float]


def seconds_per_token(target: TransformersBackend, proposers: list, prompts: Sequence[Sequence[int]],
                      max_new_tokens: int, policy: SamplingPolicy = SamplingPolicy(), verifier: str = "greedy"
                      ) -> tuple[float, dict[str, float]]:
    """f: wall seconds over committed tokens, summed over `prompts` (greedy unless `policy`
    samples, with `verifier`: auto picks by the contracts); and what it was made of."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, policy=policy)
    decoder = SpeculativeDecoder(verifying_target(proposers, target), proposers,
                                 make_verifier(verifier, [p.contract for p in proposers], config.policy), config)
    wall = tokens = accepted = rounds = 0.0
    for prompt in prompts:
        result = decoder.generate(prompt)
        wall += result.stats.wall_seconds
        tokens += len(result.tokens)
        accepted += sum(r.accepted for r in result.records)
        rounds += len(result.records)
    return wall / max(tokens, 1.0), {"tokens": tokens, "accepted": accepted, "rounds": rounds, "wall_s": wall}


def development_prompts(target: TransformersBackend, recipe: SearchRecipe) -> list[list[int]]:
    """The recipe's workload, first turns through the target's chat template."""
    return first_turn_prompts(target.chat_prompt, recipe.prompts)


def search_skip(target: TransformersBackend, recipe: SearchRecipe, drafter: LayerSkipConfig, work: Path,
                prompts: Sequence[Sequence[int]], on_trial: Callable[[dict[str, Any]], None] | None = None
                ) -> SearchResult:
    """Run (or resume) the study in `work` on `prompts` (token ids) and return the best skip set found."""
    import optuna

    layers = int(target.model.config.num_hidden_layers)
    if recipe.size > 2 * layers:
        raise InputError(f"size {recipe.size}: the target has {2 * layers} sublayers")
    key = study_key(target, recipe, drafter, prompts)
    work.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # draftwise reports each trial itself
    study = optuna.create_study(
        study_name=f"skip-{key[:16]}", storage=f"sqlite:///{work / 'study.db'}", load_if_exists=True,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=recipe.seed, n_startup_trials=recipe.startup),
    )
    def measure(skip: SkipSet) -> tuple[float, dict[str, float]]:
        config = replace(drafter, skip="bits:" + skip.bits())
        proposer = open_layer_skip(config, DrafterResources(target))
        return seconds_per_token(target, [proposer], prompts, recipe.max_new_tokens)

    baselines = {}
    for name, skip in (("every-other", SkipSet.every_other(layers)),):
        baselines[name] = _stored_or_measured(study, f"baseline:{name}", lambda s=skip: measure(s)[0])
    baselines["plain"] = _stored_or_measured(study, "baseline:plain", lambda: seconds_per_token(
        target, [], prompts, recipe.max_new_tokens)[0])
    if not study.trials:
        for seed_set in starting_sets(layers):
            if recipe.size in (0, seed_set.skipped):
                study.enqueue_trial(_params(seed_set, recipe.size))

    def objective(trial) -> float:
        if recipe.size:  # random keys: a weight per sublayer, the `size` heaviest skipped (TPE models the weights)
            weights = [trial.suggest_float(name, 0.0, 1.0) for name in _names(layers)]
            skip = SkipSet(_heaviest(weights, recipe.size))
        else:
            skip = SkipSet(tuple(trial.suggest_int(name, 0, 1) for name in _names(layers)))
        started = time.perf_counter()
        f, detail = measure(skip)
        trial.set_user_attr("bits", skip.bits())
        trial.set_user_attr("detail", detail)
        row = {"trial": trial.number, "bits": skip.bits(), "skipped": skip.skipped, "f": f, **detail,
               "seconds": round(time.perf_counter() - started, 2)}
        best = min([f, *(t.value for t in study.trials if t.value is not None)])
        log.info("skip search: trial %d/%d f=%.4f s/token (%d sublayers skipped, %.0f accepted / %.0f tokens), "
                 "best %.4f", trial.number + 1, recipe.trials, f, skip.skipped, detail["accepted"],
                 detail["tokens"], best)
        if on_trial is not None:
            on_trial(row)
        return f

    done = sum(t.state.name == "COMPLETE" for t in study.trials)
    if done:
        log.info("skip search: resuming after %d trials (%s)", done, work / "study.db")
    if recipe.trials > done:
        study.optimize(objective, n_trials=recipe.trials - done)
    history = [{"trial": t.number, "bits": t.user_attrs.get("bits"), "f": t.value, **t.user_attrs.get("detail", {})}
               for t in study.trials if t.value is not None]
    best = study.best_trial
    return SearchResult(SkipSet.parse_bits(best.user_attrs["bits"]), float(best.value), history, baselines)


def write_search(out: Path, target: TransformersBackend, recipe: SearchRecipe, drafter: LayerSkipConfig,
                 prompts: Sequence[Sequence[int]], result: SearchResult, questions: Sequence[str] = ()) -> Any:
    provenance = {
        "objective": OBJECTIVE, "f": result.f, "trials": len(result.history), "baselines": result.baselines,
        "backend": target.info.name, "dtype": target.info.dtype, "threads": target.n_threads,
        "prompts": {"workload": recipe.prompts, "hash": stable_hash([list(p) for p in prompts]),
                    "count": len(prompts), "questions": list(questions)},
        "recipe": asdict(recipe), "drafter": {k: str(v) for k, v in asdict(drafter).items()},
        "optimizer": "optuna TPE, one binary parameter per attention and MLP sublayer",
    }
    return save_skip(out, result.skip, SkipTarget(target.info.checkpoint, target.info.tokenizer_hash), provenance,
                     history=result.history)


def study_key(target: TransformersBackend, recipe: SearchRecipe, drafter: LayerSkipConfig,
              prompts: Sequence[Sequence[int]]) -> str:
    """A study resumes only for the same objective: target, threads, prompts and settings."""
    return stable_hash({"target": target.info.checkpoint, "threads": target.n_threads, "dtype": target.info.dtype,
                        "prompts": [list(p) for p in prompts], "max_new_tokens": recipe.max_new_tokens, "seed": recipe.seed,
                        "size": recipe.size,
                        "drafter": {k: str(v) for k, v in asdict(drafter).items() if k != "skip"}})


def starting_sets(layers: int) -> list[SkipSet]:
    """The first trials, before the sampler's own: the every-other-layer rule (the baseline the
    search is compared with), then sparser structured sets (every other MLP; every other
    attention; the MLPs of the last third).  Uniform random bits skip half the sublayers, where
    a small model accepts almost nothing: these anchor TPE where drafts are accepted."""
    alternate = [i % 2 for i in range(layers)]
    return [
        SkipSet.every_other(layers),
        SkipSet(tuple(v for a in alternate for v in (0, a))),
        SkipSet(tuple(v for a in alternate for v in (a, 0))),
        SkipSet(tuple(v for i in range(layers) for v in (0, int(i >= layers - layers // 3)))),
    ]


def _names(layers: int) -> list[str]:
    return [f"{kind}{i}" for i in range(layers) for kind in ("attn", "mlp")]


def _params(skip: SkipSet, size: int = 0) -> dict[str, float]:
    """The trial parameters that reproduce `skip`: its bits, or (fixed size) weights 1 where it skips."""
    return {name: float(v) if size else int(v) for name, v in zip(_names(skip.layers), skip.z)}


def _heaviest(weights: list[float], size: int) -> tuple[int, ...]:
    """z with the `size` largest weights skipped (ties to the earlier sublayer)."""
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))[:size]
    return tuple(int(i in order) for i in range(len(weights)))


def _stored_or_measured(study, key: str, measure: Callable[[], float]) -> float:
    """A baseline measured once per study (stored in it, so a resumed search keeps it)."""
    if key in study.user_attrs:
        return float(study.user_attrs[key])
    value = measure()
    study.set_user_attr(key, value)
    log.info("skip search: %s f=%.4f s/token", key.removeprefix("baseline:"), value)
    return value
