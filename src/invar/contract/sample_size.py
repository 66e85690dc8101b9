"""The sample size a contract needs: `use plan`'s work, from the contract file to the model it prints.

Decision: each bound method's n comes from `invar.stats.planning` under the owner's stated assumption; what is the
contract's own (its unit count without reading the population, its declared loss range, its method's power at its
own n, the stopping plan of a sequential contract) is read here, once, so that the command only parses its options,
shows progress and prints. An imported contract's plan (`invar.imported.plan`) returns the same model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from invar import canonical
from invar.contract.model import Contract, loss_span
from invar.contract.plan_inputs import declared_difference_range, load_for_planning, range_methods
from invar.errors import ContractError, InvarError
from invar.stats.bounds import StatisticsError
from invar.stats.planning import (
    Assumed,
    PowerCurve,
    normal_n,
    plan_table,
    plan_table_beside,
    planned_methods,
    power_at,
    power_curves,
)
from invar.stats.rows import PlanRow, SequentialPlanRow, UsePlanOutput
from invar.stats.sequential import sequential_plan


class PlanningProgress(Protocol):
    """What a plan says while it computes (`use plan` shows it once planning takes long)."""

    def expect(self, assumed: Assumed, methods: Sequence[str] | None) -> None:
        """Planning begins: these methods (None: every method the assumption plans)."""

    def row(self, row: PlanRow) -> None:
        """One method's row is ready."""

    def simulating(self, horizon: int | None, runs: int = 0) -> None:
        """The stopping-n simulation of `runs` runs up to `horizon` units begins (None: none is asked for)."""

    def simulated(self, runs: int) -> None:
        """The stopping-n simulation has finished this many of its runs."""


@dataclass(frozen=True)
class SampleSizePlan:
    """A contract's plan: the model `use plan --json` prints, and what its lines say beside it."""

    output: UsePlanOutput
    looks: int | None
    """A sequential contract's number of looks (one after each pairing call); None for a fixed-n contract."""
    method_version: str | None
    """The contract's method and its version, as a sequential contract names its rule."""
    curves: list[PowerCurve] | None
    """Power against n per method, when a plot was asked for."""
    imported: bool = False
    """An imported contract's plan: its units are the items its exports pair (`invar.imported.plan`)."""


SEQUENTIAL_MAX = 1 << 24
"""The largest `--sequential-max`: the bound on a contract's `requirement.max_n`."""

CLOSED_FORMS = frozenset({"hoeffding", "maurer-pontil"})
"""Methods whose plan is short once the binomial routines are loaded (Hoeffding's milliseconds, Maurer-Pontil's a
tenth or two of a second): alone, the contract's power follows their plan as before (`_contract_power_beside`)."""

SEQUENTIAL_RUNS = 1000
"""The simulated runs of a stopping-n plan (`--sequential-max`)."""


def assumed_for(stated: dict[str, float], low: float, high: float) -> Assumed:
    """The statistics' assumption from `--assume`'s values, the paired differences lying in [low, high]; refused in
    one line when worse=/better= (0/1 losses) is stated for differences that are not 0/1."""
    if (low, high) != (-1.0, 1.0) and "variance" not in stated:
        raise InvarError(f"--assume worse=/better= describes 0/1 losses, but this contract's differences lie in "
                         f"[{low:g}, {high:g}]; state --assume 'variance=... mean=...' of the difference")
    return Assumed(stated.get("p_worse"), stated.get("p_better"), stated.get("variance"), stated.get("mean", 0.0),
                   low, high)


def plan_sample_size(contract: Path, stated: dict[str, float], power: float, methods: list[str] | None, *,
                     sequential_max: int | None, plot: Path | None,
                     progress: PlanningProgress | None = None) -> SampleSizePlan:
    """Each method's n to admit `contract` at `power` under `stated` (`--assume`'s values), the contract's own
    method's power at its own n, the stopping plan up to `sequential_max` (or the contract's `requirement.max_n`),
    and the power curves when `plot` names where they will be drawn. Every bad input is refused before planning."""
    c, units, looks = load_for_planning(contract)  # the unit count without reading the population
    req = c.requirement
    if req.standard != "population" or req.delta is None:
        raise ContractError(f"{contract}: a finite-domain contract decides exactly on its units; there is no "
                            "sample size to plan")
    low, high = declared_difference_range(c)
    assumed = assumed_for(stated, low, high)
    if methods is None and loss_span(c.scorer) is not None and "variance" not in stated:
        methods = list(range_methods(False))  # the binary methods cannot decide this contract's losses
    horizon = _sequential_horizon(c, stated, sequential_max)
    if progress is not None:
        progress.expect(assumed, methods)
    done = None if progress is None else progress.row
    beside = _contract_power_beside(c, units, looks, assumed, power, methods)
    if beside is None:
        rows = plan_table(assumed, float(req.epsilon), float(req.delta), power, methods=methods, done=done)
        own = _contract_power(c, units, looks, rows, assumed, power)
    else:
        rows, early = plan_table_beside(assumed, float(req.epsilon), float(req.delta), power, beside,
                                        methods=methods, done=done)
        own = _contract_power(c, units, looks, rows, assumed, power, early)
    curves = None if plot is None else power_curves(rows, assumed, extra=[units])
    if progress is not None:
        progress.simulating(horizon, SEQUENTIAL_RUNS)
    stops = _sequential_plan(c, looks, stated, horizon, None if progress is None else progress.simulated)
    return SampleSizePlan(
        UsePlanOutput(contract=str(contract), contract_method=req.method, epsilon=str(req.epsilon),
                      delta=str(req.delta), rows=rows, sequential=stops, contract_units=units, contract_power=own,
                      underpowered=own is not None and own < power, plot=None if plot is None else str(plot)),
        looks=None if looks is None else len(looks), method_version=c.method_version, curves=curves)


