"""A report's prompt ids are checked against the call's as `np.array_equal` checks them, by whichever path is fastest
for the types a record decodes to (an int32 vector against a list of ints)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from invar.contract.bind import _same_ids

IDS = np.array([1, 7, 10, 15, 5, 13, 17], dtype=np.int32)


@pytest.mark.parametrize(("a", "b"), [
    (IDS, IDS.tolist()), (IDS, IDS.tolist()[:-1]), (IDS, [*IDS.tolist()[:-1], 18]), (IDS[:0], []),
    (IDS, [True, *IDS.tolist()[1:]]), (IDS, [1.0, *IDS.tolist()[1:]]), (IDS, [2**70, *IDS.tolist()[1:]]),
    (np.array([2**31 - 1], dtype=np.int32), [2**31 - 1]), (np.array([5], dtype=np.uint8), [5]),
    (IDS, IDS.copy()), (IDS, IDS.astype(np.int64)), (IDS.reshape(7, 1), IDS.tolist()), (IDS, [[1], [7]]),
    (IDS, ["1", *IDS.tolist()[1:]]),
])
def test_same_ids_is_array_equal(a: np.ndarray, b: Any) -> None:
    assert _same_ids(a, b) == bool(np.array_equal(a, b))
