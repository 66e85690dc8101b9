"""Fuzz every `invar` command with malformed arguments, in this process, and count the outcomes.

The cases are generated from the command tree itself (each command's declared arguments and options), so a new
command or option is fuzzed without editing this file: missing required arguments, unknown options and stray
arguments, and for each parameter hostile values of its kind (paths that do not exist, folders, empty, binary and
over-long names, a FIFO, /dev/zero; numbers that are huge, negative, NaN or not numbers; text with unicode,
newlines and escapes; choices that are not offered). Each case runs through `invar.cli.app.main`, the function the
`invar` script calls, with stdout and stderr captured and a time bound. Starting a process of any kind (an engine
worker above all) or opening a network connection is stopped and counted: a malformed command line never gets
that far.

Usage: python scripts/cli_fuzz.py [--combined N] [--seed S]   (prints the counts; exit 1 if any case failed)
The suite (tests/fuzz/test_fuzz_cli.py) runs the same generator at a smaller size.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BOUND_S = 20.0
"""No case may take this long: every one is refused from its command line and a few small files."""

# -- hostile values, by the kind of parameter -----------------------------------------------------------------------

INTS = ("abc", "", "nan", "inf", "-1", "1.5", str(10**30), str(2**63), str(-(2**63) - 1), "1e3", "٣", " 7 ")
FLOATS = ("nan", "inf", "-inf", "-1", "1e309", str(10**30), "abc", "", "0x1p3", "1_0", "-0")
TEXTS = ("", "é\n中文", "\n", "x" * 100_000, "--", "-", "\x1b[31mred", "a=b\nc=d", "\u202e\u200b", "=", "a" * 300)
CHOICES = ("nosuch", "", "HF", "é\n", "hf ")
PATHS = ("missing", "directory", "empty", "binary", "fifo", "dev-zero", "dev-null", "through-file", "unicode-newline",
         "empty-string", "long-name", "text", "huge-line")


@dataclass(frozen=True)
class Workspace:
    """A folder holding one file or folder of each hostile kind a path can name."""

    root: Path

    def path(self, kind: str) -> str:
        special = {"dev-zero": "/dev/zero", "dev-null": "/dev/null", "empty-string": "",
                   "through-file": str(self.root / "binary" / "inside"),
                   "unicode-newline": str(self.root / "é\n中 name"), "long-name": str(self.root / ("n" * 300))}
        return special.get(kind, str(self.root / kind))


def make_workspace(root: Path) -> Workspace:
    """The workspace, made afresh (each case starts from it: one case's run or key never meets the next case)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "directory").mkdir(exist_ok=True)
    (root / "empty").write_bytes(b"")
    (root / "binary").write_bytes(bytes(range(256)) * 16 + b"\xff\xfe\x00")
    (root / "text").write_text("not what any command reads\n{\n", encoding="utf-8")
    (root / "huge-line").write_bytes(b"{" * 200_000)
    os.mkfifo(root / "fifo")
    return Workspace(root)


# -- the command tree -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    flag: str | None
    """The option's first name (`--seed`); None for an argument."""
    kind: str
    """path, int, float, text, choice or flag."""
    required: bool
    many: bool
    """Takes several values (an argument of nargs -1, or an option given more than once)."""
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    params: tuple[Param, ...]
    group: bool = False


def _kind(param: Any) -> tuple[str, tuple[str, ...]]:
    import enum
    import pathlib
    import typing

    if getattr(param, "is_flag", False):
        return "flag", ()
    annotation = param.type_descriptor.annotation
    if typing.get_origin(annotation) is list:
        (annotation,) = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "choice", tuple(str(m.value) for m in annotation)
    if annotation is bool:
        return "flag", ()
    if annotation is int:
        return "int", ()
    if annotation is float:
        return "float", ()
    if isinstance(annotation, type) and issubclass(annotation, pathlib.PurePath):
        return "path", ()
    return "text", ()


def commands() -> list[Command]:
    """Every command and group of `invar`, from its command tree (groups load their commands as they are named)."""
    import typer

    from invar.cli.app import app

    root = typer.main.get_command(app)
    found: list[Command] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        ctx = cmd.context_class(cmd, info_name=path[-1] if path else "invar")
        params = []
        for p in cmd.params:
            if p.hidden or p.name in ("install_completion", "show_completion", "help"):
                continue
            kind, choices = _kind(p)
            flag = p.opts[0] if p.param_type_name == "option" else None
            params.append(Param(p.name, flag, kind, bool(p.required), p.nargs == -1 or bool(p.multiple), choices))
        is_group = hasattr(cmd, "list_commands")
        found.append(Command(path, tuple(params), group=is_group))
        if is_group:
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), (*path, name))

    walk(root, ())
    return found


