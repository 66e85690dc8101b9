"""`use plan` of an imported contract: the items its exports pair stand for the units a run would have.

The same model as a recorded contract's plan (`invar.contract.sample_size`); the item count is read from the
contract, which pins each export's count, not from the exports.
"""

from __future__ import annotations

from pathlib import Path

from invar.contract.sample_size import SampleSizePlan, assumed_for
from invar.errors import ContractError
from invar.imported.model import read_imported_contract
from invar.stats.bounds import StatisticsError
from invar.stats.planning import plan_table, power_at
from invar.stats.rows import UsePlanOutput


def plan_imported(contract: Path, stated: dict[str, float], power: float, methods: list[str] | None) \
        -> SampleSizePlan:
    """Each method's n under the stated assumption, and the contract's own method's power at the number of items its
    exports pair."""
    c, _ = read_imported_contract(contract)
    req = c.requirement
    if req.standard != "population" or req.delta is None or req.method is None:
        raise ContractError(f"{contract}: a finite-domain contract decides exactly on its items; there is no sample "
                            "size to plan")
    low, high = (-1.0, 1.0) if c.source.loss_range is None else \
        (c.source.loss_range[0] - c.source.loss_range[1], c.source.loss_range[1] - c.source.loss_range[0])
    assumed = assumed_for(stated, low, high)
    items = c.exports["reference" if "reference" in c.exports else "table"].items
    rows = plan_table(assumed, float(req.epsilon), float(req.delta), power, methods=methods)
    own: float | None = None
    if not req.sequential:
        try:
            own = power_at(req.method, items, assumed, float(req.epsilon), float(req.delta), power=power)
        except StatisticsError:
            own = None
    return SampleSizePlan(
        UsePlanOutput(contract=str(contract), contract_method=req.method, epsilon=str(req.epsilon),
                      delta=str(req.delta), rows=rows, sequential=None, contract_units=items, contract_power=own,
                      underpowered=own is not None and own < power, plot=None),
        looks=None, method_version=None, curves=None, imported=True)


__all__ = ["plan_imported"]
