"""What a long command is doing, on stderr: the phase (starting workers, loading the model, generating k/n, …) and
the time since the command started.

Stdout is never touched, so `--json` stays one parseable document. On a terminal the phase is a live line (rich,
transient: it is gone when the command ends); anywhere else (a log, CI, a pipe) each phase is one plain line,
`invar: loading the model… 3.2 s`, and a counted phase adds a line when it ends and at most every `PLAIN_EVERY_S`
in between, so a log shows where a run is without a bar's frames. `--quiet` shows nothing: stderr then holds an
error line only.

The runners report phases through callbacks and never print; this module is the one place that shows them.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
)
from rich.text import Text

from invar.cli.common import QuietOpt as QuietOpt  # defined there so a --help needs no rich; commands import it here

PLAIN_EVERY_S = 10.0
"""Off a terminal, the least time between two lines of one counted phase (its first and last are always shown)."""


class _Count(ProgressColumn):
    """k/n of a counted phase; nothing for a phase that counts nothing."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text(f"{int(task.completed)}/{int(task.total)}" + (f" {task.fields['unit']}" if task.fields["unit"]
                                                                  else ""))


class _Elapsed(ProgressColumn):
    """The time since the command started (not since the phase did)."""

    def __init__(self, started: float) -> None:
        super().__init__()
        self._started = started

    def render(self, task: Task) -> Text:
        return Text(f"{time.monotonic() - self._started:.1f} s")


class Reporter:
    """The phase of one command and its count, shown on stderr; safe to call from several threads."""

    def __init__(self, *, quiet: bool = False, live: bool | None = None) -> None:
        self._console = Console(stderr=True)
        self._quiet = quiet
        self._live = self._console.is_terminal if live is None else live
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._phase: str | None = None
        self._unit = ""
        self._total: int | None = None
        self._done = 0
        self._printed_at = 0.0
        self._bar: Progress | None = None
        self._task = TaskID(0)

    def __enter__(self) -> Reporter:
        if self._live and not self._quiet:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Count(),
                                 TextColumn("{task.fields[detail]}"), _Elapsed(self._started),
                                 console=self._console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("starting", total=None, unit="", detail="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def phase(self, text: str, total: int | None = None, unit: str = "", done: int = 0) -> None:
        """A new phase begins; `total` (with its `unit`): the phase counts to it, from `done`."""
        with self._lock:
            if text == self._phase and total == self._total:
                return
            self._phase, self._total, self._unit, self._done = text, total, unit, done
            if self._quiet:
                return
            if self._bar is not None:
                # A task per phase: rich cannot make a counted task uncounted again.
                self._bar.remove_task(self._task)
                self._task = self._bar.add_task(text, total=total, completed=done, unit=unit, detail="")
                return
            self._line()

    def count(self, done: int, total: int | None = None, detail: str = "") -> None:
        """How far the current counted phase is (`total`: when it is learned only now)."""
        with self._lock:
            if total is not None:
                self._total = total
            if done == self._done and total is None and not detail:
                return
            self._done = done
            if self._quiet or self._phase is None:  # a count before any phase (a resumed run's) shows with it
                return
            if self._bar is not None:
                self._bar.update(self._task, total=self._total, completed=done, detail=detail)
                return
            if done == self._total or time.monotonic() - self._printed_at >= PLAIN_EVERY_S:
                self._line(detail)

    def _line(self, detail: str = "") -> None:
        shown = self._phase or ""
        if self._total is not None:
            shown += f" {self._done}/{self._total}" + (f" {self._unit}" if self._unit else "")
        if detail:
            shown += f" ({detail})"
        self._printed_at = time.monotonic()
        sys.stderr.write(f"invar: {shown}… {self.elapsed():.1f} s\n")
        sys.stderr.flush()


@contextlib.contextmanager
def reporting(quiet: bool) -> Iterator[Reporter]:
    """The reporter of one command, shown until it ends."""
    with Reporter(quiet=quiet) as reporter:
        yield reporter


class AdmissionStep(Protocol):
    """A phase of admission as `invar.contract.admit.Step` states it (read here by its fields, so showing it
    needs no contract module)."""

    @property
    def phase(self) -> str: ...
    @property
    def done(self) -> int | None: ...
    @property
    def total(self) -> int | None: ...


def admission_steps(shown: Reporter) -> Callable[[AdmissionStep], None]:
    """The progress sink of a command that decides admission (`use admit`, `use verify`, `compare numerical` of a
    use run): verifying the records counts calls; every other phase is a line."""

    def show(step: AdmissionStep) -> None:
        if step.total is None:
            shown.phase(step.phase)
            return
        shown.phase(step.phase, total=step.total, unit="calls", done=step.done or 0)
        shown.count(step.done or 0)

    return show
