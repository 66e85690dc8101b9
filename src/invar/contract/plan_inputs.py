"""What `use plan` reads of a contract: its unit count and looks without the population, its declared difference
range, and the methods that take losses in any range.

Decision: kept apart from `invar.contract.prepare`, whose imports (the execution plan's tokenizers and chat
templates, the worker protocol, the scorers) cost every plan about a tenth of a CPU second it does not use; the
execution plan is imported only for a sequential contract's looks.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from invar.contract.model import Contract, declared_loss_range, read_contract
from invar.stats.bounds import BINARY_METHODS, METHODS
from invar.stats.sequential import BINARY_SEQUENTIAL_METHODS, SEQUENTIAL_METHODS


def range_methods(sequential: bool) -> tuple[str, ...]:
    """The bound methods (fixed-n, or sequential) that take losses in any declared range, not only 0/1."""
    if sequential:
        return tuple(m for m in SEQUENTIAL_METHODS if m not in BINARY_SEQUENTIAL_METHODS)
    return tuple(m for m in METHODS if m not in BINARY_METHODS)


def declared_difference_range(contract: Contract) -> tuple[float, float]:
    """`difference_range` of the contract's scorer, read from its declared settings without loading its file (as
    `use plan` reads a contract): [-1, 1] for 0/1 losses."""
    declared = declared_loss_range(contract.scorer)
    if declared is None:
        return -1.0, 1.0
    low, high = declared
    return low - high, high - low


def load_for_planning(path: str | os.PathLike[str]) -> tuple[Contract, int, tuple[int, ...] | None]:
    """What `use plan` needs of a contract: the contract, the number of units a run uses and, for a sequential
    contract, the units covered at the end of each look (`plan.sequential.boundaries`).

    The same numbers as `load_contract`'s plan, without reading the population (most of that command's time): the
    contract fixes the population's size and sample, and its digest seals them; the unit count and the looks depend
    on those and on the layouts only, never on the problems themselves.
    """
    contract, _ = read_contract(Path(path))
    population = contract.population
    units = population.size if population.sample is None else population.sample
    looks = None
    if contract.requirement.sequential:  # a look after each pairing call, as `derive_plan` cuts them
        from invar.contract.plan import call_groups

        groups = call_groups(contract, units, contract.pairing.layout)
        looks = tuple(itertools.accumulate(sum(len(batch) for batch in group) for group in groups))
    return contract, units, looks


__all__ = ["declared_difference_range", "load_for_planning", "range_methods"]