# -- cases ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    command: tuple[str, ...]
    kind: str
    """What is malformed: `missing <param>`, `<param> <kind>`, `unknown option`, …; `help` for --help."""
    argv: tuple[str, ...]


def _base_value(p: Param, ws: Workspace) -> list[str]:
    """A value of the right shape for a required parameter the case does not fuzz (a path that does not exist:
    every case stays one the command must refuse, whichever check comes first)."""
    if p.kind == "path":
        value = ws.path("missing")
    elif p.kind == "choice":
        value = p.choices[0]
    elif p.name == "assume":
        value = "worse=0.01 better=0.01"
    else:
        value = "1+1="
    return [value] if p.flag is None else [p.flag, value]


def _hostile(p: Param, ws: Workspace) -> list[tuple[str, str]]:
    """(label, value) of every hostile value for a parameter of this kind."""
    if p.kind == "path":
        return [(k, ws.path(k)) for k in PATHS]
    values = {"int": INTS, "float": FLOATS, "choice": CHOICES, "text": TEXTS}.get(p.kind, ())
    return [(repr(v) if len(v) < 40 else f"{len(v)} × {v[0]!r}", v) for v in values]


def _argv(cmd: Command, ws: Workspace, fuzzed: dict[str, str], omit: frozenset[str] = frozenset()) -> list[str]:
    args: list[str] = list(cmd.path)
    for p in cmd.params:
        if p.name in fuzzed:
            args += [fuzzed[p.name]] if p.flag is None else [p.flag, fuzzed[p.name]]
        elif p.required and p.name not in omit:
            args += _base_value(p, ws)
    return args


def single_cases(ws: Workspace) -> list[Case]:
    """Every command once per way of being malformed: one fault a case, each parameter with each hostile value."""
    cases: list[Case] = []
    for cmd in commands():
        name = cmd.path
        cases.append(Case(name, "help", (*name, "--help")))
        if cmd.group:
            cases.append(Case(name, "no command", name))
            cases.append(Case(name, "unknown command", (*name, "no-such-command")))
            cases.append(Case(name, "unknown command (unicode)", (*name, "é\n中")))
            if name:
                continue
        base = _argv(cmd, ws, {})
        cases.append(Case(name, "unknown option", (*base, "--no-such-option")))
        cases.append(Case(name, "unknown short option", (*base, "-Z")))
        cases.append(Case(name, "unknown option (unicode)", (*base, "--é\n")))
        if not any(p.flag is None and p.many for p in cmd.params):
            cases.append(Case(name, "stray argument", (*base, "stray")))
        for p in cmd.params:
            if p.required:
                cases.append(Case(name, f"missing {p.flag or p.name}", tuple(_argv(cmd, ws, {}, frozenset({p.name})))))
            if p.kind == "flag":
                if p.flag is not None:
                    cases.append(Case(name, f"{p.flag} given a value", (*base, f"{p.flag}=yes")))
                continue
            if p.flag is not None:
                cases.append(Case(name, f"{p.flag} without its value", (*base, p.flag)))
            for label, value in _hostile(p, ws):
                cases.append(Case(name, f"{p.flag or p.name} {label}", tuple(_argv(cmd, ws, {p.name: value}))))
    return cases


def combined_cases(ws: Workspace, count: int, seed: int) -> list[Case]:
    """`count` cases each with two to four parameters hostile at once, drawn with `seed`."""
    rng = random.Random(seed)
    fuzzable = [c for c in commands() if not c.group and any(p.kind != "flag" for p in c.params)]
    cases: list[Case] = []
    for _ in range(count):
        cmd = rng.choice(fuzzable)
        params = [p for p in cmd.params if p.kind != "flag"]
        chosen = rng.sample(params, min(len(params), rng.randint(2, 4)))
        fuzzed = {p.name: rng.choice(_hostile(p, ws))[1] for p in chosen}
        argv = _argv(cmd, ws, fuzzed)
        flags = [p.flag for p in cmd.params if p.kind == "flag" and p.flag is not None and p.flag != "--help"]
        argv += [f for f in flags if rng.random() < 0.3]
        cases.append(Case(cmd.path, "combined: " + ", ".join(p.flag or p.name for p in chosen), tuple(argv)))
    return cases


