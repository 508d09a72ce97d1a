"""The docs kept true to the code: people copy README.md's, CONTRIBUTING.md's and docs/*.md's
commands and snippets, and a flag renamed in lockstep/cli or a module moved would leave them
wrong with no other test noticing.

Every `lockstep` command in a shell block (also as ``python -m lockstep`` and ``scripts/demo``) is
parsed by the real click group, down to its last subcommand, without running it; every script a
block runs exists; every ``python -m bench.NAME`` command names a bench and only options its
parser defines (read from its source: a bench imports Spark); every Python block compiles, its
imports import, and it uses no name that neither it nor an earlier block of its page defines
(pyflakes); every link stays in the repository and reaches a file. The pages are README.md,
CONTRIBUTING.md and everything under docs/ (docs/decisions/ too). Nothing runs: no broker, no
Spark, a few seconds.
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

SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
MARKDOWN = MarkdownIt("commonmark")


def documents() -> list[Path]:
    """The pages whose commands and snippets must work today: the README, CONTRIBUTING.md and docs/."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


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


def bench_arguments(words: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """The bench a command runs (``python -m bench.nexmark ...``: ``nexmark``) and its arguments, else None."""
    name, args = program(words)
    if re.fullmatch(r"(\.venv/bin/)?python3?", name) and args[:1] == ("-m",) and args[1:2] and args[1].startswith("bench."):
        return args[1].removeprefix("bench."), args[2:]
    return None


BENCH_COMMANDS = [command for command in COMMANDS if bench_arguments(command.words) is not None]
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


def bench_parser(module: str) -> tuple[set[str], set[str] | None]:
    """The options a bench's parser defines (its own ``add_argument`` calls and those of the
    functions it imports from other benches, such as ``bench.results.add_json_flag``), and the
    choices of its first positional argument if it has one (``bench.spark_jobs``' ``which``)."""
    tree = ast.parse((ROOT / "bench" / f"{module}.py").read_text())
    options, choices = _added(tree, positional_of="parser")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
            imported = ast.parse((ROOT / Path(*node.module.split("."))).with_suffix(".py").read_text())
            names = {alias.name for alias in node.names}
            options |= {option for function in imported.body if isinstance(function, ast.FunctionDef)
                        and function.name in names for option in _added(function)[0]}
    return options, choices


def _added(tree: ast.AST, positional_of: str | None = None) -> tuple[set[str], set[str] | None]:
    """The option strings of every ``add_argument`` call under ``tree``, and the literal choices of
    a positional argument added to the parser named ``positional_of``."""
    options: set[str] = set()
    choices: set[str] | None = None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        options |= {name for name in names if name.startswith("-")}
        listed = [kw.value for kw in node.keywords if kw.arg == "choices" and isinstance(kw.value, ast.List)]
        on_parser = isinstance(node.func.value, ast.Name) and node.func.value.id == positional_of
        if on_parser and names and not names[0].startswith("-") and listed:
            choices = {e.value for e in listed[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return options, choices


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


@pytest.mark.parametrize("command", BENCH_COMMANDS, ids=str)
def test_bench_command_uses_what_its_bench_defines(command: Command) -> None:
    """A bench command names a bench of bench/, its subcommand is one of the bench's, and every
    ``--option`` is one its parser defines (nothing runs: a bench starts brokers and Spark)."""
    found = bench_arguments(command.words)
    assert found is not None
    module, args = found
    assert (ROOT / "bench" / f"{module}.py").is_file(), f"{command}: no bench/{module}.py"
    options, choices = bench_parser(module)
    if choices is not None:
        assert args[:1] and args[0] in choices, f"{command}: the bench's first argument is one of {sorted(choices)}"
    unknown = [arg.split("=", 1)[0] for arg in args if arg.startswith("--") and arg.split("=", 1)[0] not in options]
    assert not unknown, f"{command}: bench/{module}.py defines no {', '.join(unknown)}"


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


@pytest.mark.parametrize("page", documents(), ids=relative)
def test_links_stay_in_the_repository(page: Path) -> None:
    problems = [f"{relative(page)}:{line}: {problem}" for line, target in links(page)
                if (problem := link_problem(page, target)) is not None]
    assert not problems, "\n".join(problems)
    # a path named in the text, not only a link's: nothing the page mentions lies above the repository
    above = [m.group(0) for m in re.finditer(r"(?<![\w./])(?:\.\./)+[\w.-]+", page.read_text())
             if not (page.parent / m.group(0)).resolve().is_relative_to(ROOT.resolve())]
    assert not above, f"{relative(page)} names paths outside the repository: {', '.join(above)}"
