"""Every `draftwise ...` command in README.md and docs/ parses against the CLI, without running.

Commands are taken from shell code blocks (```bash, ```sh, ```console or a bare ```) and from
inline code that starts with `draftwise` (or its script in a `bin/` directory, such as
`.venv/bin/draftwise`).  A block's text is read as a shell would split it: line continuations
joined, `# comments` dropped, `$'...'` (ANSI-C quoting) decoded, `&&` / `||` / `;` / `|`
chains split into their commands, `NAME=value` prefixes and redirections set aside.

Each command goes down the typer app's click tree (`make_context` on every group,
`resolve_command` to the next) to its leaf, whose `make_context` parses the arguments: an
unknown command or option, a bad value type, a missing required argument or an extra argument
fails.  A group whose callback runs without a subcommand (`draftwise bench`) is a leaf when no
subcommand follows.  Inline code names a command in running text (`draftwise profile
--invariance`), so there the required arguments may be left out; everything else is checked.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import typer.main

from draftwise.cli import app

ROOT = Path(__file__).resolve().parents[2]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
ANSI_C = re.compile(r"\$'((?:[^'\\]|\\.)*)'")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PROGRAM = re.compile(r"^(?:\S*/)?bin/draftwise$|^draftwise$")  # draftwise, .venv/bin/draftwise; not ~/.cache/draftwise
# typer builds on click (recent typer vendors its own copy): its usage error and exit, found through
# typer's own names so the test does not depend on which click that is
USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
SEPARATORS = {"&&", "||", ";", "|", "&", ";;", "|&"}
REDIRECTIONS = {">", ">>", "<", ">&", "&>", "<<<"}


@dataclass(frozen=True)
class DocCommand:
    where: str  # "page:line"
    args: tuple[str, ...]  # what follows `draftwise`
    complete: bool  # a code block's command (True) or inline code naming one in a sentence (False)

    def __str__(self) -> str:
        return " ".join(("draftwise", *map(shlex.quote, self.args)))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _ansi_c(body: str) -> str:
    """The string bash's `$'...'` stands for (\\n, \\t, \\\\, \\', \\xHH, ...)."""
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape")


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of shell text, each as its words (assignments and redirections kept)."""
    commands: list[list[str]] = []
    for line in text.replace("\\\n", " ").splitlines():
        line = ANSI_C.sub(lambda m: shlex.quote(_ansi_c(m.group(1))), line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in SEPARATORS:
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [c for c in commands if c]


def draftwise_args(words: list[str]) -> tuple[str, ...] | None:
    """The arguments of a `draftwise` command, or None when `words` runs something else."""
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words or not PROGRAM.match(words[0]):
        return None
    args: list[str] = []
    rest = iter(words[1:])
    for word in rest:
        if word in REDIRECTIONS:
            next(rest, None)  # its file
        else:
            args.append(word)
    return tuple(args)


def commands_in(markdown: str, page: str) -> list[DocCommand]:
    """Every draftwise command of one Markdown page: code blocks in full, inline code as mentions."""
    found: list[DocCommand] = []
    prose = markdown
    for block in FENCE.finditer(markdown):
        start = markdown.count("\n", 0, block.start(2)) + 1
        body = block.group(2)
        # blank the block out of the prose, keeping the line numbers
        prose = prose[:block.start()] + re.sub(r"[^\n]", " ", block.group(0)) + prose[block.end():]
        if block.group(1).strip().lower() not in SHELL_FENCES:
            continue
        lines = body.split("\n")
        for offset, _ in enumerate(lines):
            if offset and lines[offset - 1].endswith("\\"):
                continue  # a continuation: read with the line that starts the command
            text = lines[offset]
            end = offset
            while text.endswith("\\") and end + 1 < len(lines):
                end += 1
                text += "\n" + lines[end]
            for words in shell_commands(text):
                args = draftwise_args(words)
                if args is not None:
                    found.append(DocCommand(f"{page}:{start + offset}", args, True))
    for number, line in enumerate(prose.splitlines(), start=1):
        for span in INLINE.finditer(line):
            for words in shell_commands(span.group(1)):
                args = draftwise_args(words)
                if args is not None:
                    found.append(DocCommand(f"{page}:{number}", args, False))
    return found


def doc_commands() -> list[DocCommand]:
    return [c for page in pages() for c in commands_in(page.read_text(), str(page.relative_to(ROOT)))]


def _is_group(command) -> bool:
    return hasattr(command, "resolve_command") and hasattr(command, "commands")


def _relax(command) -> None:
    """A mention may leave out required arguments: none is required any more."""
    for param in command.params:
        param.required = False
    if _is_group(command):
        for sub in command.commands.values():
            _relax(sub)


def _make_context(command, name: str, args: list[str], parent):
    """`command.make_context`, with `--help` (which prints and exits 0) counted as parsed."""
    try:
        return command.make_context(name, args, parent=parent)
    except typer.Exit as stop:
        if getattr(stop, "exit_code", 1) == 0:
            return None
        raise


def parse(args: tuple[str, ...] | list[str], complete: bool = True) -> None:
    """Parse `draftwise ARGS` against the app down to its leaf command; raise USAGE_ERROR (or a
    subclass: no such option or command, bad value, missing or extra argument) if it does not
    parse.  Nothing runs: no command's callback is invoked."""
    command = typer.main.get_command(app)
    if not complete:
        _relax(command)
    name, rest, parent = "draftwise", list(args), None
    while _is_group(command):
        if not rest and not complete:
            return  # inline code naming a group
        ctx = _make_context(command, name, rest, parent)
        if ctx is None:
            return
        protected = getattr(ctx, "_protected_args", None)
        if protected is None:  # click < 8.2
            protected = ctx.protected_args
        remaining = [*protected, *ctx.args]
        if not remaining:
            if command.invoke_without_command or not complete:
                return  # a group whose callback runs without a subcommand (draftwise bench)
            raise USAGE_ERROR(f"{name}: missing command")
        sub_name, sub, sub_args = command.resolve_command(ctx, remaining)
        if sub is None or sub_name is None:
            raise USAGE_ERROR(f"no such command {remaining[0]!r}")
        command, name, rest, parent = sub, sub_name, sub_args, ctx
    _make_context(command, name, rest, parent)


COMMANDS = doc_commands()


def test_the_pages_hold_their_commands():
    """The extraction finds what the pages hold: the README's main command and the docs' commands."""
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q -p no:cacheprovider\n" in readme
    main = [c for c in COMMANDS if c.where.startswith("README.md") and c.complete and c.args[:1] == ("generate",)]
    assert main and "--compare-ar" in main[0].args and "\n" in main[0].args[main[0].args.index("--chat") + 1]
    in_docs = {c.where.split(":")[0] for c in COMMANDS if c.complete}
    assert len(COMMANDS) >= 40 and len(in_docs) >= 5, in_docs


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where}:{' '.join(c.args[:2])}" for c in COMMANDS])
def test_every_documented_command_parses(command: DocCommand):
    try:
        parse(command.args, command.complete)
    except USAGE_ERROR as exc:
        pytest.fail(f"{command.where}: `{command}` does not parse: {exc}")


