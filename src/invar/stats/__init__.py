"""Statistics of the admission decision: confidence bounds on the mean paired loss difference, the diagnostics
reported beside them, sample-size planning, and the anytime-valid bounds and stopping rule of sequential admission.
Pure functions of the recorded numbers; no I/O.

The names below are imported when first used: a module that needs the bounds does not import planning and the
sequential rules with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from invar.lazy import facade

if TYPE_CHECKING:
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
    from invar.stats.diagnostics import (
        PairedDiagnostics,
        RangeDiagnostics,
        mcnemar_exact_one_sided,
        paired_diagnostics,
        paired_wald,
        range_diagnostics,
    )
    from invar.stats.planning import Assumed, PlanRow, Search, plan_row, plan_table, power_at, render_plan, required_n
    from invar.stats.sequential import (
        BINARY_SEQUENTIAL_METHODS,
        SEQUENTIAL_METHODS,
        SEQUENTIAL_VERSIONS,
        Look,
        SequentialDecision,
        SequentialPlanRow,
        check_stop,
        sequence_bounds,
        sequential_decision,
        sequential_max_n,
        sequential_plan,
    )

_EXPORTS: dict[str, str] = {
    "BINARY_METHODS": "invar.stats.bounds",
    "DEFAULT_BINARY_METHOD": "invar.stats.bounds",
    "METHODS": "invar.stats.bounds",
    "ORDERS": "invar.stats.bounds",
    "VERSIONS": "invar.stats.bounds",
    "Bound": "invar.stats.bounds",
    "StatisticsError": "invar.stats.bounds",
    "betting": "invar.stats.bounds",
    "bound": "invar.stats.bounds",
    "hoeffding": "invar.stats.bounds",
    "maurer_pontil": "invar.stats.bounds",
    "paired_binary_exact": "invar.stats.bounds",
    "paired_binary_score": "invar.stats.bounds",
    "PairedDiagnostics": "invar.stats.diagnostics",
    "RangeDiagnostics": "invar.stats.diagnostics",
    "mcnemar_exact_one_sided": "invar.stats.diagnostics",
    "paired_diagnostics": "invar.stats.diagnostics",
    "paired_wald": "invar.stats.diagnostics",
    "range_diagnostics": "invar.stats.diagnostics",
    "Assumed": "invar.stats.planning",
    "PlanRow": "invar.stats.planning",
    "Search": "invar.stats.planning",
    "plan_row": "invar.stats.planning",
    "plan_table": "invar.stats.planning",
    "power_at": "invar.stats.planning",
    "render_plan": "invar.stats.planning",
    "required_n": "invar.stats.planning",
    "BINARY_SEQUENTIAL_METHODS": "invar.stats.sequential",
    "SEQUENTIAL_METHODS": "invar.stats.sequential",
    "SEQUENTIAL_VERSIONS": "invar.stats.sequential",
    "Look": "invar.stats.sequential",
    "SequentialDecision": "invar.stats.sequential",
    "SequentialPlanRow": "invar.stats.sequential",
    "check_stop": "invar.stats.sequential",
    "sequence_bounds": "invar.stats.sequential",
    "sequential_decision": "invar.stats.sequential",
    "sequential_max_n": "invar.stats.sequential",
    "sequential_plan": "invar.stats.sequential",
}
"""Each name of the facade and the module that defines it, imported when the name is first used."""


__getattr__, __dir__ = facade(__name__, _EXPORTS, globals())

__all__ = [
    "BINARY_METHODS",
    "BINARY_SEQUENTIAL_METHODS",
    "DEFAULT_BINARY_METHOD",
    "METHODS",
    "ORDERS",
    "SEQUENTIAL_METHODS",
    "SEQUENTIAL_VERSIONS",
    "VERSIONS",
    "Assumed",
    "Bound",
    "Look",
    "PairedDiagnostics",
    "PlanRow",
    "RangeDiagnostics",
    "Search",
    "SequentialDecision",
    "SequentialPlanRow",
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
    "range_diagnostics",
    "render_plan",
    "required_n",
    "sequence_bounds",
    "sequential_decision",
    "sequential_max_n",
    "sequential_plan",
]
