"""A signal sent by a test from inside a call, as a scheduler's stop arrives while the call computes."""

from __future__ import annotations

import os
import signal
import time

from invar.cli import app as cli_app


def sigterm_during_call(timeout_s: float = 30.0) -> None:
    """Send this process SIGTERM and return once the command line's handler (`cli_app._interrupt`, which the test
    installs) has run. Python runs a handler on the main thread only when that thread next holds the interpreter,
    so on a loaded machine the calling thread could answer and start the run's next call before the command has
    seen the signal; waiting here makes the signal land while this call is under way, every time."""
    seen = len(cli_app._SIGNALLED)
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while len(cli_app._SIGNALLED) == seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"the SIGTERM handler did not run within {timeout_s:g} s; is cli_app._interrupt "
                                 "installed?")
        time.sleep(0.001)
