"""A use decision's printed form (`Decision.output()`, what `use admit --json` prints less the receipt's path), the
parts of it that recorded and imported decisions share, and the predicate of the receipt a decision is signed in.

A decision names its contract the same way whichever evidence it rests on; `invar.imported.outputs` builds on it.
The receipt's predicate is one model (`ReceiptPredicate`): `invar.contract.receipt` builds and signs it, and its
schema is generated from it (docs/schemas/receipts/).
"""

from __future__ import annotations

from typing import Literal

from invar.compare.outputs import ComparisonBody, KlRequirementOutput
from invar.evidence import EvidenceOutput, RangeTaskLossOutput, TaskLossOutput
from invar.printed import Closed
from invar.stats.rows import BoundOutput, DiagnosticsOutput, RangeDiagnosticsOutput, SequentialDecisionOutput


class DecisionContract(Closed):
    name: str
    """The contract's name."""
    sha256: str
    """The contract file's sha256."""


class PremiseOutput(Closed):
    statement: str
    """What the premise states."""
    party: str
    """Who vouches for it."""
    basis_sha256: str
    """The digest of its basis."""
    reliance: str
    """`vouched` (the party's word) or `checked` (its basis file re-hashed)."""
    holds: bool
    """Whether it has its declared reliance."""
    note: str
    """How that was found."""


class SequentialSectionOutput(Closed):
    """A sequential contract's stopping rule as its plan fixes it (plan /4), before any data exists."""

    method: str
    """The stopping rule's method."""
    version: str
    """The method's version the contract fixes."""
    n_max: int
    """The most units the rule reads."""
    looks: int
    """How many looks it takes."""
    boundaries: list[int]
    """Cumulative units at the end of each look, increasing, the last equal to `n_max`."""


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


# --- the decision ---------------------------------------------------------------------------------------------------


class InvarianceOutput(Closed):
    """The invariance requirement as checked: the candidate's outputs across the declared layouts."""

    required: bool
    """Whether the contract requires it."""
    layouts: list[str]
    """The layouts compared."""
    holds: bool
    """Whether it holds."""
    units: int
    """Units compared."""
    units_differing: int
    """Units that break the requirement (relative to the reference: that gained layout dependence)."""
    first_difference: str | None
    """The first difference, in words; None where there is none."""
    covers: str
    """What the requirement covers, in words."""
    relative_to: Literal["reference"] | None = None
    """Present when the contract judges invariance relative to the reference (`invariance.relative_to`)."""
    reference_units_differing: int | None = None
    """Relative to the reference: units the reference itself varies on across the layouts (not covered)."""
    candidate_units_differing: int | None = None
    """Relative to the reference: units the candidate varies on across the layouts, gained or not."""
    gained_units: list[str] | None = None
    """Relative to the reference: the ids of the units that gained layout dependence, in plan order."""


# `decide.check_determinism` returns this model itself: the decision reads the fields it prints, spelled once.
class DeterminismOutput(Closed):
    """The determinism requirement as checked: the candidate's later runs of one layout against its first."""

    required: Literal[True]
    """Always true: present only where the contract requires it."""
    layout: str
    """The layout the candidate ran again."""
    runs: int
    """How many times it ran it, each later run in a worker started afresh."""
    holds: bool
    """Whether it holds."""
    units: int
    """Units compared."""
    units_differing: int
    """Units that break the requirement: their outputs differ between runs under the candidate (relative to the
    reference: and not under the reference)."""
    candidate_units_differing: int
    """Units whose outputs differ between runs under the candidate, counted or not."""
    relative_to: Literal["reference"] | None
    """`reference` when the reference ran the layout again too and its varying units are not counted."""
    reference_units_differing: int | None
    """Relative to the reference: units whose outputs differ between the reference's runs (not counted)."""
    first_difference: str | None
    """The first difference counted, in words; None where there is none."""
    differing_units: list[str]
    """The ids of the units counted against the candidate, in plan order."""
    covers: str
    """What the requirement covers, in words."""


class DecisionMeasurements(ComparisonBody):
    """Plan /3: the measured units compared, beside the decision."""

    requirement: KlRequirementOutput | None
    """The contract's `max_kl` requirement as checked; None when it sets none."""
    note: str
    """That the measurements decide nothing unless the contract sets `max_kl`."""


class DecisionOutput(Closed):
    """A use decision (`Decision.output()`): what `use admit --json` prints, less the receipt's path."""

    answer: Literal["Admitted", "Violated", "Unknown"]
    """The answer."""
    exit_code: Literal[0, 10, 11]
    """`use admit`'s exit status for it."""
    reason: str
    """Why, in one line."""
    decision_version: str
    """The decision procedure's version."""
    plan_version: str
    """The contract's plan version."""
    contract: DecisionContract
    """The contract decided under."""
    run: str
    """The run decided."""
    chain_head: str
    """The run's chain head when it was decided."""
    records: int
    """How many records the run holds (its closing record included)."""
    standard: Literal["population", "finite-domain"]
    """The contract's standard."""
    epsilon: str
    """ε as the contract writes it."""
    delta: str | None
    """δ as the contract writes it (None for the finite-domain standard)."""
    invariance: InvarianceOutput
    """The invariance requirement as checked."""
    premises: list[PremiseOutput]
    """Each premise as the decision relied on it."""
    task_loss: TaskLossOutput | RangeTaskLossOutput
    """0/1 losses, or (with `loss_range`) losses in the scorer's declared range."""
    bound: BoundOutput | None
    """The contract's bound on the mean loss increase (population standard only)."""
    diagnostics: DiagnosticsOutput | RangeDiagnosticsOutput | None
    """Diagnostics beside the decision, never deciding it (population standard only)."""
    evidence: list[EvidenceOutput]
    """Each answered call the decision rests on: generate calls, then measurements."""
    measurements: DecisionMeasurements | None = None
    """Plan /3 contracts only."""
    sequential: SequentialDecisionOutput | None = None
    """Sequential contracts only."""
    nonfinite: NonFiniteCallOutput | None = None
    """Only when the run stopped at a candidate call answered with non-finite values: that call, which decides."""
    determinism: DeterminismOutput | None = None
    """Contracts that require determinism only (absent when the run stopped at a non-finite call)."""


__all__ = [
    "DecisionContract",
    "DecisionMeasurements",
    "DecisionOutput",
    "DeterminismOutput",
    "InvarianceOutput",
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
    "SequentialSectionOutput",
]
