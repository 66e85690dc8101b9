"""Errors a user can act on.

Every error the CLI knows how to explain derives from `InvarError`; its message is one line that names what is
wrong and what to change. Anything else escaping to the top level is a bug and keeps its traceback.
"""


def one_line(text: str) -> str:
    """`text` as one line: a newline or other control character (in a worker's error text, its stderr tail, a path
    or name a user gave) is written as its escape, so an error stays the one line a script reads."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


class InvarError(Exception):
    """A failure with a one-line, actionable message."""

    def __init__(self, *args: object) -> None:
        # Escaped where the message is made: one that echoes an owner's string (a path, a name, a worker's text)
        # stays one printable line wherever it is shown or kept, the Python API included, not only where the
        # command line prints it.
        super().__init__(*(one_line(arg) if isinstance(arg, str) else arg for arg in args))


class ProtocolError(InvarError):
    """The worker broke the invocation protocol, died, or timed out."""


class WorkerError(InvarError):
    """The worker answered a call with an error (bad input, a missing file, a digest mismatch)."""

    def __init__(self, method: str, error_type: str, message: str) -> None:
        super().__init__(f"{method}: {error_type}: {message}")
        self.method = method
        self.error_type = error_type
        self.message = message


class RecordError(InvarError):
    """A run store is missing, unreadable, or fails verification."""


class ContractError(InvarError):
    """A declaration or contract is invalid; the message names the field and what to change."""


class EvidenceError(InvarError):
    """The evidence in a run does not match what the contract requires (missing, altered or foreign records)."""


class NotResumable:
    """Mixed into an error refusing an existing run as it stands (made by another configuration, its inputs changed,
    its records unreadable): running the same command again cannot help, so the CLI adds no resume hint."""


class Interrupted(InvarError):
    """The user stopped a command (Ctrl-C) and it stopped cleanly: what was recorded is kept (exit status 130)."""
