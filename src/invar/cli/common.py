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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from invar.errors import Interrupted, InvarError, NotResumable
from invar.interrupts import Stopped, interruption

# numpy, the canonical codec and the run store are imported where they are used, not at every command's start
# (a `--help` needs none of them; tests/cli/test_lazy_imports.py holds that).
if TYPE_CHECKING:
    from pydantic import BaseModel

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts and agents).")]
# Here rather than in invar.cli.progress: a command's --help then builds without rich.
QuietOpt = Annotated[bool, typer.Option("--quiet", help="Show no progress on stderr (only an error, if any).")]
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
    # An array or a bfloat16 array can exist only once its module is imported: look it up, never import it here.
    codec = sys.modules.get("invar.canonical")
    if codec is not None and isinstance(obj, codec.BFloat16Array):
        return {**plain(obj.bits), "dtype": "bfloat16"}
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return {"dtype": str(obj.dtype), "shape": list(obj.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(obj).tobytes()).hexdigest()}
    if np is not None and isinstance(obj, np.generic):
        return plain(obj.item())
    if isinstance(obj, enum.Enum):
        return plain(obj.value)
    if isinstance(obj, PurePath | Decimal | Fraction):
        return str(obj)
    from invar import canonical

    raise TypeError(f"no JSON for a {type(obj).__qualname__} in a command's output: {canonical.show(obj, 80)}")


def _key(key: Any) -> str:
    if isinstance(key, bytes | bytearray | memoryview):  # str() would give the `b'…'` repr
        from invar import canonical

        raise TypeError(f"no JSON key for bytes in a command's output: {canonical.show(bytes(key), 80)}")
    return str(key)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(plain(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")


def emit_model(output: BaseModel, *, exclude_none: bool = False, exclude_unset: bool = False) -> None:
    """Print a command's `--json` as its model in `invar.cli.outputs` serialises it: the model that generates the
    command's published schema is the one that prints it, so the two cannot drift (a field the command sets but the
    model lacks, or one it leaves out, is an error before anything is printed).

    Where an optional part is absent rather than null: `exclude_none` leaves out each field that is None (a nested
    model's too); `exclude_unset` each field the model was not given (for a model validated from an object's own
    JSON, exactly the keys that JSON has).

    The model's own fields are typed and validated; what its open maps (`dict[str, Any]`) hold is written by
    `plain`, as every output is: a kept file as its digest, an array as its dtype, shape and digest, a float that is
    not finite as null (pydantic's JSON mode would write bytes as text and refuses numpy values)."""
    emit_json(output.model_dump(exclude_none=exclude_none, exclude_unset=exclude_unset))


@contextlib.contextmanager
def resumable(run_dir: Path, command: str) -> Iterator[None]:
    """A failure of a resumable command (`use run`, `train`) after its run exists says how to resume it."""
    from invar.records.store import is_run

    try:
        yield
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM where the command has no graceful stop of its own
        how, status = interruption(exc)
        if not is_run(run_dir):
            raise Stopped(f"stopped at {how} before the run was created in {run_dir}", status) from None
        raise Stopped(f"stopped at {how}. Every record so far is kept in {run_dir}; resume with: {command} "
                      f"--run {run_dir}", status) from None
    except InvarError as exc:
        if not is_run(run_dir) or isinstance(exc, NotResumable):
            raise
        hint = f"{exc}. Every record so far is kept in {run_dir}; resume with: {command} --run {run_dir}"
        if isinstance(exc, Interrupted):  # keeps its exit status
            raise Stopped(hint, exc.status if isinstance(exc, Stopped) else 130) from None
        raise InvarError(hint) from None
