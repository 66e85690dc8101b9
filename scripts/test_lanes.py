"""Run the whole test suite as two pytest sessions side by side, the way `make test` does.

    python scripts/test_lanes.py [PYTEST ARGS...]

The first lane holds the paths of `FIRST_LANE`: the tests that compute in their own process alone (statistics,
contracts, records), the engine workers' own tests and the real model's, and some of the runners' tests; the second
lane holds the rest (the protocol's frames, the loop's arithmetic, the other runners' tests, the command line,
fuzzing, comparisons, benchmarks, patches, the cluster). The two take about as long. A test that starts an
engine spends much of its wall time on one core (a worker's imports, its start-up, the model load, Python between
calls), so the other lane uses the other core instead of waiting. Session fixtures are defined per folder
(tests/workers/conftest.py, tests/models/conftest.py, ...), and the tests that ask for one are in one lane, so every
engine start or model build a session fixture makes is made once, as in a single session.

Most of a test's engine start is importing torch and transformers, or mlx and mlx-lm (about 5 s of CPU each time,
and the suite starts some 170 such workers). The lanes share one fork server per engine for that
(`invar.transport.forkserver`, named to every command by `INVAR_FORKSERVER`): it imports the engine once and forks
each worker from it, with the core's modules read afresh from the files; a worker whose environment a fresh process
would see differently starts as a fresh process, as without the server. At the end the servers' counts are printed:
how many workers each forked, why any were refused, and the test files that asked for most (each fork's log line
names its test, `forkserver.FORKED_FOR`).

The second lane prints as it goes; the first lane's output follows it, whole. The exit status is the first non-zero
of the two (pytest's own codes), so a failure in either fails the suite. Extra arguments go to both sessions.
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from invar import engines
from invar.transport import forkserver

ROOT = Path(__file__).resolve().parents[1]
FIRST_LANE = ("contract", "records", "stats", "tasks", "typing", "models", "workers",
              "runner/test_use_run.py", "runner/test_sequential_run.py",
              "runner/test_train_mlx.py", "bench/test_commands.py", "cli/test_doc_examples.py", "architectures")
"""Paths under tests/ (folders, or files of a folder the lanes share) run in the first lane, chosen by a whole-suite
`--durations` run (`scripts/lane_durations.py`) so that both lanes take about as long. A folder's session fixtures
stay in one lane: every file moved here from a folder the lanes share asks for none of its folder's session fixtures
(tests/runner's Ray cluster is asked for only by its Ray files, all in the other lane). Which files moved when, and the
durations behind each move, are in docs/testing.md ("How the lanes were chosen")."""

FORKED = ("hf", "mlx", "vllm")
"""The engines whose workers the lanes fork from a server: HF and MLX, whose imports are most of a start, and vLLM,
whose import is a quarter of an `evaluate` of 24 units on the tiny model (forked 21 and 20 CPU-s against 28 and 29
fresh, 2026-12-04). Two `--durations` runs of the same suite that day: 2,096 s wall and 3,644 CPU-s with vLLM forked,
2,205 s and 3,837 CPU-s without."""


TOP_FILES = 8
"""How many test files each fork server's count is broken down by at the end (those that asked for most workers)."""


def start_fork_servers(folder: Path) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    folder.mkdir()
    servers = []
    for engine in FORKED:
        module, log = engines.ENGINES[engine], folder / f"{engine}.log"
        with log.open("wb") as out:
            servers.append((engine, forkserver.start(folder, module, engines.worker_env(None, engine), out), log))
    return servers


def stop_fork_servers(servers: list[tuple[str, subprocess.Popen[bytes], Path]]) -> None:
    for _, proc, _ in servers:
        proc.send_signal(signal.SIGTERM)
    for engine, proc, log in servers:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        reasons = Counter(line.split(": ", 2)[-1] for line in lines if " refused a " in line)
        last = next((line for line in reversed(lines) if "stopped;" in line), f"exit {proc.returncode}, no count")
        print(f"test lanes: the {engine} fork server {last.split(': ', 1)[-1]}", flush=True)
        for why, n in reasons.most_common():
            print(f"  {n} × {why}", flush=True)
        for path, n in forked_per_file(lines).most_common(TOP_FILES):
            print(f"  {n} forked for {path}", flush=True)


def forked_for(log_lines: list[str]) -> dict[int, str]:
    """The workers a fork server's log says it forked for a test: pid → the test that asked (`forkserver.forked`)."""
    return {pid: test for pid, test in forkserver.forked(log_lines).items() if test}


def forked_per_file(log_lines: list[str]) -> Counter[str]:
    """The workers a fork server's log says it forked, per test file that asked."""
    return Counter(test.partition("::")[0] for test in forked_for(log_lines).values())


def _collected(folder: Path) -> list[Path]:
    """The entries of `folder` pytest collects: test files and folders of tests (not the tests' helper modules)."""
    return [p for p in sorted(folder.iterdir()) if (p.name.startswith("test_") and p.suffix == ".py")
            or (p.is_dir() and p.name not in ("support", "__pycache__") and not p.name.startswith("."))]


def others(chosen: tuple[str, ...], folder: Path | None = None) -> list[str]:
    """The paths under tests/ outside `chosen` (paths relative to tests/), fewest first: a folder with nothing of
    `chosen` in it whole, a folder that holds some of it entry by entry."""
    folder = folder or ROOT / "tests"
    left = []
    for entry in _collected(folder):
        rel = entry.relative_to(ROOT / "tests").as_posix()
        if rel in chosen:
            continue
        if entry.is_dir() and any(c.startswith(rel + "/") for c in chosen):
            left += others(chosen, entry)
        else:
            left.append(f"tests/{rel}")
    return left


KEEP_LOGS = "--keep-forkserver-logs"
"""`--keep-forkserver-logs DIR`: copy the fork servers' logs (which worker each forked, for which test) into DIR when
the lanes end; scripts/suite_cpu.py reads them. Every other argument goes to both sessions."""


def main(argv: list[str]) -> int:
    keep = None
    if KEEP_LOGS in argv:
        at = argv.index(KEEP_LOGS)
        keep, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    pytest = [sys.executable, "-m", "pytest"]
    first = [f"tests/{name}" for name in FIRST_LANE]
    # Both sessions collect tests/ and leave out the other's part, so each collects in the order one session would
    # (the test folders' conftest modules share a name, and `from conftest import` finds the one collected first).
    second = others(FIRST_LANE)
    # This interpreter's folder first on PATH, for the servers and both sessions: the tests that run `invar` from a
    # shell script put it first (tests/support/venv_path.py), and a worker whose PATH differs would not be forked.
    folder = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != folder:
        os.environ["PATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PATH", "")) if p)
    # The core's and the tests' bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (it is on this
    # project's machines) each command and worker the tests start would otherwise compile what it imports again.
    for tree in ("src", "tests"):
        compileall.compile_dir(str(ROOT / tree), quiet=1)
    with tempfile.TemporaryDirectory(prefix="invar-first-lane-") as scratch:
        log = Path(scratch) / "first.log"
        started = time.monotonic()
        servers = start_fork_servers(Path(scratch) / "forkserver")
        env = {**os.environ, forkserver.ENV: str(Path(scratch) / "forkserver")}
        with log.open("wb") as out:
            # Its own base temp folder and no cache: the two sessions share nothing on disk.
            first_proc = subprocess.Popen([*pytest, "-p", "no:cacheprovider", f"--basetemp={scratch}/tmp",
                                           *(f"--ignore={p}" for p in second), *argv],
                                          cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            print(f"test lanes: the first lane ({', '.join(first)}) runs beside this one; its output follows",
                  flush=True)
            second_code = subprocess.call([*pytest, *(f"--ignore={p}" for p in first), *argv], cwd=ROOT, env=env)
            second_s = time.monotonic() - started
            first_code = first_proc.wait()
        finally:
            if first_proc.poll() is None:
                first_proc.kill()
                first_proc.wait()
            stop_fork_servers(servers)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for _, _, server_log in servers:
                    shutil.copyfile(server_log, keep / server_log.name)
        total_s = time.monotonic() - started
        sys.stdout.write(f"\n===== the first lane ({', '.join(first)}) =====\n")
        sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
    print(f"test lanes: second lane exit {second_code} after {second_s:.0f} s, first lane exit {first_code} after "
          f"{total_s:.0f} s in all", flush=True)
    return next((code for code in (second_code, first_code) if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
