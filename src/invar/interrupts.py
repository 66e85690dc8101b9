"""How a command stops at Ctrl-C or SIGTERM: what stopped it, and the exit status the shell gives for that signal.

Kept out of `invar.errors`, which the workers import (their code digest follows it): only the core's commands
handle these signals.
"""

from __future__ import annotations

from invar.errors import Interrupted


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler ending a job, `kill`), raised in the main thread by the command line's handler: the
    command stops as it does at Ctrl-C, with less grace, since a SIGKILL usually follows within about 30 s."""


def interruption(exc: BaseException) -> tuple[str, int]:
    """What stopped a command, as the user knows it, and the exit status the shell gives for that signal."""
    return ("SIGTERM", 143) if isinstance(exc, Terminated) else ("Ctrl-C", 130)


class Stopped(Interrupted):
    """A command stopped cleanly at a signal: `status` is the shell's exit status for it (130 Ctrl-C, 143 SIGTERM)."""

    def __init__(self, message: str, status: int = 130) -> None:
        super().__init__(message)
        self.status = status
