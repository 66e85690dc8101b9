"""The planner's faster paths give the figures of the paths they replace, to the bit: paired-binary-exact's power
with its first proofs computed ahead of the scan (split over the cores inside `forked()`) against the scan proving
each case as it comes, on a grid of assumptions, ε and n. (Betting's table against its simulation:
test_betting_table.py.)"""

from __future__ import annotations

import pytest

from invar.parallel import forked
from invar.stats import planning

GRID = [  # p_worse, p_better, ε, δ, n
    (0.05, 0.05, 0.1, 0.05, 150), (0.05, 0.05, 0.1, 0.05, 320), (0.1, 0.05, 0.1, 0.05, 200),
    (0.02, 0.01, 0.05, 0.01, 500), (0.0, 0.01, 0.005, 0.05, 400), (0.01, 0.01, 0.02, 0.1, 800),
    (0.003, 0.001, 0.005, 0.05, 2500),
]


def _power(case: tuple[float, float, float, float, int]) -> float:
    pw, pb, eps, dlt, n = case
    assumption = planning._assumption(pw, pb, None, 0.0, -1.0, 1.0)
    return planning._ExactPlanner(assumption, eps, dlt).power(n)


@pytest.mark.parametrize("case", GRID, ids=str)
def test_exact_power_with_its_first_proofs_ahead_is_the_scans(case: tuple[float, float, float, float, int],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = _power(case)
    with forked():
        spread = _power(case)
    monkeypatch.setattr(planning, "_proof_statuses", lambda *_args: {})  # the scan proves every case itself
    scanned = _power(case)
    assert ahead.hex() == spread.hex() == scanned.hex()
    assert 0.0 < scanned < 1.0