# -- running a case in this process ---------------------------------------------------------------------------------


class _Hang(BaseException):
    """The case ran past its bound (raised from the alarm, in the main thread)."""


class _Started(BaseException):
    """The case would have started a process or opened a connection (stopped: no worker starts in the fuzz). A
    BaseException, so no `except Exception` in a command swallows it."""


@dataclass
class Outcome:
    case: Case
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    verdict: str
    """refused, help, accepted, or what went wrong: traceback, hang, exit N, N lines, not an invar error."""
    detail: str = ""


def _no_process(*_a: Any, **_k: Any) -> Any:
    raise _Started("a process would have started")


def _no_connection(*_a: Any, **_k: Any) -> Any:
    raise _Started("a network connection would have been opened")


@contextlib.contextmanager
def _captured(into: dict[str, str]) -> Iterator[None]:
    """stdin empty; stdout and stderr into `into` (as text) when the block ends."""
    out, err = io.BytesIO(), io.BytesIO()
    saved = sys.stdin, sys.stdout, sys.stderr, sys.argv
    saved_main = sys.modules["__main__"]
    # As the `invar` script runs: its __main__ is a plain script, so the program is named from argv[0] (`invar`).
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # Read before the wrappers go: closing one closes its buffer.
        into["stdout"] = out.getvalue().decode("utf-8", "backslashreplace")
        into["stderr"] = err.getvalue().decode("utf-8", "backslashreplace")
        sys.stdin, sys.stdout, sys.stderr, sys.argv = saved
        sys.modules["__main__"] = saved_main


@contextlib.contextmanager
def _guarded(bound_s: float) -> Iterator[None]:
    """No process, no connection, and an alarm at `bound_s`."""
    def alarm(_signum: int, _frame: Any) -> None:
        raise _Hang

    saved = subprocess.Popen.__init__, os.fork, os.execv, socket.create_connection, socket.socket.connect
    subprocess.Popen.__init__ = _no_process  # type: ignore[method-assign]
    os.fork = _no_process
    os.execv = _no_process
    socket.create_connection = _no_connection
    socket.socket.connect = _no_connection  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, bound_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        subprocess.Popen.__init__ = saved[0]  # type: ignore[method-assign]
        os.fork, os.execv, socket.create_connection = saved[1:4]
        socket.socket.connect = saved[4]  # type: ignore[method-assign]


def judge(case: Case, code: int | None, stdout: str, stderr: str) -> tuple[str, str]:
    """The verdict on what a case printed and its exit status."""
    if "Traceback" in stdout or "Traceback" in stderr:
        return "traceback", stderr[-2000:]
    if case.kind == "help":
        ok = code == 0 and stdout.lstrip().startswith("Usage:") and not stderr
        return ("help", "") if ok else (f"help exit {code}", stderr[-500:])
    if case.kind == "no command":
        # A family named alone prints its help, as git does: the list of its commands is the answer.
        ok = code == 2 and "Usage:" in stdout + stderr
        return ("help", "") if ok else (f"no-command exit {code}", (stdout + stderr)[-500:])
    if code == 0:
        # The values were taken as given (a new key's folder, an empty prompt): an answer, not a failure.
        return "accepted", ""
    if code != 2:
        return f"exit {code}", (stdout + stderr)[-500:]
    lines = stderr.splitlines()
    if len(lines) != 1:
        return f"{len(lines)} lines", stderr[-1000:]
    if not lines[0].startswith("invar: error: "):
        return "not an invar error", lines[0][:500]
    return "refused", ""


