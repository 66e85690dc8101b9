"""What the commands print of the statistics: one bound method's planned sample size, a sequential stopping plan and
the whole plan (`use plan`); a bound, the diagnostics and a stopping rule's decision as a decision shows them.

The planning functions return these models and `use plan --json` prints them as they are; `Bound`,
`PairedDiagnostics`, `RangeDiagnostics` and `SequentialDecision` give theirs (`output()`) to the decisions that
print them (one spelling each).
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


class UsePlanOutput(Closed):
    """`invar use plan --json`."""

    contract: str
    contract_method: str
    epsilon: str
    delta: str
    rows: list[PlanRow]
    sequential: SequentialPlanRow | None
    contract_units: int | None = None
    """The units the contract runs (at most, for a sequential contract)."""
    contract_power: float | None = None
    """The contract's own method's power at `contract_units` under the assumption; None for a sequential contract,
    a method the assumption cannot plan, or n at least twice the planned n (far past the target)."""
    underpowered: bool = False
    """`contract_power` is below the target power: the contract's own n is too small for this assumption."""
    plot: str | None = None
    """The PNG `--plot` drew (power against n per method), if any."""


class BoundOutput(Closed):
    method: str
    version: str
    n: int
    delta: float
    estimate: float
    lower: float
    upper: float


class WaldOutput(Closed):
    confidence: float
    lower: float
    upper: float


class McNemarOutput(Closed):
    worse: int
    better: int
    p: float


class HoeffdingOutput(Closed):
    version: str
    delta: float
    lower: float
    upper: float


class DiagnosticsOutput(Closed):
    paired_wald: WaldOutput
    mcnemar_exact_one_sided: McNemarOutput
    hoeffding: HoeffdingOutput
    note: str


class RangeDiagnosticsOutput(Closed):
    """Diagnostics for losses in a declared range: McNemar's test counts 0/1 losses, so it is left out."""

    paired_wald: WaldOutput
    hoeffding: HoeffdingOutput
    note: str


class SequentialLook(Closed):
    n: int
    lower: float
    upper: float


class SequentialDecisionOutput(Closed):
    method: str
    version: str
    answer: str
    look: int
    stop: int
    n_max: int
    delta: float
    reason: str
    looks: list[SequentialLook]


__all__ = [
    "BoundOutput",
    "DiagnosticsOutput",
    "HoeffdingOutput",
    "McNemarOutput",
    "PlanRow",
    "RangeDiagnosticsOutput",
    "SequentialDecisionOutput",
    "SequentialLook",
    "SequentialPlanRow",
    "UsePlanOutput",
    "WaldOutput",
]
