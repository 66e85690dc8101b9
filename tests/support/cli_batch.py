"""Many `invar` command lines through one Python process: each is run as `python -m invar.cli ARGS` runs it (the
CLI's `main()`, its exit status, what it writes to file descriptors 1 and 2, in its working directory), so that a
file of refusals pays the interpreter's start-up and the CLI's imports once instead of once per case.

Claims about a process itself (signals, start-up, what a fresh interpreter prints) stay with real subprocesses; a
case here is bounded by SIGALRM, so a hang or a read without end fails that case and the batch goes on."""

from __future__ import annotations

import json
import resource
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

spec_path, results_path = Path(sys.argv[1]), Path(sys.argv[2])  # before sys.argv becomes each case's
spec = json.loads(spec_path.read_text(encoding="utf-8"))
# What click reads to name the program (`python -m invar.cli`), as under -m.
sys.modules["__main__"].__package__ = "invar.cli"
program = str(Path(invar.cli.__file__).parent / "__main__.py")


class PastBound(BaseException):
    pass


def past_bound(signum, frame):
    raise PastBound()


results = []
for case in spec["cases"]:
    os.chdir(case["cwd"])
    sys.argv = [program, *case["args"]]
    out = os.open(case["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(case["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(out, 1); os.dup2(err, 2)
    signal.signal(signal.SIGALRM, past_bound)
    signal.alarm(spec["bound_s"])
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
        print(f"ran past {spec['bound_s']} s", file=sys.stderr)
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
    results.append({"returncode": code, "seconds": seconds})
results_path.write_text(json.dumps(results), encoding="utf-8")
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


def invar_batch(cases: Sequence[Case], *, bound_s: int, memory_bytes: int | None = None,
                timeout: float | None = None) -> list[Ran]:
    """Run `cases` in order through one process; each may take at most `bound_s` seconds (past it, returncode -14
    and "ran past" on stderr); `memory_bytes` caps the process's address space (RLIMIT_AS)."""
    def limit() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    with tempfile.TemporaryDirectory(prefix="invar-batch-") as scratch:
        folder = Path(scratch)
        spec = {"bound_s": bound_s, "cases": [
            {"args": [str(a) for a in case.args], "cwd": str(case.cwd or Path.cwd()),
             "out": str(folder / f"{i}.out"), "err": str(folder / f"{i}.err")} for i, case in enumerate(cases)]}
        (folder / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder / "spec.json"), str(folder / "results.json")],
                              capture_output=True, text=True, preexec_fn=limit,
                              timeout=timeout if timeout is not None else bound_s * (len(cases) + 1))
        assert proc.returncode == 0, f"the batch itself failed:\n{proc.stderr[-4000:]}"
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        return [Ran(args=[str(a) for a in case.args], returncode=r["returncode"],
                    stdout=(folder / f"{i}.out").read_text(encoding="utf-8", errors="replace"),
                    stderr=(folder / f"{i}.err").read_text(encoding="utf-8", errors="replace"), seconds=r["seconds"])
                for i, (case, r) in enumerate(zip(cases, results, strict=True))]
