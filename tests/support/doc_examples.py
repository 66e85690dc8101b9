"""The `invar` command lines the documents show, and a check of each against the real command tree.

Four places hold examples: lines of fenced shell blocks in README.md and docs/*.md (`invar …`, after an optional
`$ ` prompt, `\\` continuations joined, `#` comments dropped), inline code spans in their prose (`` `invar …` ``),
the header comments of the shipped declarations and configurations (contracts/*.toml, configs/*.toml), and the
Examples lists that end each command's `--help` (`invar.cli.app.EXAMPLES`, plus the root's own help).

Each is parsed by click itself, as `invar` would parse it, without running anything: the command and subcommand must
exist, every option must be one of that command's, each value must convert to its option's type (choices, integers,
numbers) and no argument may be left over. Code-block lines, comment lines and help examples must also give every
required argument; an inline span may leave arguments out (the prose names a command and the options it is talking
about) and may name an option without its value, but what it does give must parse. A synopsis's optional parts
(`[--json]`) are checked both left out and put in; one with alternatives (`--from-run RUN | --tokens FILE`) has only
its option names checked.

Placeholders stand for what the reader fills in: an upper-case word (RUN, CONTRACT, DIR) is parsed as the string it
is, except those in `PLACEHOLDERS`, which stand for a typed value and are parsed as one of that type.
"""

from __future__ import annotations

import functools
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.core
import typer.main

from invar.cli.app import EXAMPLES, app

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DECLARATIONS = [*sorted((ROOT / "contracts").glob("*.toml")), *sorted((ROOT / "configs").glob("*.toml"))]
"""The shipped declarations and configurations: their `#` comments show how each is used."""
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}

PLACEHOLDERS = {
    "ENGINE": "hf",  # `use package ENGINE`: one of the engines
    "N": "2",  # `--workers N`, `--sequential-max N`: a count
    "S": "60",  # `--call-timeout S`: seconds (`--cand-scores S` reads it as a path, which "60" also is)
    "M": "paired-binary-exact",  # `--method M`: a bound method
}
"""Placeholders that stand for a typed value, and the value each is parsed as."""

SHORT_CIRCUITS = {"--help", "--install-completion", "--show-completion"}
"""The options whose callback ends the command (and, for completion, writes to the shell's startup files): where a
line gives one, the rest need only name options that exist, and no callback is run. No other option has a callback
(`test_no_other_option_has_a_callback`), so making a context runs none of the commands' code."""

# click's exceptions, from the click typer builds on (its own copy in typer >= 0.20, click itself before).
_CLICK = sys.modules[typer.BadParameter.__module__]
_ELISIONS = {"…", "...", "options"}  # in a synopsis: more options may follow


@dataclass(frozen=True)
class DocCommand:
    """One documented command line: where it is (`docs/compare.md:15`), its text, and which kind of example."""

    where: str
    text: str
    kind: str  # "block" (a fenced shell block's line), "comment" (a TOML comment's), "inline" (a code span in prose)
    # or "help" (an Examples line of a --help)


@dataclass(frozen=True)
class Unparsed:
    """A line of a shell block that runs `invar` other than as a command line of its own (a pipeline, `$(…)`)."""

    where: str
    text: str


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _fence(line: str) -> str | None:
    """The language of a fence line (`""` for none), or None if the line is no fence."""
    m = re.match(r"\s*(```|~~~)\s*([\w+-]*)", line)
    return m.group(2).lower() if m else None


def document_commands(path: Path) -> tuple[list[DocCommand], list[Unparsed]]:
    """Every `invar` command line of one Markdown file: its shell blocks' lines and its prose's code spans."""
    commands: list[DocCommand] = []
    unparsed: list[Unparsed] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    block: str | None = None  # the open fence's language
    i = 0
    while i < len(lines):
        line, start = lines[i], i + 1
        lang = _fence(line)
        if lang is not None:
            block = lang if block is None else None
            i += 1
            continue
        if block is None:
            for m in re.finditer(r"`(invar\s[^`]*)`", line):
                commands.append(DocCommand(f"{_rel(path)}:{start}", m.group(1).replace("\\|", "|").strip(), "inline"))
            i += 1
            continue
        while line.rstrip().endswith("\\") and i + 1 < len(lines):  # a continued shell line
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        if block not in SHELL_BLOCKS:
            continue
        text = re.sub(r"^\s*\$\s+", "", line).strip()
        if text == "invar" or text.startswith("invar "):
            commands.append(DocCommand(f"{_rel(path)}:{start}", text, "block"))
        elif re.search(r"(^|[\s;|&($`])invar\s", text) and not text.startswith("#"):
            unparsed.append(Unparsed(f"{_rel(path)}:{start}", text))
    return commands, unparsed


def comment_commands(path: Path) -> list[DocCommand]:
    """The `invar` command lines of a TOML file's comments (`#   invar use prepare …`), and its comments' code spans."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        if text.startswith("invar "):
            out.append(DocCommand(f"{_rel(path)}:{n}", text, "comment"))
        else:
            out.extend(DocCommand(f"{_rel(path)}:{n}", m.group(1).strip(), "inline")
                       for m in re.finditer(r"`(invar\s[^`]*)`", text))
    return out


def help_commands() -> list[DocCommand]:
    """The Examples lists of every command's `--help`, and of `invar --help`, without their `(…)` annotations."""
    out = []
    for name, lines in EXAMPLES.items():
        out.extend(DocCommand(f"invar {name} --help", re.sub(r"\s{2,}\(.*\)$", "", line), "help") for line in lines)
    root_help = app.info.help or ""
    out.extend(DocCommand("invar --help", re.sub(r"\s{2,}\(.*\)$", "", line.strip()), "help")
               for line in root_help.splitlines() if line.strip().startswith("invar "))
    return out


