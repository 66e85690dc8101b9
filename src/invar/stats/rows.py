"""The rows `use plan` prints: one bound method's planned sample size, and a sequential stopping plan.

The planning functions return these models and `use plan --json` prints them as they are (one spelling each).
"""

from __future__ import annotations

from invar.printed import Closed


class PlanRow(Closed):
    method: str
    version: str
    n: int
    """Smallest number of paired units at which P(upper bound ≤ ε) ≥ power_target."""
    power: float
    power_target: float
    epsilon: float
    delta: float
    assumption: str
    basis: str


class SequentialPlanRow(Closed):
    method: str
    version: str
    n_max: int
    batch: int
    runs: int
    admitted: float
    violated: float
    unknown: float
    expected_n: float
    expected_n_error: float
    p90_n: int
    basis: str


__all__ = ["PlanRow", "SequentialPlanRow"]
