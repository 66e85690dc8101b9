"""Statistics of the admission decision: confidence bounds on the mean paired loss difference, the diagnostics
reported beside them, sample-size planning, and the anytime-valid bounds and stopping rule of sequential admission.
Pure functions of the recorded numbers; no I/O."""

from invar.stats.bounds import (
    BINARY_METHODS,
    DEFAULT_BINARY_METHOD,
    METHODS,
    ORDERS,
    VERSIONS,
    Bound,
    StatisticsError,
    betting,
    bound,
    hoeffding,
    maurer_pontil,
    paired_binary_exact,
    paired_binary_score,
)
from invar.stats.diagnostics import PairedDiagnostics, mcnemar_exact_one_sided, paired_diagnostics, paired_wald
from invar.stats.planning import PlanRow, plan_row, plan_table, power_at, render_plan, required_n
from invar.stats.sequential import (
    SEQUENTIAL_METHODS,
    SEQUENTIAL_VERSIONS,
    Look,
    SequentialDecision,
    SequentialPlan,
    check_stop,
    sequence_bounds,
    sequential_decision,
    sequential_max_n,
    sequential_plan,
)

__all__ = [
    "BINARY_METHODS",
    "DEFAULT_BINARY_METHOD",
    "METHODS",
    "ORDERS",
    "SEQUENTIAL_METHODS",
    "SEQUENTIAL_VERSIONS",
    "VERSIONS",
    "Bound",
    "Look",
    "PairedDiagnostics",
    "PlanRow",
    "SequentialDecision",
    "SequentialPlan",
    "StatisticsError",
    "betting",
    "bound",
    "check_stop",
    "hoeffding",
    "maurer_pontil",
    "mcnemar_exact_one_sided",
    "paired_binary_exact",
    "paired_binary_score",
    "paired_diagnostics",
    "paired_wald",
    "plan_row",
    "plan_table",
    "power_at",
    "render_plan",
    "required_n",
    "sequence_bounds",
    "sequential_decision",
    "sequential_max_n",
    "sequential_plan",
]
