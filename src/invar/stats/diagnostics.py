"""Common tests reported beside a use decision; none of them decides it.

Decision: the task-loss requirement is decided only by the contract's bound method (`invar.stats.bounds`). Readers
still expect the familiar numbers, so the core reports them on the same records: a paired Wald interval (asymptotic,
two-sided, may undercover for rare discordance), the exact one-sided McNemar p-value for "candidate worse" (which
can find no difference but can never show the increase is within ε), and Hoeffding's bound (valid but blind to the
variance, so usually too loose to admit). For losses in a declared range (not 0/1) McNemar does not apply: the
paired Wald interval uses the sample variance of the differences, and Hoeffding the range of the differences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy.typing as npt

from invar.stats import _binom
from invar.stats.bounds import (
    Bound,
    StatisticsError,
    check_count,
    check_counts,
    check_data,
    check_delta,
    check_range,
    exact_sum,
    hoeffding,
    mean_of,
)
from invar.stats.rows import DiagnosticsOutput, McNemarOutput, RangeDiagnosticsOutput, WaldOutput

EXACT_MCNEMAR_LIMIT = 20_000
"""Up to this many discordant units the McNemar tail is summed in exact integer arithmetic; beyond, scipy's binomial
survival function (relative error ~1e-14) is used."""


def paired_wald(worse: int, better: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Wald interval for p_worse − p_better with the paired variance.

    Counts: worse + better ≤ n units. var = (p_w + p_b − (p_w − p_b)²)/n with p_w = worse/n, p_b = better/n;
    returns (diff − z·sd, diff + z·sd), z the (1 + confidence)/2 normal quantile; not clipped to [-1, 1].
    """
    w, bt, total = check_counts(worse, better, n)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0.0 < confidence < 1.0:
        raise StatisticsError(f"confidence must lie strictly between 0 and 1 (e.g. 0.95); got {confidence!r}")
    p_w, p_b = w / total, bt / total
    diff = p_w - p_b
    sd = math.sqrt(max(0.0, p_w + p_b - diff * diff) / total)
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    return diff - z * sd, diff + z * sd


def mcnemar_exact_one_sided(worse: int, better: int) -> float:
    """Exact McNemar p-value for "candidate worse": P(X ≥ worse) with X ~ Bin(worse + better, 1/2).

    Conditional on the discordant units, under no difference each is worse with probability 1/2. Returns 1.0 when
    there is no discordant unit. Exact rational arithmetic up to EXACT_MCNEMAR_LIMIT discordant units, so
    symmetric cases are exact (21 worse, 20 better gives 0.5).
    """
    w, bt = check_count("worse", worse), check_count("better", better)
    total = w + bt
    if total == 0:
        return 1.0
    if total > EXACT_MCNEMAR_LIMIT:
        return float(_binom.sf(w - 1, total, 0.5))
    term = 1  # C(total, k), starting at k = 0
    tail = 0
    for k in range(total + 1):
        if k >= w:
            tail += term
        term = term * (total - k) // (k + 1)
    return float(Fraction(tail, 2**total))


NOTE = "diagnostics only; the decision uses the contract's method"
"""What the printed diagnostics say of themselves."""


@dataclass(frozen=True)
class PairedDiagnostics:
    """The diagnostics `invar use admit` prints beside the decision for 0/1 task losses."""

    worse: int
    """Units where the candidate's loss exceeds the reference's."""
    better: int
    """Units where it is lower."""
    n: int
    """All paired units."""
    wald_confidence: float
    """Two-sided confidence of the Wald interval."""
    wald: tuple[float, float]
    """Paired Wald interval for p_worse − p_better."""
    mcnemar_p: float
    """Exact one-sided McNemar p-value for "candidate worse"."""
    hoeffding: Bound
    """Hoeffding's bounds on d ∈ [-1, 1] at the contract's δ."""

    def output(self) -> DiagnosticsOutput:
        """What a decision prints of them, labelled so no reader mistakes them for the decision."""
        return DiagnosticsOutput(
            paired_wald=WaldOutput(confidence=self.wald_confidence, lower=self.wald[0], upper=self.wald[1]),
            mcnemar_exact_one_sided=McNemarOutput(worse=self.worse, better=self.better, p=self.mcnemar_p),
            hoeffding=self.hoeffding.hoeffding_output(), note=NOTE)


def paired_diagnostics(worse: int, better: int, n: int, delta: float, confidence: float = 0.95) -> PairedDiagnostics:
    """All diagnostics for trinomial counts at the contract's δ (Hoeffding) and a Wald confidence level."""
    w, bt, total = check_counts(worse, better, n)
    check_delta(delta)
    d = [1.0] * w + [-1.0] * bt + [0.0] * (total - w - bt)
    return PairedDiagnostics(
        worse=w,
        better=bt,
        n=total,
        wald_confidence=confidence,
        wald=paired_wald(w, bt, total, confidence),
        mcnemar_p=mcnemar_exact_one_sided(w, bt),
        hoeffding=hoeffding(d, -1.0, 1.0, delta),
    )


@dataclass(frozen=True)
class RangeDiagnostics:
    """The diagnostics `invar use admit` prints beside the decision for task losses in a declared range."""

    n: int
    """All paired units."""
    wald_confidence: float
    """Two-sided confidence of the Wald interval."""
    wald: tuple[float, float]
    """Paired Wald interval for E[d]: mean ∓ z·s/√n, s the sample standard deviation of d (0 for one unit)."""
    hoeffding: Bound
    """Hoeffding's bounds on d in its range [a, b] at the contract's δ."""

    def output(self) -> RangeDiagnosticsOutput:
        """What a decision prints of them, as `PairedDiagnostics.output` (no McNemar test: not 0/1 losses)."""
        return RangeDiagnosticsOutput(
            paired_wald=WaldOutput(confidence=self.wald_confidence, lower=self.wald[0], upper=self.wald[1]),
            hoeffding=self.hoeffding.hoeffding_output(), note=NOTE)


def range_diagnostics(d: npt.ArrayLike, a: float, b: float, delta: float, confidence: float = 0.95
                      ) -> RangeDiagnostics:
    """Diagnostics for paired differences `d` in [a, b] at the contract's δ (Hoeffding) and a Wald confidence."""
    a, b = check_range(a, b)
    check_delta(delta)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0.0 < confidence < 1.0:
        raise StatisticsError(f"confidence must lie strictly between 0 and 1 (e.g. 0.95); got {confidence!r}")
    values = check_data(d, a, b)
    n = values.size
    mean = mean_of(values)
    sd = math.sqrt(exact_sum((values - mean) ** 2) / (n - 1)) if n > 1 else 0.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    half = z * sd / math.sqrt(n)
    return RangeDiagnostics(n=n, wald_confidence=confidence, wald=(mean - half, mean + half),
                            hoeffding=hoeffding(values, a, b, delta))
