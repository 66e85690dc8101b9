"""Many `invar` command lines through one Python process: each is run as `python -m invar.cli ARGS` runs it (the
CLI's `main()`, its exit status, what it writes to file descriptors 1 and 2, in its working directory), so that a
file of refusals pays the interpreter's start-up and the CLI's imports once instead of once per case.

Claims about a process itself (signals, start-up, what a fresh interpreter prints) stay with real subprocesses; a
case here is bounded by SIGALRM, so a hang or a read without end fails that case and the batch goes on."""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_CHILD = r'''
import json, os, signal, sys, time, traceback
from pathlib import Path

import invar.cli
from invar.cli.app import main

requests, responses = (os.fdopen(int(fd), mode) for fd, mode in ((sys.argv[1], "r"), (sys.argv[2], "w")))
for f in (requests, responses):
    os.set_inheritable(f.fileno(), False)  # not the workers' a command starts
# What click reads to name the program (`python -m invar.cli`), as under -m.
sys.modules["__main__"].__package__ = "invar.cli"
program = str(Path(invar.cli.__file__).parent / "__main__.py")


class PastBound(BaseException):
    pass


def past_bound(signum, frame):
    raise PastBound()


for line in requests:
    case = json.loads(line)
    os.chdir(case["cwd"])
    sys.argv = [program, *case["args"]]
    out = os.open(case["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(case["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(out, 1); os.dup2(err, 2)
    signal.signal(signal.SIGALRM, past_bound)
    signal.alarm(case["bound_s"])
    started = time.monotonic()
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # as the interpreter does with a message for an exit status
            print(exc.code, file=sys.stderr)
            code = 1
    except PastBound:
        print(f"ran past {case['bound_s']} s", file=sys.stderr)
        code = -14
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        signal.alarm(0)
        seconds = time.monotonic() - started
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        for fd in (out, err, *saved):
            os.close(fd)
    responses.write(json.dumps({"returncode": code, "seconds": seconds}) + "\n")
    responses.flush()
'''


@dataclass(frozen=True)
class Case:
    """One command line: its arguments and the folder it runs in (the caller's when None)."""

    args: Sequence[str | Path]
    cwd: Path | None = None


@dataclass(frozen=True)
class Ran:
    """What one case did, as `subprocess.run(..., capture_output=True, text=True)` reports a process."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float = field(default=0.0)


class InvarSession:
    """One process that runs `invar` command lines one after another, each when asked (`run`), so that a later
    command line may use what an earlier one printed. Use it as a context manager: leaving it ends the process."""

    def __init__(self, *, bound_s: int, memory_bytes: int | None = None) -> None:
        self.bound_s = bound_s
        self._scratch = tempfile.TemporaryDirectory(prefix="invar-session-")
        self.folder = Path(self._scratch.name)
        self._n = 0
        requests_r, self._requests = os.pipe()
        self._responses, responses_w = os.pipe()

        def limit() -> None:
            if memory_bytes is not None:
                resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

        with (self.folder / "session.log").open("wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(requests_r), str(responses_w)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          pass_fds=(requests_r, responses_w), preexec_fn=limit)
        os.close(requests_r)
        os.close(responses_w)
        self._reader = os.fdopen(self._responses, "r")

    def run(self, *args: str | Path, cwd: Path | None = None) -> Ran:
        """`invar ARGS` in `cwd` (the caller's when None), in this process; what it did."""
        out, err = self.folder / f"{self._n}.out", self.folder / f"{self._n}.err"
        self._n += 1
        words = [str(a) for a in args]
        request = {"args": words, "cwd": str(cwd or Path.cwd()), "out": str(out), "err": str(err),
                   "bound_s": self.bound_s}
        os.write(self._requests, (json.dumps(request) + "\n").encode())
        # The case's own SIGALRM bound ends a slow command; this one ends a process that stopped answering.
        ready, _, _ = select.select([self._reader], [], [], self.bound_s + 60)
        line = self._reader.readline() if ready else ""
        if not line:
            self._proc.kill()
            log = (self.folder / "session.log").read_text(encoding="utf-8", errors="replace")
            raise AssertionError(f"invar {' '.join(words)}: the session process stopped answering:\n{log[-4000:]}")
        result = json.loads(line)
        return Ran(args=words, returncode=result["returncode"],
                   stdout=out.read_text(encoding="utf-8", errors="replace"),
                   stderr=err.read_text(encoding="utf-8", errors="replace"), seconds=result["seconds"])

    def __enter__(self) -> InvarSession:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self._requests)
        try:
            self._proc.wait(timeout=60)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._reader.close()
            self._scratch.cleanup()


def invar_batch(cases: Sequence[Case], *, bound_s: int, memory_bytes: int | None = None) -> list[Ran]:
    """Run `cases` in order through one process; each may take at most `bound_s` seconds (past it, returncode -14
    and "ran past" on stderr); `memory_bytes` caps the process's address space (RLIMIT_AS)."""
    with InvarSession(bound_s=bound_s, memory_bytes=memory_bytes) as session:
        return [session.run(*case.args, cwd=case.cwd) for case in cases]
