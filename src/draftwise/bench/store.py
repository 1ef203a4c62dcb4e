"""The result directory: run settings, one Spec-Bench answer JSONL per method, appended per question.

Layout of --out DIR:
    run.json                 the settings; `--resume` refuses to continue under different ones
    answers/METHOD.jsonl     one line per finished question (Spec-Bench's answer format, plus a
                             "draftwise" object with token ids and per-round data for the metrics)
    failures/METHOD.jsonl    one line per question the method failed (same format, no turns, the
                             reason in "draftwise"."error"): kept out of answers/ so that Spec-Bench's
                             own scripts read only real answers; resume does not retry them
                             unless asked to (`--retry-failures`), which moves them aside first
    failures/retried-STAMP/  failure lines set aside by a retry, kept as the record of what failed
    session.json             the latest session: skipped methods and why, memory, environment
    summary.json, report.md, *.png

A line is written (and flushed) as soon as the question is done for that method, so an
interrupted run loses at most the question in progress.  A partial last line (the process
died mid-write) is ignored on resume.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

from draftwise.bench.outputs import TurnOutput
from draftwise.errors import InputError
from draftwise.workloads import Question


class StoreError(InputError):
    """A result directory that does not fit the requested run."""


@dataclass(frozen=True)
class Answer:
    method: str
    question_id: str
    category: str
    turns: tuple[TurnOutput, ...]  # the median repeat of each turn
    repeat_walls: tuple[tuple[float, ...], ...]  # per turn, every repeat's wall time
    error: str | None = None

    @property
    def new_tokens(self) -> int:
        return sum(len(t.tokens) for t in self.turns)

    @property
    def wall_time(self) -> float:
        return sum(t.wall_time for t in self.turns)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


def answer_line(answer: Answer, model_id: str) -> dict:
    """Spec-Bench's answer record (`choices[0]` with turns, new_tokens, wall_time, accept_lengths)."""
    accept: list[int] = []
    for turn in answer.turns:
        accept.extend(turn.accept_lengths or [])
    details = []
    for turn in answer.turns:
        row = turn.as_dict()
        row.pop("text")  # already in choices[0].turns
        details.append(row)
    return {
        "question_id": answer.question_id,
        "category": answer.category,
        "answer_id": f"{answer.method}-{answer.question_id}",
        "model_id": model_id,
        "choices": [{
            "index": 0,
            "turns": [t.text for t in answer.turns],
            "decoding_steps": [len(t.accept_lengths) if t.accept_lengths is not None else None for t in answer.turns],
            "new_tokens": [len(t.tokens) for t in answer.turns],
            "wall_time": [t.wall_time for t in answer.turns],
            "accept_lengths": accept,
        }],
        "tstamp": time.time(),
        "draftwise": {"method": answer.method, "turns": details, "repeat_walls": [list(w) for w in answer.repeat_walls],
                      "error": answer.error},
    }


def parse_answer_line(row: dict) -> Answer:
    extra = row["draftwise"]
    texts = row["choices"][0]["turns"]
    turns = tuple(TurnOutput.from_dict({**detail, "text": text}) for detail, text in zip(extra["turns"], texts))
    return Answer(method=extra["method"], question_id=str(row["question_id"]), category=row["category"], turns=turns,
                  repeat_walls=tuple(tuple(w) for w in extra["repeat_walls"]), error=extra.get("error"))


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.answers_dir = root / "answers"
        self.failures_dir = root / "failures"

    def open(self, settings: dict, resume: bool) -> None:
        """Create the directory, or check that a resumed one was made with the same settings."""
        run_file = self.root / "run.json"
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"--out {self.root} exists and is not a directory; choose a result directory")
        if run_file.is_file():
            if not resume:
                raise StoreError(f"{self.root} already holds a run; pass --resume to continue it or choose another --out")
            try:
                saved = json.loads(run_file.read_text(encoding="utf-8"))
            except ValueError as exc:  # not JSON, or not UTF-8
                raise StoreError(f"--resume: {run_file} is not a run's settings (not valid JSON: {exc})") from exc
            if saved != settings:
                changed = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
                raise StoreError(f"--resume: {self.root} was run with different settings ({', '.join(changed)})")
        self.answers_dir.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps(settings, indent=2) + "\n")

    def set_failures_aside(self) -> Path | None:
        """Move every failure line into failures/retried-STAMP/, so that the failed questions run
        again; returns that directory, or None when nothing had failed."""
        files = sorted(self.failures_dir.glob("*.jsonl"))  # none when the directory does not exist
        if not files:
            return None
        stamp = time.strftime('%Y%m%dT%H%M%S', time.gmtime())
        aside = self.failures_dir / f"retried-{stamp}"
        for attempt in itertools.count(2):  # two retries within one second must not overwrite each other's record
            try:
                aside.mkdir()
                break
            except FileExistsError:
                aside = self.failures_dir / f"retried-{stamp}-{attempt}"
        for path in files:
            path.rename(aside / path.name)
        return aside

    def path(self, method: str) -> Path:
        return self.answers_dir / f"{method}.jsonl"

    def failure_path(self, method: str) -> Path:
        return self.failures_dir / f"{method}.jsonl"

    def load(self, method: str) -> dict[str, Answer]:
        """Finished and failed questions of `method` by question_id (an answer outranks a failure)."""
        failed = self._read(self.failure_path(method))
        return {**failed, **self._read(self.path(method))}

    @staticmethod
    def _read(path: Path) -> dict[str, Answer]:
        answers: dict[str, Answer] = {}
        if not path.is_file():
            return answers
        text = path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):  # cut a line the interruption left half-written, so appends stay whole
            text = text[: text.rfind("\n") + 1]
            path.write_text(text, encoding="utf-8")
        for line in text.splitlines():
            try:
                answer = parse_answer_line(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by an interruption: that question is redone
            answers[answer.question_id] = answer
        return answers

    def append(self, answer: Answer, model_id: str) -> None:
        path = self.failure_path(answer.method) if answer.error else self.path(answer.method)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(answer_line(answer, model_id)) + "\n")
            handle.flush()

    def write_json(self, name: str, payload: dict) -> Path:
        path = self.root / name
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        return path


def error_answer(method: str, question: Question, reason: str) -> Answer:
    return Answer(method, question.question_id, question.category, (), (), error=reason)
