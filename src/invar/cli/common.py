"""Option aliases and output helpers shared by every command."""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import math
import sys
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path, PurePath
from typing import Annotated, Any

import numpy as np
import typer

from invar import canonical
from invar.canonical import BFloat16Array
from invar.errors import Interrupted, InvarError, NotResumable
from invar.records.store import is_run

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts and agents).")]
RunDir = Annotated[Path, typer.Argument(help="A run directory (holds records.sqlite).")]
ExpectHeadOpt = Annotated[
    str | None,
    typer.Option("--expect-head", help="The run's chain head kept when it closed: refuse records that do not end "
                                       "there (re-chained, cut or extended)."),
]


def plain(obj: Any) -> Any:
    """`obj` as plain JSON values: bytes (a kept file, say) as their digest and size, never a Python `b'…'` repr;
    an array as its dtype, shape and digest; an enum as its value, a path, a Decimal or a Fraction as its text; a
    float that is not finite as null (JSON has no NaN or Infinity). Anything else is refused (`TypeError`) rather
    than printed as its repr: an output that holds another object is a bug in the command that built it."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {_key(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, bytes | bytearray | memoryview):
        raw = bytes(obj)
        return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    if isinstance(obj, BFloat16Array):
        return {**plain(obj.bits), "dtype": "bfloat16"}
    if isinstance(obj, np.ndarray):
        return {"dtype": str(obj.dtype), "shape": list(obj.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(obj).tobytes()).hexdigest()}
    if isinstance(obj, np.generic):
        return plain(obj.item())
    if isinstance(obj, enum.Enum):
        return plain(obj.value)
    if isinstance(obj, PurePath | Decimal | Fraction):
        return str(obj)
    raise TypeError(f"no JSON for a {type(obj).__qualname__} in a command's output: {canonical.show(obj, 80)}")


def _key(key: Any) -> str:
    if isinstance(key, bytes | bytearray | memoryview):  # str() would give the `b'…'` repr
        raise TypeError(f"no JSON key for bytes in a command's output: {canonical.show(bytes(key), 80)}")
    return str(key)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(plain(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")


@contextlib.contextmanager
def resumable(run_dir: Path, command: str) -> Iterator[None]:
    """A failure of a resumable command (`use run`, `train`) after its run exists says how to resume it."""
    try:
        yield
    except InvarError as exc:
        if not is_run(run_dir) or isinstance(exc, NotResumable):
            raise
        kind = Interrupted if isinstance(exc, Interrupted) else InvarError  # Ctrl-C keeps its exit status
        raise kind(f"{exc}. Every record so far is kept in {run_dir}; resume with: {command} --run {run_dir}")\
            from None
