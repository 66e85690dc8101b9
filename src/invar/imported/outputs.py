"""What `use summary` prints of an imported pair, and how a decision names each export it read.

`invar.imported.summary` returns `UseSummaryOutput` and `use summary --json` prints it as it is (one spelling).
"""

from __future__ import annotations

from typing import Literal

from invar.contract.outputs import DecisionContract, PremiseOutput
from invar.evidence import RangeTaskLossOutput, TaskLossOutput
from invar.printed import Closed
from invar.stats.rows import BoundOutput, DiagnosticsOutput, RangeDiagnosticsOutput, SequentialDecisionOutput


class ExportEvidenceOutput(Closed):
    """One export as the imported decision read it."""

    role: Literal["reference", "candidate", "table"]
    path: str
    sha256: str
    items: int
    exporter: str
    """Who computed the scores, as the file says."""


class SideSummaryOutput(Closed):
    """One side of an imported pair, as `invar evaluate` reports a policy."""

    role: Literal["reference", "candidate"]
    items: int
    mean_loss: float
    """The mean loss under the contract's mapping (exact sum, correctly rounded)."""
    mean_score: float | None
    """The mean score the exporter wrote; null for a table, which gives losses."""
    correct: int | None
    """0/1 losses: the items with loss 0; null for graded losses."""
    interval: list[float]
    """Accuracy's Clopper–Pearson interval (0/1 losses), or the mean loss's betting interval (graded)."""
    interval_method: Literal["clopper-pearson", "betting"]


class PairedSummaryOutput(Closed):
    """The paired table of an imported pair."""

    items: int
    worse: int
    """Items whose loss the candidate raised."""
    better: int
    """Items whose loss the candidate lowered."""
    ties: int
    both_right: int | None
    """0/1 losses: ties with loss 0 on both sides."""
    both_wrong: int | None
    """0/1 losses: ties with loss 1 on both sides."""
    mean_increase: float


class UseSummaryOutput(Closed):
    """`invar use summary CONTRACT --json`: an imported pair described (decides nothing; exit 0)."""

    summary_version: str
    evidence: Literal["imported"]
    contract: DecisionContract
    format: Literal["lm-eval", "inspect", "table"]
    metric: str | None
    loss: Literal["one-minus", "identity"]
    loss_range: list[float] | None
    confidence: float
    sides: list[SideSummaryOutput]
    """The reference, then the candidate."""
    paired: PairedSummaryOutput
    exports: list[ExportEvidenceOutput]


class UseAdmitImportedOutput(Closed):
    """`invar use admit --contract C --json` of an imported contract (`ImportedDecision.output()`; exit 0 Admitted,
    10 Violated, 11 Unknown). No run, records or chain head: the scores are the exporter's word."""

    answer: Literal["Admitted", "Violated", "Unknown"]
    exit_code: Literal[0, 10, 11]
    reason: str
    evidence: Literal["imported"]
    """Always `imported`: never a recorded decision."""
    decision_version: str
    contract: DecisionContract
    format: Literal["lm-eval", "inspect", "table"]
    metric: str | None
    order: Literal["unverified", "sampling"]
    standard: Literal["population", "finite-domain"]
    epsilon: str
    delta: str | None
    exports: list[ExportEvidenceOutput]
    premises: list[PremiseOutput]
    """The exporter's word on each export's scores first, then the contract's premises."""
    task_loss: TaskLossOutput | RangeTaskLossOutput
    bound: BoundOutput | None
    diagnostics: DiagnosticsOutput | RangeDiagnosticsOutput | None
    sequential: SequentialDecisionOutput | None


__all__ = ["ExportEvidenceOutput", "PairedSummaryOutput", "SideSummaryOutput", "UseAdmitImportedOutput",
           "UseSummaryOutput"]