def run_case(case: Case, cwd: Path, bound_s: float = BOUND_S) -> Outcome:
    """One case through `invar.cli.app.main`, as the `invar` script runs it."""
    from invar.cli.app import main

    code: int | None = None
    verdict = ""
    detail = ""
    started = time.monotonic()
    here = Path.cwd()
    printed: dict[str, str] = {}
    os.chdir(cwd)
    try:
        with _captured(printed):
            sys.argv = ["invar", *case.argv]
            try:
                with _guarded(bound_s):
                    main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except _Hang:
                verdict, detail = "hang", f"over {bound_s} s"
            except _Started as exc:
                # Every value was taken (a prompt may hold any text, a run folder may be new): the command got as
                # far as starting its worker, which the guard stopped.
                verdict, detail = "accepted", str(exc)
            except BaseException as exc:  # anything else escaping main() is a traceback for the user
                import traceback

                verdict, detail = "traceback", "".join(traceback.format_exception(exc))[-2000:]
    finally:
        os.chdir(here)
    stdout, stderr = printed["stdout"], printed["stderr"]
    if not verdict:
        verdict, detail = judge(case, code, stdout, stderr)
    return Outcome(case, code, stdout, stderr, time.monotonic() - started, verdict, detail)


@dataclass
class Counts:
    cases: int = 0
    refusals: int = 0
    helps: int = 0
    tracebacks: int = 0
    hangs: int = 0
    accepted: int = 0
    other: int = 0
    slowest_s: float = 0.0
    seconds: float = 0.0
    by_command: dict[str, collections.Counter[str]] = field(default_factory=dict)
    failures: list[Outcome] = field(default_factory=list)
    taken: list[Outcome] = field(default_factory=list)

    def add(self, o: Outcome) -> None:
        self.cases += 1
        self.slowest_s = max(self.slowest_s, o.seconds)
        self.seconds += o.seconds
        name = " ".join(o.case.command) or "(invar)"
        self.by_command.setdefault(name, collections.Counter())[o.verdict] += 1
        if o.verdict == "refused":
            self.refusals += 1
        elif o.verdict == "help":
            self.helps += 1
        elif o.verdict == "accepted":
            self.accepted += 1
            self.taken.append(o)
        else:
            if o.verdict == "traceback":
                self.tracebacks += 1
            elif o.verdict == "hang":
                self.hangs += 1
            else:
                self.other += 1
            self.failures.append(o)


def run_all(cases: list[Case], ws: Workspace, cwd: Path, bound_s: float = BOUND_S) -> Counts:
    counts = Counts()
    for case in cases:
        make_workspace(ws.root)
        make_workspace(cwd)
        outcome = run_case(case, cwd, bound_s)
        counts.add(outcome)
        if os.environ.get("INVAR_CLI_FUZZ_TRACE"):
            print(f"{outcome.seconds:6.2f} {outcome.verdict:10} {' '.join(case.command)} | {case.kind}",
                  file=sys.__stderr__)
    return counts


def report(counts: Counts) -> str:
    rows = [f"cases {counts.cases}, refusals {counts.refusals}, help {counts.helps}, tracebacks {counts.tracebacks}, "
            f"hangs {counts.hangs}, accepted {counts.accepted} (no process started), other failures {counts.other}; "
            f"{counts.seconds:.1f} s in all, slowest case {counts.slowest_s:.2f} s",
            "", "| command | cases | refusals | help | accepted | failures |", "|---|---|---|---|---|---|"]
    for name, c in sorted(counts.by_command.items()):
        failed = sum(n for v, n in c.items() if v not in ("refused", "help", "accepted"))
        rows.append(f"| `{name}` | {sum(c.values())} | {c['refused']} | {c['help']} | {c['accepted']} | {failed} |")
    kinds = collections.Counter(f"{' '.join(o.case.command)}: {o.case.kind}" for o in counts.taken)
    if kinds:
        rows.append("")
        rows.append("accepted (exit 0, or as far as starting a worker): " + "; ".join(
            f"{k}" + (f" ×{n}" if n > 1 else "") for k, n in sorted(kinds.items())))
    for o in counts.failures[:100]:
        argv = " ".join(repr(a) if len(a) < 80 else repr(a[:40] + "…") for a in o.case.argv)
        last = ([line for line in o.detail.splitlines() if line.strip()] or [""])[-1][:300]
        rows.append(f"FAILED {o.verdict} ({o.seconds:.1f} s): invar {argv} ({o.case.kind}): {last}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--combined", type=int, default=2000, help="cases with several hostile parameters")
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="invar-cli-fuzz-") as tmp:
        ws = make_workspace(Path(tmp) / "ws")
        cases = single_cases(ws) + combined_cases(ws, args.combined, args.seed)
        counts = run_all(cases, ws, Path(tmp) / "cwd")
    print(report(counts))
    return 1 if counts.failures else 0


if __name__ == "__main__":
    sys.exit(main())
