"""The benchmark protocol.

1. Parse the workload and the methods; settle backends; pick each family's plain reference.
2. Load every model once (ModelPool); a method that cannot be prepared is skipped, with why.
3. Warm-up: one short generation per method (first question, `warmup_tokens` new tokens),
   so first-call costs (allocations, kernel selection, caches) stay out of the timings.
4. Questions in order; for each, R repeats; in each repeat every method answers the whole
   question (all turns) before the next method starts.  The method order rotates by one per
   repeat (and per question), so within a question each method runs first equally often: a
   generation runs measurably slower second in a pair on a noisy 2-core machine, and with one
   order per question a method that never speculated read visibly below plain decoding on one
   category (benchmarks/heterogeneous/, "The order within a pair").
5. Per turn the repeat with the median wall time is kept (the lower median for even R), so
   that turn's tokens, phase split and latencies all come from one real run.
6. The question's answer line is appended to the method's JSONL as soon as it is done:
   `--resume` skips (method, question) pairs already on disk.
7. With `concurrency`, the cells with B requests in flight follow (`concurrency_run.py`).
"""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from draftwise.backends.dtype import DEFAULT_DTYPE, DtypeChoice, check_dtype
from draftwise.bench.executors import Executor, prepare
from draftwise.bench.methods import (
    MethodDefaults,
    MethodSpec,
    check_names,
    parse_method,
    references,
    resolve_backend,
    with_run_dtype,
)
from draftwise.bench.outputs import TurnOutput
from draftwise.bench.pool import LOAD_ERRORS, ModelPool, ModelUnavailable
from draftwise.bench.store import Answer, ResultStore, error_answer
from draftwise.workloads import Question, Workload, messages_for, parse_workloads
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.timing import noise_check

GENERATION_ERRORS = (RuntimeError, ValueError)  # backend refusals, context overflow, torch errors