def all_commands() -> tuple[list[DocCommand], list[Unparsed]]:
    commands: list[DocCommand] = []
    unparsed: list[Unparsed] = []
    for path in DOCUMENTS:
        c, u = document_commands(path)
        commands += c
        unparsed += u
    for path in DECLARATIONS:
        commands += comment_commands(path)
    return commands + help_commands(), unparsed


def argv(text: str) -> list[str]:
    """A command line's words after `invar`, as the shell would split them (comments dropped)."""
    words = shlex.split(text, comments=True)
    assert words[0] == "invar", text
    return words[1:]


def _variants(words: list[str]) -> list[list[str]]:
    """A synopsis's optional `[…]` parts all left out, and all put in (one list if it has none). An elision (`…`)
    after an option stands for its value; elsewhere it says more may follow, and is dropped."""
    without: list[str] = []
    within: list[str] = []
    depth = 0
    for word in words:
        opens, closes = len(word) - len(word.lstrip("[")), len(word) - len(word.rstrip("]"))
        bare = word.strip("[]")
        if bare in _ELISIONS and not (within and within[-1].startswith("-") and bare != "options"):
            bare = ""
        bare = PLACEHOLDERS.get(bare, bare)
        depth += opens
        if bare:
            within.append(bare)
            if depth == 0:
                without.append(bare)
        depth -= closes
    assert depth == 0, f"unbalanced [ ] in {' '.join(words)}"
    return [within] if within == without else [without, within]


@functools.cache
def _root() -> Any:
    return typer.main.get_command(app)


def _options(cmd: Any) -> dict[str, Any]:
    """Each option name of a command (`--help` included, which click adds outside `params`), with its parameter."""
    params = cmd.get_params(cmd.context_class(cmd))
    return {opt: p for p in params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}


def _short_circuits(cmd: Any, words: list[str]) -> bool:
    """Whether the words give this command one of `SHORT_CIRCUITS`. A group reads only the options before its
    subcommand's name."""
    if isinstance(cmd, typer.core.TyperGroup):
        words = words[:next((i for i, w in enumerate(words) if not w.startswith("-")), len(words))]
    return any(w in SHORT_CIRCUITS and w in _options(cmd) for w in words)


def _parse(words: list[str], *, inline: bool) -> None:
    """Parse a command line down the tree as typer's groups do, making each context and invoking nothing."""
    cmd, ctx, name = _root(), None, "invar"
    while True:
        if _short_circuits(cmd, words):
            _check_option_names(words, cmd)
            return
        try:
            ctx = cmd.make_context(name, list(words), parent=ctx)
        except _CLICK.MissingParameter:
            if not inline:
                raise
            return
        if not isinstance(cmd, typer.core.TyperGroup):
            return
        rest = [*ctx._protected_args, *ctx.args]  # what typer's own group hands its subcommand
        if not rest:
            return
        name, cmd, words = cmd.resolve_command(ctx, rest)


def check(command: DocCommand) -> None:
    """Parse one documented command as `invar` would; raise click's UsageError (or AssertionError) if it fails."""
    words = argv(command.text)
    if any(w == "|" or w.startswith("(") for w in words):
        _check_option_names(words, _root())
        return
    inline = command.kind == "inline"
    for variant in _variants(words):
        try:
            _parse(variant, inline=inline)
        except _CLICK.BadOptionUsage as exc:
            # Prose names an option without its value (`invar train --ray`): it must exist; the rest must parse.
            if not (inline and exc.option_name == variant[-1]):
                raise
            _parse(variant[:-1], inline=inline)


def _check_option_names(words: list[str], cmd: Any) -> None:
    """Every `--option` of the words is one of the command's they name, from `cmd` down its subcommands."""
    opts = _options(cmd)
    path = [cmd.name or "invar"]
    for word in words:
        word = word.strip("[]()")
        if isinstance(cmd, typer.core.TyperGroup) and word in cmd.list_commands(None):
            cmd = cmd.get_command(None, word)
            opts = _options(cmd)
            path.append(word)
        elif word.startswith("-") and word.split("=")[0] not in opts:
            raise _CLICK.NoSuchOption(word.split("=")[0], message=f"{' '.join(path)} has no option {word}")


def iter_failures(commands: list[DocCommand]) -> Iterator[tuple[DocCommand, str]]:
    """Each command that does not parse, with click's message."""
    for command in commands:
        try:
            check(command)
        except (_CLICK.ClickException, AssertionError, ValueError) as exc:
            message = exc.format_message() if isinstance(exc, _CLICK.ClickException) else str(exc)
            yield command, message


def command_path(text: str) -> tuple[str, ...]:
    """The (sub)command names a command line gives after `invar`: `("use", "plan")`, `()` for the root's options."""
    cmd: Any = _root()
    path: list[str] = []
    for word in argv(text):
        if not isinstance(cmd, typer.core.TyperGroup) or word not in cmd.list_commands(None):
            break
        cmd = cmd.get_command(None, word)
        path.append(word)
    return tuple(path)


def is_concrete(text: str, filled: frozenset[str] = frozenset()) -> bool:
    """Whether a command line can run as written: no synopsis syntax (`[…]`, `|`, `(…)`, `<…>`, elisions) and no
    upper-case placeholder (RUN, C.contract.json, OUT/receipt.json) other than those in `filled`."""
    for word in argv(text):
        if word in _ELISIONS or "…" in word or word == "|" or word[:1] in "[(<" or word[-1:] in "])>":
            return False
        for part in re.split(r"[/.=:,\s]", word):
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", part) and part not in filled:
                return False
    return True
