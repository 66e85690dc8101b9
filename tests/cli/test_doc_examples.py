"""Every `invar` command the documents show is checked against the command itself (docs/operating-guide.md, "How
the documents' examples are checked"): all of them parsed by click as `invar` would parse them, and those that start
no engine worker run for real, as written, in a scratch copy of the shipped files.

A documented command that names a removed option, a subcommand that no longer exists, a value its option cannot
take, or (in a code block) leaves out a required argument fails here, naming the document and line.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import typer.core
import typer.main
from support.cli_batch import Case, invar_batch
from support.doc_examples import (
    ROOT,
    SHORT_CIRCUITS,
    DocCommand,
    Unparsed,
    all_commands,
    argv,
    command_path,
    document_commands,
    is_concrete,
    iter_failures,
)

from invar.cli.app import app
from invar.engines import start_worker
from invar.records import RunStore

SKIPPED: dict[str, str] = {}
"""Lines of the documents' shell blocks that run `invar` other than as a command line of its own (a pipeline, a
`$(…)`), which the check cannot parse: `where` (file:line) → why it is left out. Kept short and current: an entry
that names no such line fails `test_skipped_lines_are_few_and_current`."""

EXECUTED: dict[tuple[str, ...], str] = {
    (): "`invar --version`: reads installed metadata only",
    ("version",): "reads installed metadata only",
    ("use", "prepare"): "checks a declaration's anchors (file digests, the model's tree digest, the worker code's "
                        "digests) and writes the contract: no worker starts",
    ("use", "plan"): "arithmetic on the contract alone",
    ("keys", "new"): "writes a key pair",
    ("inspect", "records"): "reads a run's records: run here on a run the echo worker makes at the path the "
                            "example names",
}
"""The commands whose documented examples run here for real (every example with `--help` runs too)."""

NOT_EXECUTED: dict[tuple[str, ...], str] = {
    ("infer",): "starts an engine worker (run on the shipped model by tests/cli/test_walkthrough.py, step 1)",
    ("evaluate",): "starts an engine worker (tests/cli/test_walkthrough.py, step 2; tests/cli/test_evaluate.py)",
    ("score",): "starts an engine worker (tests/compare/test_score_engine.py)",
    ("train",): "starts an engine worker and a learner (tests/runner/test_train_*.py)",
    ("use", "init"): "starts each package's worker to read its identity (tests/cli/test_use_init.py)",
    ("kernel", "check"): "starts a torch process that loads the model (tests/kernels/test_kernel_check.py)",
    ("use", "package"): "starts the engine's worker to read its identity (tests/cli/test_use_package_model.py)",
    ("use", "run"): "starts the packages' workers (tests/cli/test_walkthrough.py, steps 5-7; tests/runner/)",
    ("use", "admit"): "needs a use run's records (tests/cli/test_walkthrough.py, step 9; tests/contract/)",
    ("use", "verify"): "needs a use run and its receipt (tests/cli/test_walkthrough.py, step 10)",
    ("use", "summary"): "needs an imported contract and the exports it pins (tests/imported/test_summary.py)",
    ("compare", "numerical"): "needs the records of engine runs (tests/compare/, tests/runner/"
                              "test_use_run_measurements.py)",
    ("compare", "histories"): "needs two training runs (tests/runner/test_train_schedules.py)",
    ("inspect", "history"): "needs a training run (tests/runner/test_train_mlx.py)",
}
"""The commands whose examples are parsed only, each with what it would start and where it runs for real."""

Ran = tuple[tuple[str, ...], subprocess.CompletedProcess[str], float]  # a command's words, its outcome, seconds
FILLED = frozenset({"RUN", "HEAD"})  # an echo run the test makes, and its chain head
CONTRACTS = {"C.contract.json": "runs/w/walkthrough.contract.json"}
"""A contract placeholder of the `--help` examples, and the contract a documented `use prepare` writes for it."""


def _report(failures: list[tuple[DocCommand, str]]) -> str:
    return "\n".join(f"{c.where}: {c.text}\n    {message}" for c, message in failures)


def test_every_documented_command_parses() -> None:
    started = time.perf_counter()
    commands, _ = all_commands()
    failures = [(c, m) for c, m in iter_failures(commands) if c.where not in SKIPPED]
    print(f"measured: {len(commands)} documented commands parsed in {time.perf_counter() - started:.2f} s")
    assert not failures, "documented commands that invar does not accept:\n" + _report(failures)


def test_the_extraction_finds_every_kind_of_example() -> None:
    commands, _ = all_commands()
    by_where = {(c.where, c.kind): c.text for c in commands}
    kinds = {c.kind for c in commands}
    assert kinds == {"block", "comment", "inline", "help"}
    assert sum(c.kind == "block" for c in commands) >= 30
    assert sum(c.kind == "help" for c in commands) >= 40
    # A continued line is one command; a trailing comment is dropped when it is split.
    cont = by_where["docs/compare.md:15", "block"]
    assert cont.endswith("--report nf4.html"), cont
    assert argv(by_where["docs/contract.md:10", "block"])[-1] == "worse=0.01 better=0.01"
    assert "(the same command resumes a stopped run)" not in " ".join(c.text for c in commands)


def test_a_stale_option_or_command_fails() -> None:
    def fails(text: str, kind: str = "block") -> str:
        return next((m for _, m in iter_failures([DocCommand("t", text, kind)])), "")

    assert "No such option: --workerz" in fails("invar use run C --workerz 2")
    assert "No such command 'nosuch'" in fails("invar use nosuch C")
    assert "--workers" in fails("invar use run C --workers two")  # an int option
    assert "'gpt' is not one of" in fails('invar infer "1+1=" --engine gpt')  # a choice
    assert "Missing argument" in fails("invar use run --workers 2")
    assert "unexpected extra argument" in fails("invar use plan C --assume worse=0.01 better=0.01")
    assert "--tokenz" in fails("invar score --from-run R | --tokenz F", "inline")  # a synopsis: names only
    assert "--nope" in fails("invar use plan --help --nope")
    assert "--rayy" in fails("invar train --rayy", "inline")
    assert "--modell" in fails("invar use init OUT.toml [--modell DIR]", "inline")  # optional parts are put in
    # What prose may do: leave arguments out, name an option without its value, elide a value.
    for ok in ("invar use admit --contract C --expect-head H", "invar train --ray",
               "invar use verify OUT/r.json --run … --contract … --public-key …"):
        assert fails(ok, "inline") == "", ok
    assert fails("invar use verify --run R --contract C") != ""  # a code block gives every argument


def test_no_other_option_has_a_callback() -> None:
    """Parsing makes each command's context, which runs option callbacks: only the short-circuits have one, and the
    check never lets them run (`--install-completion` would write to the shell's startup files)."""
    root = typer.main.get_command(app)
    seen: set[str] = set()

    def walk(cmd: typer.core.TyperCommand | typer.core.TyperGroup) -> None:
        for p in cmd.get_params(cmd.context_class(cmd)):
            if p.callback is not None:
                seen.update(o for o in p.opts if o.startswith("-"))
        if isinstance(cmd, typer.core.TyperGroup):
            for name in cmd.list_commands(cmd.context_class(cmd)):
                walk(cmd.get_command(cmd.context_class(cmd), name))

    walk(root)
    assert seen == SHORT_CIRCUITS


def test_a_pipeline_is_reported_not_parsed(tmp_path: Path) -> None:
    doc = tmp_path / "probe.md"
    doc.write_text("```bash\nhead=$(invar inspect records RUN --json | jq -r .chain_head)\n$ invar keys new \\\n"
                   "  --json   # a comment\n```\n```toml\nx = \"invar use run\"\n```\n"
                   "Prose with `invar keys new --out DIR`.\n", encoding="utf-8")
    commands, unparsed = document_commands(doc)
    assert [(c.where, c.kind, argv(c.text)) for c in commands] == [
        ("probe.md:3", "block", ["keys", "new", "--json"]), ("probe.md:9", "inline", ["keys", "new", "--out", "DIR"])]
    assert unparsed == [Unparsed("probe.md:2",
                                 "head=$(invar inspect records RUN --json | jq -r .chain_head)")]


def test_skipped_lines_are_few_and_current() -> None:
    _, unparsed = all_commands()
    unlisted = [u for u in unparsed if u.where not in SKIPPED]
    assert not unlisted, "lines that run invar but are no command line of their own: give each a reason in " \
        "SKIPPED or write it as one:\n" + "\n".join(f"{u.where}: {u.text}" for u in unlisted)
    assert len(SKIPPED) <= 5
    current = {u.where for u in unparsed} | {c.where for c, _ in iter_failures(all_commands()[0])}
    stale = sorted(set(SKIPPED) - current)
    assert not stale, f"SKIPPED names lines that are gone or that now parse: {stale}"


def test_every_documented_command_is_executed_or_says_why_not() -> None:
    commands, _ = all_commands()
    paths = {command_path(c.text) for c in commands} - {("use",), ("inspect",), ("keys",), ("compare",)}
    unlisted = paths - set(EXECUTED) - set(NOT_EXECUTED)
    assert not unlisted, f"documented commands neither in EXECUTED nor in NOT_EXECUTED: {sorted(unlisted)}"
    assert not set(EXECUTED) & set(NOT_EXECUTED)
    assert set(NOT_EXECUTED) <= paths, f"NOT_EXECUTED names commands no document shows: " \
        f"{sorted(set(NOT_EXECUTED) - paths)}"


def _runnable(commands: list[DocCommand]) -> dict[tuple[str, ...], list[DocCommand]]:
    """The documented command lines that run here, each once (by its words), with every place that shows it."""
    out: dict[tuple[str, ...], list[DocCommand]] = {}
    for c in commands:
        words = [CONTRACTS.get(w, w) for w in argv(c.text)]
        text = shlex.join(["invar", *words])
        if (set(words) & (SHORT_CIRCUITS - {"--help"}) or not is_concrete(text, FILLED)
                or not ("--help" in words or command_path(text) in EXECUTED)):
            continue
        if any(iter_failures([DocCommand(c.where, text, "block")])):
            continue  # an inline span that is no whole command is only parsed (by the test above)
        out.setdefault(tuple(words), []).append(c)
    return out


def _workspace(folder: Path) -> Path:
    """A folder laid out like the checkout for what the examples read: the declarations copied (`use prepare`
    writes its contract beside them), the data, models, patches and configurations they name linked."""
    folder.mkdir(parents=True)
    shutil.copytree(ROOT / "contracts", folder / "contracts")
    for name in ("data", "models", "patches", "configs", "examples"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def _echo_run(run: Path) -> str:
    """A closed run of three echo calls at `run`; its chain head."""
    run.parent.mkdir(parents=True, exist_ok=True)
    store = RunStore.create(run, meta={"purpose": "documented inspect records example"})
    with start_worker("echo", recorder=store) as w:
        for i in range(3):
            w.call("echo", {"i": i})
    head = store.close_run()
    store.close()
    return head


def _args(words: tuple[str, ...], cwd: Path) -> list[str]:
    """The command line of a documented example as run in `cwd`: an `inspect records` example gets an echo run at
    the path it names (RUN and HEAD filled in)."""
    args = list(words)
    if command_path("invar " + " ".join(words)) == ("inspect", "records"):
        run = "runs/echo" if "RUN" in args else args[2]
        head = _echo_run(cwd / run)
        args = [{"RUN": run, "HEAD": head}.get(a, a) for a in args]
    return args


def _run(examples: list[tuple[tuple[str, ...], Path]]) -> list[Ran]:
    """Each example run in its folder, in order, through one process (tests/support/cli_batch.py: each as
    `python -m invar.cli` runs it, with its own exit status, stdout and stderr), so the examples pay the CLI's
    start-up once instead of once each."""
    cases = [Case(_args(words, cwd), cwd) for words, cwd in examples]
    done = invar_batch(cases, bound_s=300)
    return [(words, subprocess.CompletedProcess(out.args, out.returncode, out.stdout, out.stderr), out.seconds)
            for (words, _), out in zip(examples, done, strict=True)]


@pytest.mark.slow
def test_the_examples_that_start_no_worker_run_as_written(tmp_path: Path) -> None:
    """Prepares first, in one copy of the shipped files (each declaration's commands in order), so that the plans
    read the contracts they wrote; then every other example in a copy of its own (`keys new` never overwrites)."""
    started = time.perf_counter()
    runnable = _runnable(all_commands()[0])
    prepared = _workspace(tmp_path / "prepared")
    by_declaration: dict[str, list[tuple[str, ...]]] = {}
    for words in runnable:
        if command_path("invar " + " ".join(words)) == ("use", "prepare") and "--help" not in words:
            by_declaration.setdefault(words[2], []).append(words)
    results = _run([(words, prepared) for group in by_declaration.values() for words in group])
    first = {words for group in by_declaration.values() for words in group}
    rest = [words for words in runnable if words not in first]
    elsewhere = []
    for n, words in enumerate(rest):
        folder = tmp_path / f"run-{n}"
        shutil.copytree(prepared, folder, symlinks=True)
        elsewhere.append((words, folder))
    results += _run(elsewhere)
    failed = []
    for words, out, seconds in results:
        shown = ", ".join(c.where for c in runnable[words])
        print(f"ran in {seconds:.1f} s: invar {' '.join(words)}   ({shown})")
        if out.returncode != 0:
            failed.append(f"{shown}: invar {' '.join(words)}\n    exit {out.returncode}: {out.stderr.strip()[-600:]}")
        elif "--json" in words:
            json.loads(out.stdout)
    print(f"measured: {len(results)} documented commands run in {time.perf_counter() - started:.1f} s")
    assert not failed, "documented commands that fail when run as written:\n" + "\n".join(failed)
    assert len(results) == len(runnable)
    assert {("use", "prepare"), ("use", "plan"), ("keys", "new"), ("inspect", "records")} <= {
        command_path("invar " + " ".join(w)) for w in runnable}
