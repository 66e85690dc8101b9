"""`use summary`: what each side of an imported pair scored, as `invar evaluate` reports a policy, and the paired
table, from the exports an imported contract pins.

Decision: a summary describes the evidence and decides nothing. Each side's accuracy (0/1 losses) carries the
Clopper–Pearson interval `invar evaluate` reports, a graded side's mean loss the betting interval it reports; the
paired table counts the items the candidate made worse, better and left alone. The exports are re-read and checked
against the contract's digests first, exactly as `use admit` reads them, so a summary is never of other files than
the decision's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from invar.imported.decide import read_pinned
from invar.stats.bounds import betting
from invar.stats.intervals import clopper_pearson

SUMMARY_VERSION = "invar.imported-summary/1"
"""Names what the summary reports and how its intervals are computed."""


@dataclass(frozen=True)
class SideSummary:
    """One side's items as the exporter scored them."""

    role: str
    items: int
    mean_loss: float
    """The mean of the losses the declared mapping gives (exact sum, correctly rounded)."""
    mean_score: float | None
    """The mean score the exporter wrote (1 − loss for `one-minus`, the loss for `identity`); none for a table."""
    correct: int | None
    """0/1 losses: the items with loss 0."""
    interval: tuple[float, float]
    """Accuracy's Clopper–Pearson interval (0/1 losses), or the mean loss's betting interval (graded)."""
    interval_method: str

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "items": self.items, "mean_loss": self.mean_loss, "mean_score": self.mean_score,
                "correct": self.correct, "interval": list(self.interval), "interval_method": self.interval_method}


@dataclass(frozen=True)
class ImportedSummary:
    """An imported pair described: each side, the paired table, and the exports it was read from."""

    contract_name: str
    contract_sha256: str
    source_format: str
    metric: str | None
    loss: str
    loss_range: tuple[float, float] | None
    confidence: float
    sides: tuple[SideSummary, SideSummary]
    worse: int
    """Items whose loss the candidate raised."""
    better: int
    """Items whose loss the candidate lowered."""
    ties: int
    """Items with the same loss on both sides."""
    both_right: int | None
    """0/1 losses: items both sides got right (loss 0); the ties are these and `both_wrong`."""
    both_wrong: int | None
    mean_increase: float
    exports: tuple[dict[str, Any], ...]
    """Each pinned file: role, path, sha256, items, and the exporter (harness and version) as the file says."""
    version: str = SUMMARY_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "summary_version": self.version, "evidence": "imported",
            "contract": {"name": self.contract_name, "sha256": self.contract_sha256},
            "format": self.source_format, "metric": self.metric, "loss": self.loss,
            "loss_range": None if self.loss_range is None else list(self.loss_range), "confidence": self.confidence,
            "sides": [s.to_json() for s in self.sides],
            "paired": {"items": self.worse + self.better + self.ties, "worse": self.worse, "better": self.better,
                       "ties": self.ties, "both_right": self.both_right, "both_wrong": self.both_wrong,
                       "mean_increase": self.mean_increase},
            "exports": list(self.exports),
        }


def _mean(values: tuple[float, ...]) -> float:
    return float(sum((Fraction(v) for v in values), Fraction(0)) / len(values))


def _side(role: str, losses: tuple[float, ...], loss: str, fmt: str, loss_range: tuple[float, float] | None,
          confidence: float) -> SideSummary:
    n = len(losses)
    mean_loss = _mean(losses)
    mean_score = None if fmt == "table" else (1.0 - mean_loss if loss == "one-minus" else mean_loss)
    if loss_range is None:
        correct = sum(1 for x in losses if x == 0.0)
        return SideSummary(role, n, mean_loss, mean_score, correct, clopper_pearson(correct, n, confidence),
                           "clopper-pearson")
    low, high = loss_range
    # Two one-sided bounds at (1 − confidence)/2 each, as `invar evaluate` reports a graded mean loss.
    b = betting(np.asarray(losses, dtype=np.float64), low, high, (1.0 - confidence) / 2.0, order="plan")
    return SideSummary(role, n, mean_loss, mean_score, None, (b.lower, b.upper), "betting")


def summarise_imported(contract_path: str | os.PathLike[str], confidence: float = 0.95) -> ImportedSummary:
    """Describe the pair an imported contract pins; `EvidenceError` (one line) for any defect of the exports."""
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
    exports = tuple({"role": role, "path": str(path), "sha256": sha,
                     "items": len(pinned.exports.get(role, pinned.exports["reference"]).items),
                     "exporter": pinned.exports.get(role, pinned.exports["reference"]).exporter}
                    for role in ("reference", "candidate", "table") if role in pinned.files
                    for path, _, sha in [pinned.files[role]])
    return ImportedSummary(c.name, pinned.sha256, src.format, src.metric, src.loss, loss_range, confidence, sides,
                           worse, better, len(pairs) - worse - better, both_right, both_wrong, increase, exports)


__all__ = ["SUMMARY_VERSION", "ImportedSummary", "SideSummary", "summarise_imported"]
