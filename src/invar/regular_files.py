"""Reading a file whole, bounded and without blocking: every file the core reads whole (an owner's data file, a
receipt, a model folder's tokenizer, chat template and configuration files) comes through `read_regular_file`.

Decision: a file the core reads may be anything its path names: a FIFO that never ends, a link to `/dev/zero`, a
file of many gigabytes, a file swapped between a check and the read. One reader refuses each of these with one line
naming the file and what to do (the caller's error class, so the command exits 2), and never blocks or reads past
its bound. It sits below the workers' modules (`invar.tasks` reads a model folder through it) and imports only
`invar.errors`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from invar import errors
from invar.errors import ContractError, InvarError

MAX_DATA_BYTES = 1 << 30
"""A data file a command reads whole (a population, a scorer, a tokens file) holds at most 1 GiB."""
TOKENIZER_FILE_BYTES = 1 << 28
"""A model folder's `tokenizer.json` holds at most 256 MiB (the largest vocabularies' are a few tens of MiB)."""
MODEL_FILE_BYTES = 1 << 24
"""A model folder's other small files the core reads (`tokenizer_config.json`, `config.json`,
`generation_config.json`, `special_tokens_map.json`, chat templates) hold at most 16 MiB each."""

_FILE_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


_READ_PIECE = 1 << 24
"""Bytes `read_regular_file` asks for at a time past the size the file had when opened (16 MiB)."""


def read_regular_file(path: str | Path, what: str, *, limit: int = MAX_DATA_BYTES,
                      error: type[InvarError] = ContractError, fix: str = "point the declaration at the file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes, read once: every file a command reads whole comes
    through here. `what` names the file in errors (`"population file"`, `"receipt"`), `fix` says what to do, and
    `error` is the error class the caller's family raises.

    A FIFO, device, socket or directory is refused before it is opened for reading, and the opened file is checked
    again (non-blocking open, then `fstat`), so a file swapped in between can neither block nor be read; at most
    `limit` + 1 bytes are ever read, so a file that grows (or lies about its size) cannot exhaust memory.
    """
    path = Path(path)

    def refuse(text: str) -> NoReturn:
        raise error(f"{what} {errors.one_line(str(path))} {text}: {fix}")

    def not_regular(mode: int) -> NoReturn:
        refuse(f"is {next((name for test, name in _FILE_KINDS if test(mode)), 'not a regular file')}, not a "
               "regular file")

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        refuse("does not exist")
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        refuse(f"cannot be read ({getattr(exc, 'strerror', None) or exc})")
    if not stat.S_ISREG(mode):
        not_regular(mode)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        refuse(f"cannot be read ({exc.strerror})")
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            not_regular(info.st_mode)
        if info.st_size > limit:
            refuse(f"holds {info.st_size:,} bytes, over the {limit:,} a {what} may hold")
        try:
            # What fstat says is there and one byte more; `read(n)` sets n bytes aside first, so `read(limit + 1)`
            # took the whole limit (1 GiB) of address space for every file, however small.
            data = f.read(info.st_size + 1)
            if len(data) > info.st_size:  # longer than when opened: on in pieces, to its end or past the limit
                pieces, total = [data], len(data)
                while total <= limit and (piece := f.read(min(_READ_PIECE, limit + 1 - total))):
                    pieces.append(piece)
                    total += len(piece)
                data = b"".join(pieces)
        except OSError as exc:
            refuse(f"cannot be read ({exc.strerror})")
    if len(data) > limit:
        refuse(f"holds more than the {limit:,} bytes a {what} may hold")
    return data


def read_model_file(path: Path, limit: int = MODEL_FILE_BYTES) -> bytes:
    """The bytes of a file of a model folder (see `read_regular_file`): `ContractError` naming it when it is not a
    regular file, cannot be read or holds more than `limit` bytes."""
    return read_regular_file(path, "model file", limit=limit,
                             fix="a model folder holds the regular files the model was saved with; save it again")
