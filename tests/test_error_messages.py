"""Every error a user can act on is one line of printable text, whatever owner string it echoes (a path, a name, a
worker's text): control characters are escaped where the message is made (`invar.errors.one_line`), so the message
stays one safe line wherever it is shown, kept or read through the Python API, not only where the command line
prints it (issue 51)."""

from __future__ import annotations

from pathlib import Path

import pytest

from invar.errors import ContractError, InvarError, WorkerError, one_line
from invar.owner_files import read_owner_file
from invar.records import RunStore

HOSTILE = "run\x1b[2J\r\n\x07\u202e"


def _message(call: object) -> str:
    with pytest.raises(InvarError) as info:
        call()  # type: ignore[operator]
    return str(info.value)


def test_messages_echoing_owner_strings_carry_no_control_character(tmp_path: Path) -> None:
    odd = tmp_path / HOSTILE
    messages = [
        _message(lambda: RunStore.open(odd)),
        _message(lambda: read_owner_file(odd, "declaration")),
    ]
    for message in messages:
        assert message.isprintable(), message
        assert one_line(HOSTILE) in message  # escaped, not dropped: the owner can still tell which path it was


def test_an_error_made_with_control_characters_is_escaped_and_keeps_its_fields() -> None:
    assert str(ContractError(f"name {HOSTILE}: bad")) == f"name {one_line(HOSTILE)}: bad"
    error = WorkerError("generate", "ValueError", "line one\nline two")
    assert str(error) == "generate: ValueError: line one\\nline two"
    assert error.message == "line one\nline two"  # the worker's own text, as it sent it
