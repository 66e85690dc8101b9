"""Every `invar` command and sub-command with generated malformed arguments (scripts/cli_fuzz.py): each case ends
with one `invar: error:` line and exit 2 (or help for `--help`), never a traceback, within a bound, and no case
starts a worker or any other process.

The cases come from the command tree, so a new command or option is fuzzed without editing this file. The suite
runs a seeded sample of each command's cases; `python scripts/cli_fuzz.py` runs them all (the counts in
docs/operating-guide.md).
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fuzz_scale import SEED, scaled

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("invar_cli_fuzz", REPO_ROOT / "scripts" / "cli_fuzz.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["invar_cli_fuzz"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


fuzz = _load()


def _sample(ws: Any, per_command: int, combined: int) -> list[Any]:
    """Up to `per_command` single-fault cases of every command (drawn with the suite's seed), then `combined`."""
    rng = random.Random(SEED)
    by_command: dict[tuple[str, ...], list[Any]] = {}
    for case in fuzz.single_cases(ws):
        by_command.setdefault(case.command, []).append(case)
    cases = [c for group in by_command.values() for c in rng.sample(group, min(per_command, len(group)))]
    return cases + fuzz.combined_cases(ws, combined, SEED)


def _fuzz(tmp_path: Path, per_command: int, combined: int) -> None:
    ws = fuzz.make_workspace(tmp_path / "ws")
    cases = _sample(ws, per_command, combined)
    counts = fuzz.run_all(cases, ws, tmp_path / "cwd")
    assert not counts.failures, fuzz.report(counts)
    assert counts.tracebacks == counts.hangs == 0
    assert counts.cases == len(cases)
    assert counts.refusals >= 0.8 * counts.cases, fuzz.report(counts)  # malformed input is, above all, refused
    fuzzed = {" ".join(c.path) or "(invar)" for c in fuzz.commands()}
    assert set(counts.by_command) == fuzzed  # every command, the ones added since included


def test_every_command_refuses_malformed_arguments_in_one_line(tmp_path: Path) -> None:
    _fuzz(tmp_path, per_command=scaled(3), combined=scaled(10))


@pytest.mark.slow
def test_every_command_refuses_malformed_arguments_at_scale(tmp_path: Path) -> None:
    _fuzz(tmp_path, per_command=scaled(12), combined=scaled(60))


def test_the_generator_covers_every_parameter_and_kind(tmp_path: Path) -> None:
    ws = fuzz.make_workspace(tmp_path / "ws")
    cases = fuzz.single_cases(ws)
    kinds = {(c.command, c.kind) for c in cases}
    for cmd in fuzz.commands():
        assert (cmd.path, "help") in kinds
        for p in cmd.params:
            name = p.flag or p.name
            if p.required:
                assert (cmd.path, f"missing {name}") in kinds
            if p.kind == "path":
                assert {(cmd.path, f"{name} {k}") for k in fuzz.PATHS} <= kinds
    assert len(cases) == len(set(cases))
    assert fuzz.single_cases(ws) == cases  # deterministic


def test_the_harness_sees_a_traceback_a_hang_and_a_started_worker(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz can fail: what escapes main(), what runs past the bound and what would start a process are told
    apart from a refusal."""
    import time

    # `keys new` imports the receipts module when it runs: its function is the one replaced
    makes_keys = "invar.contract.receipt.new_key_pair"
    ws = fuzz.make_workspace(tmp_path / "ws")
    cwd = fuzz.make_workspace(tmp_path / "cwd").root
    case = fuzz.Case(("keys", "new"), "test", ("keys", "new", "--out", ws.path("missing")))

    def broken(*_a: Any, **_k: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(makes_keys, broken)
    outcome = fuzz.run_case(case, cwd)
    assert outcome.verdict == "traceback"
    assert "ValueError: a bug" in outcome.detail

    monkeypatch.setattr(makes_keys, lambda *_a, **_k: time.sleep(30))
    started = time.monotonic()
    assert fuzz.run_case(case, cwd, bound_s=0.5).verdict == "hang"
    assert time.monotonic() - started < 5

    monkeypatch.setattr(makes_keys, lambda *_a, **_k: subprocess.Popen(["true"]))
    outcome = fuzz.run_case(case, cwd)
    assert (outcome.verdict, outcome.detail) == ("accepted", "a process would have started")

    monkeypatch.setattr(makes_keys, lambda *_a, **_k: print("two\nlines", file=sys.stderr) or sys.exit(2))
    assert fuzz.run_case(case, cwd).verdict == "2 lines"


def test_in_process_cases_print_what_the_invar_script_prints(tmp_path: Path) -> None:
    """The in-process harness runs the `invar` script's own code path: a few cases of each kind of answer (a usage
    error, a refusal from a command, a path the system refuses, help) print the same through the real script."""
    script = Path(sys.executable).parent / "invar"
    if not script.exists():
        pytest.skip("the invar script is not installed beside this interpreter")
    ws = fuzz.make_workspace(tmp_path / "ws")
    cwd = tmp_path / "cwd"
    picked = [fuzz.Case(("infer",), "unknown option", ("infer", "1+1=", "--no-such-option")),
              fuzz.Case(("use", "plan"), "missing", ("use", "plan", ws.path("missing"), "--assume", "worse=0.01")),
              fuzz.Case(("inspect", "records"), "long-name", ("inspect", "records", ws.path("long-name"))),
              fuzz.Case(("evaluate",), "nan", ("evaluate", "--temperature", "nan")),
              fuzz.Case(("keys", "new"), "help", ("keys", "new", "--help"))]
    for case in picked:
        fuzz.make_workspace(ws.root)
        fuzz.make_workspace(cwd)
        inside = fuzz.run_case(case, cwd)
        assert inside.verdict in ("refused", "help"), (case, inside.detail)
        fuzz.make_workspace(ws.root)
        fuzz.make_workspace(cwd)
        real = subprocess.run([str(script), *case.argv], capture_output=True, text=True, timeout=120, cwd=cwd,
                              stdin=subprocess.DEVNULL)
        assert (real.returncode, real.stderr) == (inside.code, inside.stderr), case
        assert real.stdout == inside.stdout, case


@pytest.mark.parametrize(("argv", "line"), [
    (["evaluate", "--sample-seed", str(10**30)], f"--sample-seed {10**30}: must be in [0, 2^63 − 1]"),
    (["evaluate", "--max-tokens", str(10**30)], f"--max-tokens {10**30}: must be at most 2^31 − 1"),
    (["evaluate", "--batch-size", str(2**63)], f"--batch-size {2**63}: must be at most 2^31 − 1"),
    (["infer", "1+1=", "--call-timeout", "1e30"], "--call-timeout 1e+30: must be a positive number of seconds, at "
                                                  "most 604800 (a week)"),
    (["evaluate", "--population", ""], "--population .: is a folder; name the population's JSON-lines file"),
    (["use", "plan", "{missing}", "--assume", "x" * 100_000], "--assume 'xxxxxxxx"),
    (["inspect", "records", "{long-name}"], "File name too long; check this path"),
    (["use", "init", "{missing}", "--name", "a=b\nc=d"], "name: must be 1-64 characters of a-z"),
    (["use", "init", "{unicode-newline}"], "use init: name: must be 1-64 characters"),
])
def test_what_the_fuzz_found_is_one_line(tmp_path: Path, argv: list[str], line: str) -> None:
    """Each of these was a traceback (a 64-bit overflow in the records, an empty path's missing name, a path the
    system refuses, a declaration use init wrote with a newline in a comment), a hang (a quadratic pattern) or a
    worker started with a timer that overflows."""
    ws = fuzz.make_workspace(tmp_path / "ws")
    cwd = fuzz.make_workspace(tmp_path / "cwd").root
    argv = [ws.path(a[1:-1]) if a.startswith("{") else a for a in argv]
    outcome = fuzz.run_case(fuzz.Case(tuple(argv[:1]), "found", tuple(argv)), cwd, bound_s=10)
    assert outcome.verdict == "refused", (outcome.verdict, outcome.detail)
    assert line in outcome.stderr, outcome.stderr
    assert outcome.seconds < 10
