"""Use contracts: the owner's declaration, the canonical contract, its execution plan, and the admission decision.

`prepare` turns a declaration into a contract named by its sha256; `derive_plan` fixes every call and seed from
it before any data exists; `admit` decides from a run's records under the owner's contract file.

The names below are imported when first used: a command that reads one module of the package (the contract
model, the plan) does not import admission and the statistics with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from invar.lazy import facade

if TYPE_CHECKING:
    from invar.contract.admit import admit
    from invar.contract.decide import DECISION_VERSION, EXIT_CODES, Answer, Decision
    from invar.contract.model import (
        CONTRACT_SCHEMA,
        Contract,
        Declaration,
        Package,
        parse_contract,
        parse_declaration,
        read_contract,
        read_declaration,
    )
    from invar.contract.plan import PLAN_VERSION, ExecutionPlan, PlannedCall, Unit, derive_plan, unit_seed
    from invar.contract.prepare import Prepared, load_contract, prepare

_EXPORTS: dict[str, str] = {
    "admit": "invar.contract.admit",
    "DECISION_VERSION": "invar.contract.decide",
    "EXIT_CODES": "invar.contract.decide",
    "Answer": "invar.contract.decide",
    "Decision": "invar.contract.decide",
    "CONTRACT_SCHEMA": "invar.contract.model",
    "Contract": "invar.contract.model",
    "Declaration": "invar.contract.model",
    "Package": "invar.contract.model",
    "parse_contract": "invar.contract.model",
    "parse_declaration": "invar.contract.model",
    "read_contract": "invar.contract.model",
    "read_declaration": "invar.contract.model",
    "PLAN_VERSION": "invar.contract.plan",
    "ExecutionPlan": "invar.contract.plan",
    "PlannedCall": "invar.contract.plan",
    "Unit": "invar.contract.plan",
    "derive_plan": "invar.contract.plan",
    "unit_seed": "invar.contract.plan",
    "Prepared": "invar.contract.prepare",
    "load_contract": "invar.contract.prepare",
    "prepare": "invar.contract.prepare",
}
"""Each name of the facade and the module that defines it, imported when the name is first used."""


__getattr__, __dir__ = facade(__name__, _EXPORTS, globals())

__all__ = [
    "CONTRACT_SCHEMA",
    "DECISION_VERSION",
    "EXIT_CODES",
    "PLAN_VERSION",
    "Answer",
    "Contract",
    "Decision",
    "Declaration",
    "ExecutionPlan",
    "Package",
    "PlannedCall",
    "Prepared",
    "Unit",
    "admit",
    "derive_plan",
    "load_contract",
    "parse_contract",
    "parse_declaration",
    "prepare",
    "read_contract",
    "read_declaration",
    "unit_seed",
]