@pytest.mark.parametrize("args, complete", [
    (["generate", "--no-such-option", "x"], True),
    (["generate", "--no-such-option", "x"], False),
    (["generate", "hi", "--batch", "many"], True),  # not an integer
    (["generate", "hello", "again"], True),  # an extra argument
    (["generate", "hello", "--temperature", "warm"], True),  # not a float
    (["profile", "--out", "prof", "--repeats", "many"], False),
    (["no-such-command"], True),
    (["models"], True),  # a group without its command
    (["models", "fetch", "smollm2-135m"], True),
    (["bench", "--no-such-flag"], True),
    (["bench", "compare", "A"], True),  # B is missing
    (["heads", "train", "--preset", "hydra"], True),  # --family is required
])
def test_a_bad_command_is_refused(args, complete):
    with pytest.raises(USAGE_ERROR):
        parse(args, complete)


@pytest.mark.parametrize("args, complete", [
    (["bench", "--workload", "humaneval:0-1", "--method", "plain=dw:proposer=none", "--out", "out"], True),
    (["bench", "compare", "A", "B", "--json"], True),
    (["models"], False),
    (["profile", "--invariance"], False),
    (["heads", "train", "--help"], True),
])
def test_a_good_command_parses(args, complete):
    parse(args, complete)


def test_the_extractor_reads_shell_forms():
    page = "\n".join([
        "Run `draftwise models list` first; `pip install draftwise[chat]` is not a command of ours.",
        "```bash",
        "bash scripts/setup.sh && .venv/bin/draftwise generate --chat $'a\\nb' --compare-ar",
        "DRAFTWISE_CACHE=/tmp/c draftwise profile \\",
        "    --target T --out prof/   # a comment",
        "draftwise proposers > keys.txt; echo done",
        "```",
        "```python",
        "draftwise.open_decoder()",
        "```",
        "```",
        "draftwise index info DIR | head",
        "```",
    ])
    found = [(c.where, c.args, c.complete) for c in commands_in(page, "p.md")]
    assert found == [
        ("p.md:3", ("generate", "--chat", "a\nb", "--compare-ar"), True),
        ("p.md:4", ("profile", "--target", "T", "--out", "prof/"), True),
        ("p.md:6", ("proposers",), True),
        ("p.md:12", ("index", "info", "DIR"), True),
        ("p.md:1", ("models", "list"), False),
    ]
