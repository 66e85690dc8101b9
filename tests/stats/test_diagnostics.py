"""Diagnostics reported beside the decision: the seed example's numbers and the tests' definitions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from invar.stats import (
    StatisticsError,
    maurer_pontil,
    mcnemar_exact_one_sided,
    paired_diagnostics,
    paired_wald,
)
from invar.stats.diagnostics import EXACT_MCNEMAR_LIMIT


def test_seed_example_diagnostics() -> None:
    """n = 2000, 21 worse, 20 better: Wald [-0.0058, 0.0068], one-sided McNemar p = 0.5, Hoeffding too loose."""
    low, high = paired_wald(21, 20, 2000)
    assert (round(low, 4), round(high, 4)) == (-0.0058, 0.0068)
    assert mcnemar_exact_one_sided(21, 20) == 0.5  # exactly: 41 discordant, P(X ≥ 21) = P(X ≤ 20) = 1/2
    report = paired_diagnostics(21, 20, 2000, delta=0.05)
    assert report.wald == (low, high)
    assert report.mcnemar_p == 0.5
    d = np.concatenate([np.ones(21), -np.ones(20), np.zeros(1959)])
    decider = maurer_pontil(d, -1.0, 1.0, 0.05)
    epsilon = 0.02  # an allowance the Maurer–Pontil bound establishes ...
    assert decider.upper <= epsilon
    assert report.hoeffding.upper > epsilon  # ... and Hoeffding, blind to the variance, cannot
    assert report.hoeffding.method == "hoeffding"
    assert dataclasses.asdict(report)["mcnemar_p"] == 0.5


def test_wald_uses_the_paired_variance() -> None:
    low, high = paired_wald(30, 10, 400, confidence=0.9)
    p_w, p_b = 30 / 400, 10 / 400
    sd = np.sqrt((p_w + p_b - (p_w - p_b) ** 2) / 400)
    z = stats.norm.ppf(0.95)
    assert low == pytest.approx(0.05 - z * sd, rel=1e-12)
    assert high == pytest.approx(0.05 + z * sd, rel=1e-12)
    assert paired_wald(0, 0, 10) == (0.0, 0.0)


@pytest.mark.parametrize(("worse", "better"), [(0, 0), (5, 0), (0, 5), (3, 9), (30, 12), (400, 380), (1, 1)])
def test_mcnemar_matches_the_binomial_test(worse: int, better: int) -> None:
    expected = 1.0 if worse + better == 0 else stats.binomtest(worse, worse + better, 0.5, alternative="greater").pvalue
    assert mcnemar_exact_one_sided(worse, better) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_exact_values() -> None:
    assert mcnemar_exact_one_sided(5, 0) == 1 / 32
    assert mcnemar_exact_one_sided(0, 5) == 1.0
    assert mcnemar_exact_one_sided(1, 1) == 0.75


def test_mcnemar_beyond_exact_arithmetic() -> None:
    half = EXACT_MCNEMAR_LIMIT // 2 + 1
    expected = stats.binomtest(half + 50, 2 * half, 0.5, alternative="greater").pvalue
    assert mcnemar_exact_one_sided(half + 50, half - 50) == pytest.approx(expected, rel=1e-10)


def test_diagnostic_errors() -> None:
    with pytest.raises(StatisticsError, match="confidence"):
        paired_wald(1, 1, 10, confidence=1.0)
    with pytest.raises(StatisticsError, match="exceeds n"):
        paired_wald(6, 5, 10)
    with pytest.raises(StatisticsError, match="at least 0"):
        mcnemar_exact_one_sided(-1, 3)
    with pytest.raises(StatisticsError, match="delta"):
        paired_diagnostics(1, 1, 10, delta=0.0)
