"""`--concurrency 1,2,4,8`: every method at every B, closed loop, interleaved repeats, resumable.

After the per-question pass (one request at a time, which gives every method's single-request
answers for the exactness check), each (method, B, repeat) cell decodes the first turn of
every question with B requests in flight (`Executor.run_batch`).  Repeats are interleaved: in
repeat r, for each B in order, every method runs its cell, the method order rotated by r so
that no method always runs first on a drifting machine.  Each method is warmed up once at the
largest B it accepts (its batch backend's first allocations stay out of the cells).  A cell is appended
to concurrency.jsonl as soon as it is done; `--resume` skips the cells there.  A method that
cannot batch at a B is recorded once as refused at that B, with the reason.
"""

from __future__ import annotations

from typing import Callable, Sequence

from draftwise.bench.cells import Cell, CellStore, is_done
from draftwise.bench.executors import Executor
from draftwise.bench.runner import GENERATION_ERRORS, BenchPlan
from draftwise.errors import InputError
from draftwise.workloads import messages_for

Prompts = list[tuple[str, Sequence[int]]]


def parse_concurrency(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): distinct request counts >= 1, in ascending order."""
    try:
        levels = tuple(sorted({int(item) for item in text.split(",") if item.strip()}))
    except ValueError as exc:
        raise InputError(f"--concurrency {text!r}: give request counts like 1,2,4,8") from exc
    if not levels or levels[0] < 1:
        raise InputError(f"--concurrency {text!r}: give request counts >= 1, like 1,2,4,8")
    return levels


def first_turns(plan: BenchPlan, executor: Executor) -> Prompts:
    return [(q.question_id, executor.chat_prompt(messages_for(q, 0, []))) for q in plan.workload.questions]


def pending_cells(plan: BenchPlan, executors: dict[str, Executor], store: CellStore) -> int:
    cells = store.load()
    return sum(not is_done(cells, name, batch, repeat) for name in executors
               for batch in plan.settings.concurrency for repeat in range(plan.settings.repeats))


def measure(executor: Executor, prompts: Prompts, batch: int, repeat: int, max_new_tokens: int | None = None) -> Cell:
    name = executor.method.name
    try:
        return Cell(name, batch, repeat, run=executor.run_batch(prompts, batch, max_new_tokens))
    except InputError as exc:  # BatchRefused, or draftwise's batch engine refusing the drafter
        return Cell(name, batch, None, refused=str(exc))
    except GENERATION_ERRORS as exc:
        return Cell(name, batch, repeat, error=f"{exc.__class__.__name__}: {exc}")


def warm_up(executor: Executor, prompts: Prompts, levels: Sequence[int], tokens: int) -> None:
    """A short cell at the largest B the method accepts (a refusal costs nothing: it comes before any work)."""
    for batch in sorted(levels, reverse=True):
        if measure(executor, prompts[:batch], batch, 0, tokens).refused is None:
            return


def run_concurrency(plan: BenchPlan, executors: dict[str, Executor], store: CellStore,
                    advance: Callable[[str, int], None]) -> None:
    """`advance(method, batch)` after every cell."""
    settings = plan.settings
    cells = store.load()
    prompts = {name: first_turns(plan, executor) for name, executor in executors.items()}
    names = list(executors)
    warmed: set[str] = set()
    for repeat in range(settings.repeats):
        shift = repeat % len(names) if names else 0
        order = names[shift:] + names[:shift]
        for batch in settings.concurrency:
            for name in order:
                if is_done(cells, name, batch, repeat):
                    continue
                if name not in warmed:
                    warmed.add(name)
                    warm_up(executors[name], prompts[name], settings.concurrency, settings.warmup_tokens)
                cell = measure(executors[name], prompts[name], batch, repeat)
                store.append(cell)
                cells.append(cell)
                advance(name, batch)
