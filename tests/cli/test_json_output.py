"""The one writer of every command's `--json` (`invar.cli.common.emit_json`): JSON values only, never a Python repr,
never NaN or Infinity."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from invar.cli.common import emit_json, plain


def test_numbers_that_are_not_finite_are_null(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json({"nan": float("nan"), "inf": np.float32("inf"), "rows": [float("-inf"), 0.5]})
    out = capsys.readouterr().out
    assert json.loads(out) == {"nan": None, "inf": None, "rows": [None, 0.5]}
    assert "NaN" not in out
    assert "Infinity" not in out


def test_bytes_and_arrays_are_digests_and_texts_are_their_text() -> None:
    got = plain({"file": b"\x00kept", "array": np.zeros(3, dtype=np.int32), "path": Path("runs/a"),
                 "epsilon": Decimal("0.05"), "ratio": Fraction(1, 3)})
    assert got["file"] == {"sha256": hashlib.sha256(b"\x00kept").hexdigest(), "bytes": 5}
    assert got["array"]["shape"] == [3]
    assert (got["path"], got["epsilon"], got["ratio"]) == ("runs/a", "0.05", "1/3")


@pytest.mark.parametrize("value", [{1, 2}, object(), {b"key": 1}], ids=["set", "object", "bytes-key"])
def test_a_value_with_no_json_is_refused_not_written_as_its_repr(value: object) -> None:
    """These were written as `str(value)`: `{1, 2}`, `<object object at 0x…>`, a `b'key'` key."""
    with pytest.raises(TypeError, match="no JSON"):
        plain({"field": value})