@dataclass(frozen=True)
class BenchSettings:
    workloads: tuple[str, ...]
    methods: tuple[str, ...]
    target: str
    draft: str | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    repeats: int = 1
    threads: int = 1
    warmup_tokens: int = 8
    dtype: DtypeChoice = DEFAULT_DTYPE  # every transformers model's, peers' included (they share the object)
    concurrency: tuple[int, ...] = ()  # B values of the closed-loop cells (`concurrency_run.py`); () for none

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if any(b < 1 for b in self.concurrency):
            raise ValueError(f"--concurrency counts requests in flight, each >= 1: got {list(self.concurrency)}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        if not self.methods:
            raise ValueError("give at least one --method")
        if not self.workloads:
            raise ValueError("give at least one --workload")

    def generation(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, policy=SamplingPolicy(temperature=self.temperature),
                                seed=self.seed)

    def as_dict(self) -> dict:
        settings = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        if not self.concurrency:  # a run without cells keeps the run.json of runs made before the option
            del settings["concurrency"]
        return settings


@dataclass(frozen=True)
class BenchPlan:
    settings: BenchSettings
    workload: Workload
    methods: tuple[MethodSpec, ...]
    references: dict[str, str | None]  # method -> its family's plain reference


def make_plan(settings: BenchSettings) -> BenchPlan:
    """Everything that can be checked before a model is loaded."""
    workload = parse_workloads(list(settings.workloads))
    defaults = MethodDefaults(settings.target, settings.draft, settings.generation())
    methods = [with_run_dtype(resolve_backend(parse_method(text, defaults)), settings.dtype) for text in settings.methods]
    check_names(methods)
    return BenchPlan(settings, workload, tuple(methods), references(methods))


@dataclass
class Session:
    """What this process learned that the answer files do not hold."""

    skipped: dict[str, str] = field(default_factory=dict)  # method -> reason
    rss_after_load_mb: dict[str, float] = field(default_factory=dict)
    checkpoints: dict[str, dict] = field(default_factory=dict)  # method -> backend identity
    gate_profiles: dict[str, dict] = field(default_factory=dict)  # gated method -> the t(n) its gate used
    # "start" / "end" of the timed part -> a noise check (a short generation repeated): whether the
    # machine ran steadily enough for the run's ratios to mean anything
    noise: dict[str, dict] = field(default_factory=dict)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def prepare_all(plan: BenchPlan, pool: ModelPool, session: Session) -> dict[str, Executor]:
    executors: dict[str, Executor] = {}
    for method in plan.methods:
        try:
            executors[method.name] = prepare(method, pool, plan.settings.generation())
        except (ModelUnavailable, *LOAD_ERRORS) as exc:
            session.skipped[method.name] = str(exc)
            continue
        session.rss_after_load_mb[method.name] = round(peak_rss_mb(), 1)
        target = getattr(executors[method.name], "target", None) or getattr(executors[method.name], "tokenizer", None)
        if target is not None:
            session.checkpoints[method.name] = {"checkpoint": target.info.checkpoint,
                                                "tokenizer_hash": target.info.tokenizer_hash,
                                                "dtype": target.info.dtype,  # as loaded (what auto chose)
                                                "kv_row_bytes": target.info.kv_row_bytes or None}
    return executors


def warm_up(executors: dict[str, Executor], question: Question, tokens: int, session: Session) -> None:
    for name in list(executors):
        executor = executors[name]
        try:
            executor.run(executor.chat_prompt(messages_for(question, 0, [])), max_new_tokens=tokens)
        except GENERATION_ERRORS as exc:
            session.skipped[name] = f"warm-up failed: {exc.__class__.__name__}: {exc}"
            del executors[name]
            continue
        profile = executor.gate_profile()
        if profile is not None:
            session.gate_profiles[name] = profile


def check_noise(executors: dict[str, Executor], question: Question, tokens: int = 8) -> dict:
    """A noise check on the first method: a `tokens`-token generation of the first question,
    repeated (`draftwise.timing.noise_check`)."""
    if not executors:
        return {}
    name, executor = next(iter(executors.items()))
    prompt = executor.chat_prompt(messages_for(question, 0, []))
    try:
        check = noise_check(lambda: executor.run(prompt, max_new_tokens=tokens))
    except GENERATION_ERRORS as exc:
        return {"method": name, "error": f"{exc.__class__.__name__}: {exc}"}
    return {"method": name, "cv": round(check.cv, 4), "load_per_core": round(check.load_per_core, 3),
            "reliable": check.reliable, "verdict": check.describe()}


def answer_question(executor: Executor, question: Question) -> list[TurnOutput]:
    """All turns, each with the method's own earlier answers in the chat."""
    outputs: list[TurnOutput] = []
    for turn in range(len(question.turns)):
        prompt = executor.chat_prompt(messages_for(question, turn, [o.text for o in outputs]))
        outputs.append(executor.run(prompt))
    return outputs


def median_answer(method: str, question: Question, repeats: list[list[TurnOutput]]) -> Answer:
    """The repeat with the median total wall time (the lower one for an even count), all its
    turns together: a later turn's prompt holds the earlier turns' answers of its own repeat."""
    totals = [sum(turn.wall_time for turn in run) for run in repeats]
    pick = int(np.argsort(totals, kind="stable")[(len(totals) - 1) // 2])
    walls = tuple(tuple(run[turn].wall_time for run in repeats) for turn in range(len(question.turns)))
    return Answer(method, question.question_id, question.category, tuple(repeats[pick]), walls)


def method_order(names: Sequence[str], question: int, repeat: int) -> list[str]:
    """The methods in the order they answer repeat `repeat` of question number `question`:
    rotated by one per repeat and per question, so each runs first equally often."""
    shift = (question + repeat) % len(names) if names else 0
    return list(names[shift:]) + list(names[:shift])


def run_questions(plan: BenchPlan, executors: dict[str, Executor], store: ResultStore,
                  advance: Callable[[str, str], None]) -> None:
    """`advance(method, question_id)` after every generation (all turns of one repeat)."""
    done = {name: set(store.load(name)) for name in executors}
    names = list(executors)
    for index, question in enumerate(plan.workload.questions):
        todo = [n for n in names if question.question_id not in done[n]]
        runs: dict[str, list[list[TurnOutput]]] = {n: [] for n in todo}
        failed: dict[str, str] = {}
        for repeat in range(plan.settings.repeats):
            for name in method_order(todo, index, repeat):
                if name not in failed:
                    try:
                        runs[name].append(answer_question(executors[name], question))
                    except GENERATION_ERRORS as exc:
                        failed[name] = f"{exc.__class__.__name__}: {exc}"
                advance(name, question.question_id)
        for name in todo:
            model_id = executors[name].method.describe()
            answer = error_answer(name, question, failed[name]) if name in failed else median_answer(name, question, runs[name])
            store.append(answer, model_id)


def pending_generations(plan: BenchPlan, executors: dict[str, Executor], store: ResultStore) -> int:
    questions = {q.question_id for q in plan.workload.questions}
    left = sum(len(questions - set(store.load(name))) for name in executors)
    return left * plan.settings.repeats
