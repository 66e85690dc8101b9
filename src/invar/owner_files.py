"""Reading the files a person writes: a use declaration or contract (`invar.contract.model`) and a training
configuration (`invar.loop.config`).

Decision: one reader and one way of reporting a bad field for every such file, so each is refused the same way,
with one line naming the file, the field at fault and what to change, never a traceback or an unbounded message:
a file is a regular file of at most `MAX_FILE_BYTES` in UTF-8 (`read_owner_file`), a validation failure is the first
field at fault and a count of the rest (`field_error`), and the field types every such file uses (`Name`, `PathText`)
are checked here. **Nothing is coerced**: the models that read these files are strict, so a boolean where a number
is expected, a number or boolean written as a string, or a float where an integer is expected is refused, and the
line says what the value is and what to write instead (`wrong_type`); an integer where a float is expected is
accepted, as the number it is. It sits below both the contract and the training loop, which must not import each
other for it.
The error is `ContractError` whichever file it is; the training configuration rewraps it as its own.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, ValidationError

from invar import canonical
from invar.engines import ENGINE_TABLE, LAUNCH_SETTINGS
from invar.errors import ContractError
from invar.regular_files import MAX_DATA_BYTES, read_regular_file

__all__ = ["MAX_DATA_BYTES", "read_regular_file"]  # every file a command reads whole is read by `invar.regular_files`

MAX_FILE_BYTES = 1 << 20
"""A declaration, contract or configuration file holds at most 1 MiB."""
MAX_PATH = 1024
"""Characters in a path (no NUL character)."""
SHA256_FILE_BYTES = 4096
"""A `.sha256` file beside another (as `sha256sum` writes it: the digest, then the file's name)."""


def sha256_file(sibling: Path, fix: str) -> str:
    """The digest a `.sha256` file holds: its first word, as `sha256sum` writes it (checked as 64 hex digits where
    the file it names is read); `ContractError` naming the file, with `fix`, when it holds none."""
    words = read_regular_file(sibling, "sha256 file", limit=SHA256_FILE_BYTES, fix=fix).split()
    if not words:
        raise ContractError(f"{sibling}: empty; {fix}")
    return words[0].decode("ascii", "replace")


def declared_sha256(path: Path, declared: str | None, fix: str) -> str:
    """A data file's declared sha256: `declared` when given, else the digest in the `.sha256` file beside it (its
    suffix replaced: `arith-eval.jsonl` → `arith-eval.sha256`); `ContractError` with `fix` when there is none."""
    if declared is not None:
        return declared
    sibling = path.with_suffix(".sha256")
    if not sibling.exists():
        raise ContractError(f"{path}: no {sibling.name} beside it; {fix}")
    return sha256_file(sibling, fix)


def _show(value: object) -> str:
    """A bounded repr for messages: one line, however long or strange the value."""
    return canonical.show(value, 60)


def check_name(value: str) -> str:
    """`value` if it is a valid `Name`, else a `ValueError` saying what a name may hold."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", value):
        raise ValueError(
            f"must be 1-64 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit; got {_show(value)}"
        )
    return value


def check_path(value: str) -> str:
    """`value` if it is a valid `PathText`, else a `ValueError` saying what to change."""
    if not value:
        raise ValueError("must name a file or folder; got an empty path")
    if "\x00" in value:
        raise ValueError(f"must not contain a NUL character; got {_show(value)}")
    if len(value) > MAX_PATH:
        raise ValueError(f"is {len(value):,} characters long; a path may have at most {MAX_PATH:,}: shorten it")
    return value


Name = Annotated[str, AfterValidator(check_name)]
"""A name a person gives (a layout, a task kind): 1-64 characters of a-z, 0-9, '_', '.', '-'."""
PathText = Annotated[str, AfterValidator(check_path)]
"""A path as written in the file: not empty, no NUL, at most `MAX_PATH` characters."""


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # A key the owner wrote may be long or hold a newline: quoted and cut, so the message stays one line.
            text = part if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", part) else canonical.show(part, 40)
            out += text if not out else f".{text}"
    return out


# --- a value of the wrong type: what it is, and what to write instead --------------------------------------------

_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
TYPE_ERRORS = {"int_type": "int", "int_parsing": "int", "int_from_float": "int", "float_type": "float",
                "float_parsing": "float", "bool_type": "bool", "bool_parsing": "bool", "string_type": "str"}
"""pydantic's error types for a value of the wrong kind (strict mode gives the `_type` ones)."""
_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")
_NUMBER = re.compile(r"[+-]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][+-]?[0-9]{1,3})?")


def written(value: object) -> str:
    """`value` as the owner would write it in TOML (`true`, `"16"`, `16.0`), bounded to one short line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 40 else text[:38] + '…"'
    return _show(value)


def what_it_is(value: object) -> str:
    """`value` named by its kind and as written: `the boolean true`, `the string "16"`, `the float 16.0`."""
    kinds = ((bool, "the boolean"), (int, "the integer"), (float, "the float"), (str, "the string"),
             (list, "the list"), (dict, "the table"))
    kind = next((name for cls, name in kinds if isinstance(value, cls)), f"a {type(value).__name__},")
    return f"{kind} {written(value)}"


def wrong_type(expected: str, given: object) -> str:
    """What a field that takes `expected` ("int", "float", "bool" or "str") says of `given`, a value of another
    kind: what it must be, what it is, and what to write instead. Nothing is coerced: `true` is not 1, `"16"` is
    not 16, 16.0 is not 16."""
    return f"must be {_EXPECTED[expected]}, not {what_it_is(given)}; {write_instead(expected, given)}"


def write_instead(expected: str, given: object) -> str:
    """What to write for a field that takes `expected` where `given` was written (`wrong_type`'s advice)."""
    text = given.strip() if isinstance(given, str) else None
    if expected == "int":
        if text is not None and _INTEGER.fullmatch(text):
            return f"write {text} without quotes"
        if isinstance(given, float) and given.is_integer() and abs(given) < 2**63:
            return f"write {int(given)}"
        return "write a whole number such as 16"
    if expected == "float":
        if text is not None and _NUMBER.fullmatch(text):
            return f"write {text} without quotes"
        return "write a number such as 1.0"
    if expected == "bool":
        if text is not None and text in ("true", "false"):
            return f"write {text} without quotes"
        return "write true or false" + (" without quotes" if isinstance(given, str) else "")
    return "write it in double quotes"


def field_error(exc: ValidationError, what: str) -> ContractError:
    """Turn pydantic's report into one line naming the first field at fault and what to change."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = _loc(tuple(first["loc"]))
    kind = first["type"]
    msg = str(first["msg"])
    limit = first.get("ctx", {}).get("max_length")
    given = first.get("input")
    if kind == "missing":
        text = "is required; add it"
    elif kind == "extra_forbidden":
        text = "is not a known field; remove it or check its spelling"
    elif kind in TYPE_ERRORS:
        text = wrong_type(TYPE_ERRORS[kind], given)
    elif kind in ("value_error", "assertion_error"):
        text = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    elif kind == "string_too_long" and isinstance(given, str):
        text = f"is {len(given):,} characters long; the limit is {limit:,}: shorten it"
    elif kind == "too_long" and isinstance(given, dict | list):
        text = f"has {len(given):,} entries; the limit is {limit:,}: remove some"
    else:
        text = f"{msg[:1].lower()}{msg[1:]}; got {_show(given)}"
    if field and text.startswith(field):
        field = ""  # the message already names its field
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    head = f"{field}: " if field else ""
    return ContractError(f"{what}: {head}{text}{more}")


def read_owner_file(path: Path, what: str) -> str:
    """The text of a declaration, contract or configuration file (`what` names which): a regular file of at most
    MAX_FILE_BYTES, in UTF-8."""
    try:
        info = path.stat()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ContractError(f"{path}: cannot read the {what} ({reason}); check the path") from None
    if stat.S_ISDIR(info.st_mode):
        raise ContractError(f"{path}: cannot read the {what}: it is a folder; give the {what} file")
    if not stat.S_ISREG(info.st_mode):  # a pipe or device could block or never end
        raise ContractError(f"{path}: cannot read the {what}: it is not a regular file; give the {what} file")
    if info.st_size > MAX_FILE_BYTES:
        raise _too_large(str(path), what, info.st_size)
    try:
        # Non-blocking, and checked again once open: a FIFO swapped in after the stat neither blocks nor is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ContractError(f"{path}: cannot read the {what}: it is not a regular file; give the {what} file")
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ContractError(f"{path}: cannot read the {what} ({exc.strerror or exc}); check the path") from None
    return owner_text(raw, str(path), what)


def _too_large(source: str, what: str, size: int | None) -> ContractError:
    held = f"{size:,} bytes" if size is not None else f"more than {MAX_FILE_BYTES:,} bytes"
    return ContractError(f"{source}: {held}, over the limit of 1 MiB ({MAX_FILE_BYTES:,} bytes) for a {what}; a "
                         f"{what} is a few kilobytes: check that this is the {what} file")


def owner_text(raw: bytes, source: str, what: str) -> str:
    """`raw` (the bytes of a `what` file, read from `source`) as text: at most MAX_FILE_BYTES, in UTF-8."""
    if len(raw) > MAX_FILE_BYTES:
        raise _too_large(source, what, None if len(raw) == MAX_FILE_BYTES + 1 else len(raw))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A contract is written by `use prepare`, not by hand: the advice is to use that file, not to re-save it.
        advice = "give the file use prepare wrote" if what == "contract" else f"save the {what} as UTF-8"
        raise ContractError(f"{source}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start:,}); "
                            f"{advice}") from None


def _either(values: tuple[Any, ...]) -> str:
    shown = [written(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def check_launch_settings(engine: str, settings: Mapping[str, Any]) -> None:
    """A package's settings (or a training configuration's engine settings) that are launch options of `engine`'s
    worker must have the type and a value the worker takes, before any worker starts: `ValueError` naming the
    setting and what to write. Settings that are not launch options are the worker's identity only (their values
    are checked at handshake), but a name no worker of `engine` reports (`EngineInfo.reported`) is refused here, as
    no worker could ever match it; a setting left null passes."""
    info = ENGINE_TABLE.get(engine)
    if info is not None and info.reported is not None:
        # `patch_poison`: what a worker running a poisoned patch reports beside it (`invar.workers.common`).
        known = {*info.settings, *info.reported, "patch_poison"}
        unknown = sorted(name for name in settings if name not in known)
        if unknown:
            raise ValueError(f"{_show(unknown[0])} is not a setting of the {engine} worker: neither a launch option "
                             f"nor one its identity reports; remove it or check its spelling (the {engine} worker's "
                             f"settings: {', '.join(sorted(known - {'patch_poison'})) or 'none'})")
    for name, launch in LAUNCH_SETTINGS.get(engine, {}).items():
        value = settings.get(name)
        if value is None:
            if launch.required:
                raise ValueError(f"{name} is missing: the {engine} worker cannot start without it; state it in the "
                                 "package's settings (invar use package prints them)")
            continue
        where = f"{name}, a launch option of the {engine} worker,"
        if launch.kind is float and isinstance(value, int) and not isinstance(value, bool):
            # The worker reports a float, and its identity must equal the package's exactly (type included).
            raise ValueError(f"{where} must be a number with a decimal point, as the worker reports it, not "
                             f"{what_it_is(value)}; write {value}.0")
        if launch.kind is int:
            fits = isinstance(value, int) and not isinstance(value, bool)
        else:
            fits = isinstance(value, launch.kind)
        if not fits:
            raise ValueError(f"{where} {wrong_type(launch.kind.__name__, value)}")
        if launch.choices and value not in launch.choices:
            what = "a device" if name == "device" else "one"
            raise ValueError(f"{name} {written(value)} is not {what} the {engine} worker takes; write "
                             f"{_either(launch.choices)}")
