"""Statistics for losses in a declared range (not 0/1): the diagnostics reported beside such a decision, and the
sequential rule on a range wider than [-1, 1], with ε in its units."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from invar.stats import bounds, sequential
from invar.stats.bounds import StatisticsError
from invar.stats.diagnostics import range_diagnostics


def test_range_diagnostics_are_wald_on_the_sample_variance_and_hoeffding_on_the_range() -> None:
    d = np.array([0.1, -0.3, 0.0, 0.7, 0.2, -0.1, 0.0, 0.4])
    got = range_diagnostics(d, -1.0, 1.0, 0.05, confidence=0.9)
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    half = NormalDist().inv_cdf(0.95) * sd / math.sqrt(d.size)
    assert got.n == 8
    assert got.wald == pytest.approx((mean - half, mean + half), abs=1e-15)
    assert got.hoeffding == bounds.hoeffding(d, -1.0, 1.0, 0.05)
    one = range_diagnostics([0.5], -1.0, 1.0, 0.05)
    assert one.wald == (0.5, 0.5)  # no variance from one unit


def test_range_diagnostics_refuse_what_a_bound_refuses() -> None:
    with pytest.raises(StatisticsError, match=r"outside the declared range"):
        range_diagnostics([1.5], -1.0, 1.0, 0.05)
    with pytest.raises(StatisticsError, match=r"confidence must lie strictly between 0 and 1"):
        range_diagnostics([0.5], -1.0, 1.0, 0.05, confidence=1.0)


def test_the_sequential_rule_takes_a_wider_range_and_epsilon_in_its_units() -> None:
    d = np.zeros(64)
    decision = sequential.sequential_decision("betting-sequence", d, [16, 32, 48, 64], Fraction(2), 0.05, 64,
                                              a=-10.0, b=10.0)
    # The rule on [-10, 10] with ε = 2 is the rule on [-1, 1] with ε = 0.2, scaled (up to the outward rounding).
    scaled = sequential.sequential_decision("betting-sequence", d, [16, 32, 48, 64], Fraction(1, 5), 0.05, 64)
    assert (decision.answer, decision.stop) == (scaled.answer, scaled.stop)
    assert decision.final.upper == pytest.approx(10 * scaled.final.upper, rel=1e-12)
    with pytest.raises(StatisticsError, match=r"epsilon must lie strictly between -10 and 10; got 10"):
        sequential.sequential_decision("betting-sequence", d, [64], Fraction(10), 0.05, 64, a=-10.0, b=10.0)
    with pytest.raises(StatisticsError, match=r"epsilon must lie strictly between -1 and 1; got 2"):
        sequential.sequential_decision("betting-sequence", d, [64], Fraction(2), 0.05, 64)
    with pytest.raises(StatisticsError, match=r"paired-binary-sequence models 0/1 losses"):
        sequential.sequential_decision("paired-binary-sequence", d, [64], Fraction(2), 0.05, 64, a=-10.0, b=10.0)
