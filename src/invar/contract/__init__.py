"""Use contracts: the owner's declaration, the canonical contract, its execution plan, and the admission decision.

`prepare` turns a declaration into a contract named by its sha256; `derive_plan` fixes every call and seed from
it before any data exists; `admit` decides from a run's records under the owner's contract file.
"""

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
