"""Statistics of the admission decision: confidence bounds on the mean paired loss difference, the diagnostics
reported beside them, and sample-size planning. Pure functions of the recorded numbers; no I/O."""

from invar.stats.bounds import (
    DEFAULT_BINARY_METHOD,
    METHODS,
    VERSIONS,
    Bound,
    StatisticsError,
    betting,
    bound,
    hoeffding,
    maurer_pontil,
    paired_binary_exact,
)
from invar.stats.diagnostics import PairedDiagnostics, mcnemar_exact_one_sided, paired_diagnostics, paired_wald
from invar.stats.planning import PlanRow, plan_row, plan_table, power_at, render_plan, required_n

__all__ = [
    "DEFAULT_BINARY_METHOD",
    "METHODS",
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
    "paired_diagnostics",
    "paired_wald",
    "plan_row",
    "plan_table",
    "power_at",
    "render_plan",
    "required_n",
]
