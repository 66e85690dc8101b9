"""`use summary`: what each side of an imported pair scored, as `invar evaluate` reports a policy, and the paired
table, from the exports an imported contract pins.

Decision: a summary describes the evidence and decides nothing, and is the output model `use summary` prints
(`invar.imported.outputs.UseSummaryOutput`), so its text and its --json are one spelling. Each side's accuracy
(0/1 losses) carries the Clopper–Pearson interval `invar evaluate` reports, a graded side's mean loss the betting
interval it reports; the paired table counts the items the candidate made worse, better and left alone. The exports
are re-read and checked against the contract's digests first, exactly as `use admit` reads them, so a summary is
never of other files than the decision's.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Literal

import numpy as np

from invar.imported.decide import read_pinned
from invar.imported.outputs import PairedSummaryOutput, SideSummaryOutput, UseSummaryOutput
from invar.stats.bounds import betting
from invar.stats.intervals import clopper_pearson

SUMMARY_VERSION = "invar.imported-summary/1"
"""Names what the summary reports and how its intervals are computed."""


def _mean(values: tuple[float, ...]) -> float:
    return float(sum((Fraction(v) for v in values), Fraction(0)) / len(values))


def _side(role: Literal["reference", "candidate"], losses: tuple[float, ...], loss: str, fmt: str,
          loss_range: tuple[float, float] | None, confidence: float) -> SideSummaryOutput:
    n = len(losses)
    mean_loss = _mean(losses)
    mean_score = None if fmt == "table" else (1.0 - mean_loss if loss == "one-minus" else mean_loss)
    if loss_range is None:
        correct = sum(1 for x in losses if x == 0.0)
        return SideSummaryOutput(role=role, items=n, mean_loss=mean_loss, mean_score=mean_score, correct=correct,
                                 interval=list(clopper_pearson(correct, n, confidence)),
                                 interval_method="clopper-pearson")
    low, high = loss_range
    # Two one-sided bounds at (1 − confidence)/2 each, as `invar evaluate` reports a graded mean loss.
    b = betting(np.asarray(losses, dtype=np.float64), low, high, (1.0 - confidence) / 2.0, order="plan")
    return SideSummaryOutput(role=role, items=n, mean_loss=mean_loss, mean_score=mean_score, correct=None,
                             interval=[b.lower, b.upper], interval_method="betting")


def summarise_imported(contract_path: str | os.PathLike[str], confidence: float = 0.95) -> UseSummaryOutput:
    """Describe the pair an imported contract pins, as `use summary` prints it; `EvidenceError` (one line) for any
    defect of the exports."""
    pinned = read_pinned(contract_path)
    c, paired = pinned.contract, pinned.paired
    src = c.source
    loss_range = None if src.loss_range is None else (src.loss_range[0], src.loss_range[1])
    sides = (_side("reference", paired.reference, src.loss, src.format, loss_range, confidence),
             _side("candidate", paired.candidate, src.loss, src.format, loss_range, confidence))
    pairs = list(zip(paired.reference, paired.candidate, strict=True))
    worse = sum(1 for r, k in pairs if k > r)
    better = sum(1 for r, k in pairs if k < r)
    binary = loss_range is None
    both_right = sum(1 for r, k in pairs if r == k == 0.0) if binary else None
    both_wrong = sum(1 for r, k in pairs if r == k == 1.0) if binary else None
    increase = float(sum((Fraction(k) - Fraction(r) for r, k in pairs), Fraction(0)) / len(pairs))
    exports = list(pinned.evidence(role for role in ("reference", "candidate", "table") if role in pinned.files))
    return UseSummaryOutput.model_validate({
        "summary_version": SUMMARY_VERSION, "evidence": "imported",
        "contract": {"name": c.name, "sha256": pinned.sha256}, "format": src.format, "metric": src.metric,
        "loss": src.loss, "loss_range": None if loss_range is None else list(loss_range), "confidence": confidence,
        "sides": list(sides),
        "paired": PairedSummaryOutput(items=len(pairs), worse=worse, better=better, ties=len(pairs) - worse - better,
                                      both_right=both_right, both_wrong=both_wrong, mean_increase=increase),
        "exports": exports})

__all__ = ["SUMMARY_VERSION", "summarise_imported"]
