"""The docs kept true to the code: people copy README.md's, CONTRIBUTING.md's and docs/*.md's
commands and snippets, and a flag renamed in lockstep/cli or a module moved would leave them
wrong with no other test noticing.

Every `lockstep` command in a shell block (also as ``python -m lockstep`` and ``scripts/demo``) is
parsed by the real click group, down to its last subcommand, without running it; every script a
block runs exists; every Python block compiles, its imports import, and it uses no name that
neither it nor an earlier block of its page defines (pyflakes); every link stays in the
repository and reaches a file. Nothing runs: no broker, no Spark, a few seconds.
docs/benchmarks.md is a dated record whose commands used the flags of their day: only its links
are checked.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import bashlex
import click
import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token
from pyflakes.checker import Checker
from pyflakes.messages import UndefinedName

from lockstep.cli import cli
from tests.support import ROOT

HISTORY = ROOT / "docs" / "benchmarks.md"
SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
MARKDOWN = MarkdownIt("commonmark")


def documents() -> list[Path]:
    """The pages whose commands and snippets must work today (benchmarks.md is history)."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p != HISTORY)]


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Block:
    """A fenced code block: its page, the line of its first code line, its language and its text."""

    doc: str
    line: int
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} {self.lang}"


def tokens(page: Path) -> list[Token]:
    return MARKDOWN.parse(page.read_text())


def blocks(page: Path, languages: set[str]) -> list[Block]:
    return [Block(relative(page), t.map[0] + 2, t.info.split()[0], t.content) for t in tokens(page)
            if t.type == "fence" and t.map and t.info.split()[:1] and t.info.split()[0] in languages]


# --- shell blocks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One simple command of a shell block, as its words after quote removal."""

    doc: str
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        shown = " ".join(self.words)
        return f"{self.doc}:{self.line} {shown if len(shown) <= 70 else shown[:67] + '...'}"


def script(block: Block) -> str:
    """The block as a script; in a console block, the ``$ `` lines and their ``> `` continuations."""
    if block.lang != "console":
        return block.text
    kept = [line[2:] if line.startswith(("$ ", "> ")) else "" for line in block.text.splitlines()]
    return "\n".join(kept)


def commands(block: Block) -> list[Command]:
    """Every simple command of the block (those inside ``$(...)`` too), parsed by bashlex."""
    text = script(block)
    found: list[Command] = []

    class Visitor(bashlex.ast.nodevisitor):  # type: ignore[misc] - bashlex has no type hints
        def visitcommand(self, node: bashlex.ast.node, parts: list[bashlex.ast.node]) -> None:
            line = block.line + text.count("\n", 0, node.pos[0])
            found.append(Command(block.doc, line, tuple(p.word for p in parts if p.kind == "word")))

    for tree in bashlex.parse(text):
        Visitor().visit(tree)
    return found


ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
MAIN = "lockstep/__main__.py"