def _contract_power(c: Contract, units: int, looks: tuple[int, ...] | None, rows: list[PlanRow], assumed: Assumed,
                    target: float, early: tuple[float | None] | None = None) -> float | None:
    """The contract's own method's power at the contract's own n under the stated assumption. None for a sequential
    contract (its stopping plan says how many it stops at), a method the assumption cannot plan, and an n at least
    twice the method's planned n, far past the target (the exact methods' cost grows with n). `early`: that power
    as `_contract_power_beside`'s call computed it beside the table (the same function of the same inputs), kept
    only where these rules keep it."""
    req = c.requirement
    if looks is not None or req.method is None or req.delta is None:
        return None
    planned = next((r.n for r in rows if r.method == req.method), None)
    if planned is not None and units >= 2 * planned:
        return None
    return early[0] if early is not None else _power_or_none(req.method, units, assumed, float(req.epsilon),
                                                             float(req.delta), target)


def _power_or_none(method: str, units: int, assumed: Assumed, epsilon: float, delta: float,
                   target: float) -> float | None:
    try:
        return power_at(method, units, assumed, epsilon, delta, power=target)
    except StatisticsError:
        return None


def _contract_power_beside(c: Contract, units: int, looks: tuple[int, ...] | None, assumed: Assumed,
                           target: float, methods: Sequence[str] | None) -> Callable[[], tuple[float | None]] | None:
    """The contract's own power as a call to compute beside the methods' plans, where the table takes long enough
    to hide it (several methods, or one of the long ones: betting or an exact method, not one of `CLOSED_FORMS`)
    and the contract's n is below twice the z-test's n: no method plans much fewer units than that, so the power is
    almost always wanted (`_contract_power` drops it where the planned n says so), and it is never an n so far past
    the plans that computing it would cost more than the table. None: computed after the table, if at all, as
    before."""
    req = c.requirement
    planned = planned_methods(assumed, methods)
    if looks is not None or req.method is None or req.delta is None or set(planned) <= CLOSED_FORMS:
        return None
    try:
        if units >= 2 * normal_n(assumed, float(req.epsilon), float(req.delta), target):
            return None
    except StatisticsError:
        return None  # the table refuses these inputs in its own words
    return partial(_one_power, req.method, units, assumed, float(req.epsilon), float(req.delta), target)


def _one_power(method: str, units: int, assumed: Assumed, epsilon: float, delta: float,
               target: float) -> tuple[float | None]:
    return (_power_or_none(method, units, assumed, epsilon, delta, target),)


def _sequential_horizon(c: Contract, stated: dict[str, float], n_max: int | None) -> int | None:
    """The n_max a stopping-n plan is asked for (--sequential-max, or a contract's `requirement.max_n`), checked
    before any planning starts, so a bad one is refused in one line; None when neither asks for one."""
    horizon = n_max if n_max is not None else c.requirement.max_n
    if horizon is None:
        return None
    if horizon > SEQUENTIAL_MAX:  # the simulation's counters are 64-bit: a larger n would overflow, not plan
        raise InvarError(f"--sequential-max {canonical.show(horizon, 40)}: at most {SEQUENTIAL_MAX:,} units, the "
                         "most a sequential contract's requirement.max_n may be; choose a smaller n")
    if "p_worse" not in stated or "p_better" not in stated:
        raise InvarError("--sequential-max plans 0/1 losses: state --assume 'worse=... better=...'")
    return horizon


def _sequential_plan(c: Contract, looks: tuple[int, ...] | None, stated: dict[str, float], horizon: int | None,
                     done: Callable[[int], None] | None = None) -> SequentialPlanRow | None:
    """The stopping-n plan at `horizon` (`_sequential_horizon`'s), looking after each batch of the pairing layout;
    None when none is asked for. `done` is told the runs simulated so far."""
    req = c.requirement
    if horizon is None:
        return None
    assert req.delta is not None
    method = req.method if req.sequential and req.method is not None else "paired-binary-sequence"
    # A sequential contract looks after each pairing call (its plan's first look); else after each pairing batch.
    look = c.layouts[c.pairing.layout].batch_size if looks is None else looks[0]
    return sequential_plan(method, stated["p_worse"], stated["p_better"], float(req.epsilon), float(req.delta),
                           int(horizon), batch=min(int(horizon), look), runs=SEQUENTIAL_RUNS, done=done)


__all__ = ["SEQUENTIAL_MAX", "PlanningProgress", "SampleSizePlan", "assumed_for", "plan_sample_size"]
