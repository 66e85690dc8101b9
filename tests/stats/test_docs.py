"""docs/statistics.md states what the code does: each correction made to it is pinned by a test that computes the
fact and finds the document saying it (and not the claim it replaced)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from invar.stats import betting, bound, bounds, trinomial

DOC = Path(__file__).resolve().parents[2] / "docs" / "statistics.md"


def _doc() -> str:
    return " ".join(DOC.read_text(encoding="utf-8").split())  # one line: wrapped sentences match


def test_paired_binary_exact_worst_case_is_delta_minus_gamma() -> None:
    """At p_better = 0, p_worse just above upper(n − 1, 0), the miss probability tends to 1 − upper^n = δ − γ = 0.049
    (a grid misses it: 0.0475 and 0.0486 were grid maxima)."""
    for n in (8, 25):
        u = trinomial.upper_limit(n - 1, 0, n, 0.05)
        assert round(1.0 - u**n, 4) == 0.049
    text = _doc()
    assert "δ − γ = 0.049 at δ = 0.05: at p_better = 0 and p_worse just above" in text
    assert "largest miss probability 0.0475" not in text
    assert "0.0486 at n = 25 — valid and close to δ" not in text


def test_rounding_guarantee_is_relative_to_the_range_offset() -> None:
    """The doc states the 32u·(max(|a|, |b|) + w) guarantee (tested in test_precision) and no longer claims every
    Hoeffding and Maurer–Pontil bound is within 1e-12·(b − a) of the exact value."""
    text = _doc()
    assert "within 32u·(max(|a|, |b|) + w) of the exact bound" in text
    assert "4.75e-10·(b − a)" in text
    assert "never more than ~1e-15·(b − a) away from it for Hoeffding and Maurer–Pontil" not in text
    assert "are never on the unsafe side and within 1e-12·(b − a) of the exact value" not in text


def test_betting_says_where_its_order_came_from() -> None:
    """Betting on an order sorted by value can give lower > upper with the mean outside both; bound() on an order the
    plan did not fix carries a warning, and the doc says the core passes order="plan"."""
    d = np.sort(np.concatenate([np.ones(60), -np.ones(60), np.zeros(280)]))[::-1]
    unplanned = betting(d, -1.0, 1.0, 0.05)
    assert unplanned.lower > unplanned.upper
    assert not unplanned.lower <= unplanned.estimate <= unplanned.upper
    assert unplanned.warnings == (bounds.UNPLANNED_ORDER_WARNING,)
    shuffled = np.random.default_rng(0).permutation(d)
    assert bound("betting", shuffled, -1.0, 1.0, 0.05, order="plan").warnings == ()
    assert bound("maurer-pontil", d, -1.0, 1.0, 0.05).warnings == ()
    text = _doc()
    assert 'order="plan"' in text
    assert "Bound.warnings" in text


def test_goal_figures_are_the_tested_ones() -> None:
    """The planning table's default row is the n test_planning's slow seed test asserts, within the 1.05x goal."""
    text = _doc()
    assert "| **paired-binary-score (default)** | **5,101** | **1.031** |" in text
    assert 5_101 <= 1.05 * 4_946
