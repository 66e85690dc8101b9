"""A signal sent by a test from inside a call, as a scheduler's stop or a user's Ctrl-C arrives while the call
computes, handled by the command line's own handler (`cli_app._interrupt`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

from invar.cli import app as cli_app


def signalled() -> int:
    """How many signals the command line's handler has taken in this process so far."""
    return len(cli_app._SIGNALLED)


def wait_for_handler(seen: int, timeout_s: float = 30.0) -> None:
    """Return once the handler has taken a signal more than the `seen` it had. Python runs a handler on the main
    thread only when that thread next holds the interpreter, so on a loaded machine a call that answers right after
    the signal was sent could answer, and the command start its next call, before the command has seen it; a call
    that waits here answers after, every time."""
    deadline = time.monotonic() + timeout_s
    while signalled() == seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"the command line's signal handler did not run within {timeout_s:g} s; is "
                                 "cli_app._interrupt installed (`command_line_handlers`)?")
        time.sleep(0.001)


def sigterm_during_call(timeout_s: float = 30.0) -> None:
    """Send this process SIGTERM and return once the handler has run (`wait_for_handler`)."""
    seen = signalled()
    os.kill(os.getpid(), signal.SIGTERM)
    wait_for_handler(seen, timeout_s)


@contextlib.contextmanager
def command_line_handlers() -> Iterator[None]:
    """Ctrl-C (and `_thread.interrupt_main`) and SIGTERM handled inside the block as `invar`'s command line handles
    them, each recorded in `cli_app._SIGNALLED`."""
    previous = signal.signal(signal.SIGINT, cli_app._interrupt), signal.signal(signal.SIGTERM, cli_app._interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
