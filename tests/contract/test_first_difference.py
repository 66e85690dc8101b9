"""The one walker that finds where a value first differs from the one expected (`invar.evidence.first_difference`),
which admission (a record against the contract), receipt verification (a receipt against the records) and a
worker's identity check (against the contract's package) each say in their own words."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from invar.evidence import Difference, first_difference


@pytest.mark.parametrize(("expected", "actual", "found"), [
    ({"a": 1, "b": 2}, {"a": 1, "b": 2}, None),
    ({"b": 1, "a": 1}, {"a": 2, "b": 2}, Difference("x.a", "value", 1, 2)),  # keys in sorted order
    ({"a": 1}, {}, Difference("x.a", "missing", 1, None)),
    ({}, {"z": [1]}, Difference("x.z", "unexpected", None, [1])),
    ({"a": {"b": [1, {"c": True}]}}, {"a": {"b": [1, {"c": 1}]}}, Difference("x.a.b[1].c", "type", True, 1)),
    ([1, 2], [1, 2, 3], Difference("x", "length", [1, 2], [1, 2, 3])),
    ([1, 2], [0], Difference("x[0]", "value", 1, 0)),  # elements first, then the lengths
    (1, 1.0, Difference("x", "type", 1, 1.0)),
    ("a", "a", None),
])
def test_the_first_difference_and_its_kind(expected: Any, actual: Any, found: Difference | None) -> None:
    assert first_difference(expected, actual, "x") == found


def test_arrays_differ_by_dtype_shape_or_bytes() -> None:
    a = np.arange(4, dtype=np.int32)
    assert first_difference({"t": a}, {"t": a.copy()}, "p") is None
    for other in (a.astype(np.int64), a.reshape(2, 2), a + 1):
        diff = first_difference({"t": a}, {"t": other}, "p")
        assert diff is not None
        assert (diff.where, diff.kind) == ("p.t", "value")
    diff = first_difference(a, a.tolist(), "p")
    assert diff is not None
    assert diff.kind == "type"


def test_each_check_says_it_in_its_own_words() -> None:
    from invar.contract.bind import _first_difference as admission
    from invar.contract.receipt import _first_difference as receipt
    from invar.runner.engine import _difference as identity

    assert admission({"seed": 1}, {"seed": 2}, "params") == "params.seed is 2 in the record, 1 in the contract"
    assert receipt({"n": 1}, {"n": True}, "receipt") == \
        "receipt.n is a JSON boolean (True) in the receipt, a JSON integer (1) recomputed from the records"
    assert receipt([1], [1, 2], "r") == "r holds 2 entries in the receipt, 1 recomputed from the records"
    assert identity({"threads": 2}, {}, "reference.settings") == \
        "reference.settings.threads is missing from the worker's identity (the contract has 2)"
