"""`max_kl`: a capture decides only beyond its numerical error bound; within it, the answer is undecided."""

from __future__ import annotations

from decimal import Decimal

import numpy as np

from invar.compare.measured import kl_requirement
from invar.compare.metrics import CaptureComparison, compare_sequences
from invar.compare.numerical import NumericalComparison, UnitResult


def _result(*kls: tuple[float, float]) -> NumericalComparison:
    t = np.array([4, 2], dtype=np.int32)
    lp = np.array([-0.1, -0.2], dtype=np.float32)
    seq = compare_sequences(t, lp, t, lp)
    caps = tuple(CaptureComparison(step, kl, kl, bound, bound, True, 0.0, False)
                 for step, (kl, bound) in enumerate(kls))
    unit = UnitResult("u-1", "2+2=", "4", "4", (4, 2), (4, 2), seq, 0, 0, None, caps, None)
    return NumericalComparison((unit,), 0.01, "reference")


def test_within_the_bound_of_the_limit_is_undecided_beyond_it_decides() -> None:
    limit = Decimal("0.001")
    assert kl_requirement(_result((0.0009, 1e-6)), limit).holds
    unsure = kl_requirement(_result((0.0009, 1e-6), (0.0010000005, 1e-6)), limit)
    assert (unsure.holds, unsure.violated) == (False, False)
    assert unsure.worst is not None
    assert unsure.worst.startswith("unit u-1 step 1")
    over = kl_requirement(_result((0.0010000005, 1e-6), (0.002, 1e-6)), limit)
    assert (over.holds, over.violated, over.captures) == (False, True, 2)
    assert over.worst is not None
    assert "step 1" in over.worst
    assert kl_requirement(_result((float("inf"), float("inf"))), limit).violated