def program(words: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The program a command runs and its arguments, after ``VAR=value`` assignments and ``nohup``."""
    i = 0
    while i < len(words) and (ASSIGNMENT.match(words[i]) or words[i] in ("env", "nohup", "time")):
        i += 1
    return (words[i].removeprefix("./"), tuple(words[i + 1:])) if i < len(words) else ("", ())


def lockstep_arguments(words: Sequence[str]) -> tuple[str, ...] | None:
    """The arguments of ``lockstep`` if the command runs it (``scripts/demo ARGS`` is ``lockstep demo ARGS``;
    ``spark-submit ... lockstep/__main__.py ARGS`` runs ``lockstep ARGS`` in a Spark driver)."""
    name, args = program(words)
    if MAIN in args:
        return args[args.index(MAIN) + 1:]
    if name.removeprefix(".venv/bin/") == "lockstep":
        return args
    if re.fullmatch(r"(\.venv/bin/)?python3?", name) and args[:2] == ("-m", "lockstep"):
        return args[2:]
    return ("demo", *args) if name == "scripts/demo" else None


SHELL_BLOCKS = [block for page in documents() for block in blocks(page, SHELL)]
COMMANDS = [command for block in SHELL_BLOCKS for command in commands(block)]
LOCKSTEP_COMMANDS = [command for command in COMMANDS if lockstep_arguments(command.words) is not None]
SCRIPT_COMMANDS = [command for command in COMMANDS if program(command.words)[0].startswith(("scripts/", ".ci/"))]
PLACEHOLDER = re.compile(r"[<>${}]|\.\.\.|^[A-Z][A-Z0-9_]*(\.[A-Za-z]+)?$")


def parse(args: Sequence[str]) -> None:
    """Parse ``lockstep ARGS`` as click would, down to the last subcommand, invoking nothing.

    Raises click's ``UsageError`` (unknown command or option, bad value, missing argument);
    ``--help`` and ``--version`` end it as they would the command (``Exit(0)``)."""
    command: click.Command = cli
    name, parent, rest = "lockstep", None, list(args)
    while True:
        ctx = command.make_context(name, rest, parent=parent)
        if not isinstance(command, click.Group):
            return
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        resolved, sub, rest = command.resolve_command(ctx, rest)
        assert resolved is not None and sub is not None
        name, command, parent = resolved, sub, ctx


def parse_with_placeholders(args: Sequence[str]) -> None:
    """``parse``, where a placeholder (``<file>``, ``PIPELINE``, ``$FILE``) stands for a path that
    must exist: it is given an existing one of the kind the parameter wants."""
    args = list(args)
    for _ in range(len(args) + 1):
        try:
            parse(args)
            return
        except click.BadParameter as exc:
            stand_ins = [i for i, arg in enumerate(args) if PLACEHOLDER.search(arg) and repr(arg) in exc.format_message()]
            if exc.param is None or not isinstance(exc.param.type, click.Path) or not stand_ins:
                raise
            args[stand_ins[0]] = "pyproject.toml" if exc.param.type.file_okay else "docs"
    raise AssertionError(f"placeholders still refused: {args}")


# --- links ----------------------------------------------------------------------------------------


def links(page: Path) -> list[tuple[int, str]]:
    """Every link and image target of ``page``, with its line."""
    found: list[tuple[int, str]] = []
    for token in tokens(page):
        for child in token.children or ():
            target = child.attrs.get("href") or child.attrs.get("src")
            if target and token.map:
                found.append((token.map[0] + 1, str(target)))
    return found


def link_problem(page: Path, target: str) -> str | None:
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):
        return None if target.startswith(("http://", "https://", "mailto:")) else f"{target}: not a web address"
    path = target.split("#", 1)[0]
    if not path:
        return None  # an anchor on the same page
    resolved = (page.parent / path).resolve()
    if not resolved.is_relative_to(ROOT.resolve()):
        return f"{target}: points outside the repository"
    return None if resolved.exists() else f"{target}: no such file in the repository"


# --- the tests ------------------------------------------------------------------------------------


def test_the_docs_show_commands_to_check() -> None:
    """A guard for the parsers above: the README shows lockstep commands, and they are found."""
    assert any(command.doc == "README.md" for command in LOCKSTEP_COMMANDS)
    assert any(block.doc == "README.md" for page in documents() for block in blocks(page, PYTHON))


@pytest.mark.parametrize("command", LOCKSTEP_COMMANDS, ids=str)
def test_lockstep_command_parses(command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's subcommands, options, choices and arguments are the CLI's (nothing runs)."""
    monkeypatch.chdir(ROOT)  # the docs' commands run from the repository root; paths must exist
    args = lockstep_arguments(command.words)
    assert args is not None
    try:
        parse_with_placeholders(args)
    except click.exceptions.NoArgsIsHelpError:
        pass  # a bare group: it prints its subcommands
    except click.exceptions.Exit as exc:
        assert exc.exit_code == 0, f"{command}: exits {exc.exit_code}"
    except click.ClickException as exc:
        pytest.fail(f"{command.doc}:{command.line}: `{shlex.join(command.words)}`: {exc.format_message()}", pytrace=False)


@pytest.mark.parametrize("command", SCRIPT_COMMANDS, ids=str)
def test_script_exists(command: Command) -> None:
    assert (ROOT / program(command.words)[0]).is_file(), f"{command}: no such script in the repository"


@pytest.mark.parametrize("block", [b for page in documents() for b in blocks(page, PYTHON)], ids=str)
def test_python_block_compiles_imports_and_defines_its_names(block: Block) -> None:
    earlier = [b.text for b in blocks(ROOT / block.doc, PYTHON) if b.line < block.line]
    try:
        tree = ast.parse(block.text, filename=str(block))
    except SyntaxError as exc:
        pytest.fail(f"{block.doc}:{block.line + (exc.lineno or 1) - 1}: does not compile: {exc.msg}", pytrace=False)
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(block), "exec"), {})
    # the page's earlier blocks first: a page's snippets build on each other
    offset = sum(text.count("\n") + 1 for text in earlier)
    undefined = [f"{block.doc}:{block.line + m.lineno - 1 - offset}: {m.message % m.message_args}"
                 for m in Checker(ast.parse("\n".join([*earlier, block.text]))).messages
                 if isinstance(m, UndefinedName) and m.lineno > offset]
    assert not undefined, "\n".join(undefined)


@pytest.mark.parametrize("page", [*documents(), HISTORY], ids=relative)
def test_links_stay_in_the_repository(page: Path) -> None:
    problems = [f"{relative(page)}:{line}: {problem}" for line, target in links(page)
                if (problem := link_problem(page, target)) is not None]
    assert not problems, "\n".join(problems)
    assert "../shared" not in page.read_text(), f"{relative(page)} points outside the repository"
