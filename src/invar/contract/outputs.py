"""The parts of a use decision's printed form that recorded and imported decisions share, and the predicate of the
receipt a decision is signed in.

A decision names its contract the same way whichever evidence it rests on; `invar.imported.outputs` and the
command outputs build on it. The receipt's predicate is one model (`ReceiptPredicate`): `invar.contract.receipt`
builds and signs it, and its schema is generated from it (docs/schemas/receipts/).
"""

from __future__ import annotations

from typing import Literal

from invar.evidence import RangeTaskLossOutput, TaskLossOutput
from invar.printed import Closed


class DecisionContract(Closed):
    name: str
    sha256: str


class PremiseOutput(Closed):
    statement: str
    party: str
    basis_sha256: str
    reliance: str
    holds: bool
    note: str


# --- the signed receipt ---------------------------------------------------------------------------------------------
# The predicate of the in-toto statement `use admit --receipt` signs (predicate type https://invar.dev/use-decision/v1):
# `invar.contract.receipt` builds it from the decision and writes it as canonical JSON, and scripts/schemas.py writes
# its schema from the same models (docs/schemas/receipts/), so the signed bytes and the published shape are one type.


class NonFiniteCallOutput(Closed):
    """A candidate generate call its worker answered with `NonFiniteOutput`: the error record a decision rests on."""

    call: str
    """The planned call's key."""
    first_unit: str
    """The unit id of the call's first request."""
    units: int
    """The units the call carries."""
    record: int
    """The record's sequence number in the run."""
    call_id: int
    """The call's id, as the worker was sent it."""
    call_digest: str
    """The digest of the call as recorded (its params are the planned call's)."""
    report_digest: str
    """The digest of the error report the worker sent, as the run's chain binds it."""
    error: str
    """`NonFiniteOutput: ` and the worker's words."""


class ReceiptRun(Closed):
    head: str
    """The run's chain head when it was decided: the anchor the receipt keeps."""
    records: int
    """How many records the run held (its closing record included)."""


class ReceiptMethod(Closed):
    name: str
    version: str


class ReceiptBound(Closed):
    n: int
    delta: float
    estimate: float
    lower: float
    upper: float


class ReceiptInvariance(Closed):
    required: bool
    layouts: list[str]
    holds: bool
    units_differing: int
    relative_to: Literal["reference"] | None = None
    """Present only when the contract judges invariance relative to the reference."""
    reference_units_differing: int | None = None
    """Relative to the reference: units the reference itself varies on across the layouts (not covered)."""
    gained_units: list[str] | None = None
    """Relative to the reference: the ids of the units that gained layout dependence, in plan order."""


class ReceiptSequential(Closed):
    version: str
    answer: str
    look: int
    stop: int
    n_max: int


class ReceiptDeterminism(Closed):
    layout: str
    runs: int
    holds: bool
    units_differing: int
    reference_units_differing: int | None
    differing_units: list[str]


class ReceiptFigures(Closed):
    standard: Literal["population", "finite-domain"]
    epsilon: str
    delta: str | None
    task_loss: TaskLossOutput | RangeTaskLossOutput
    bound: ReceiptBound | None
    invariance: ReceiptInvariance
    premises_held: list[bool]
    sequential: ReceiptSequential | None = None
    """Sequential contracts only."""
    nonfinite: NonFiniteCallOutput | None = None
    """Only when the run stopped at a candidate call answered with non-finite values: the error record that decided."""
    determinism: ReceiptDeterminism | None = None
    """Contracts that require determinism only."""


class ReceiptPredicate(Closed):
    """The predicate of a decision receipt's in-toto statement (`https://invar.dev/use-decision/v1`): what `use
    admit` decided and the figures it rests on, which `use verify` recomputes from the records and compares. The
    older `invar.receipt/1` body is this and `"schema": "invar.receipt/1"`."""

    contract: DecisionContract
    run: ReceiptRun
    plan_version: str
    decision_version: str
    method: ReceiptMethod | None
    """The bound method that decided (None for the finite-domain standard)."""
    answer: Literal["Admitted", "Violated", "Unknown"]
    reason: str
    figures: ReceiptFigures
    evidence: str
    """sha256 of the canonical JSON of [call key, call digest, report digest] per planned call that answered, in the
    decision's order (generate calls, then measurements)."""

__all__ = [
    "DecisionContract",
    "NonFiniteCallOutput",
    "PremiseOutput",
    "ReceiptBound",
    "ReceiptDeterminism",
    "ReceiptFigures",
    "ReceiptInvariance",
    "ReceiptMethod",
    "ReceiptPredicate",
    "ReceiptRun",
    "ReceiptSequential",
]
