"""Statistics of the admission decision: confidence bounds on the mean paired loss difference, the diagnostics
reported beside them, and sample-size planning. Pure functions of the recorded numbers; no I/O."""

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

__all__ = [
    "BINARY_METHODS",
    "DEFAULT_BINARY_METHOD",
    "METHODS",
    "ORDERS",
    "VERSIONS",
    "Bound",
    "PairedDiagnostics",
    "PlanRow",
    "StatisticsError",
    "betting",
    "bound",
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
]
