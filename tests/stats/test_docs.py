"""docs/statistics.md states what the code does: each correction made to it is pinned by a test that computes the
fact and finds the document saying it (and not the claim it replaced)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from invar.stats import betting, bound, bounds, score, sequential, trinomial

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


def _table_worst() -> dict[int, str]:
    """The enumeration tables' 'worst' entry per n (the '1–15' column read as n = 15)."""
    lines = [line.strip().strip("|") for line in DOC.read_text(encoding="utf-8").splitlines()]
    out: dict[int, str] = {}
    for i, row in enumerate(lines):
        if row.startswith(" worst |"):
            names = [c.strip() for c in lines[i - 2].split("|")][1:]
            values = [c.strip() for c in row.split("|")][1:]
            out.update({int(name.split("–")[-1]): value for name, value in zip(names, values, strict=True)})
    return out


def _miss(n: int, p_worse: float, p_better: float) -> float:
    """paired-binary-score's exact miss probability P(upper < Δ) at (p_worse, p_better), every outcome summed."""
    delta = p_worse - p_better
    total = 0.0
    for w in range(n + 1):
        for b in range(n + 1 - w):
            if score.upper_limit(w, b, n, 0.05) < delta:
                total += (math.factorial(n) / (math.factorial(w) * math.factorial(b) * math.factorial(n - w - b))
                          * p_worse**w * p_better**b * (1.0 - p_worse - p_better) ** (n - w - b))
    return total


def test_the_guarantee_is_strict_where_the_cap_at_1_is_not_proven() -> None:
    """At p_worse = 1 every outcome is all worse and both exact methods give the cap 1 = Δ: P(Δ ≥ upper) = 1, so the
    page states P(Δ > upper) ≤ δ."""
    for n in (1, 5, 40):
        assert score.upper_limit(n, 0, n, 0.05) == 1.0
        assert trinomial.upper_limit(n, 0, n, 0.05) == 1.0
    text = _doc()
    assert text.count("the guarantee is P(Δ > upper) ≤ δ for every n ≥ 1") == 1
    assert text.count("The guarantee is therefore P(Δ > upper) ≤ δ for every n ≥ 1") == 1
    assert "P(Δ ≥ upper) ≤ δ — for every n ≥ 1" not in text
    assert "(step 1), so P(Δ ≥ upper) ≤ δ" not in text


def test_the_betting_ratio_is_the_planned_n_over_the_z_limit() -> None:
    """The seed case's betting ratio is 7,291 / 4,946 in both tables (the grid's first row said 1.459)."""
    ratio = f"{7_291 / 4_946:.3f}"
    assert ratio == "1.474"
    text = _doc()
    assert f"| betting | 7,291 | {ratio} |" in text
    assert f"| 0.01 | 0.01 | 0.005 | 4,946 | 53.27 | 3.295 | {ratio} | 1.242 | 1.031 |" in text


def test_the_pseudo_count_is_stated_as_the_code_counts_it() -> None:
    """paired-binary-sequence's variance estimate: p̂_d = (W + B + 0.1)/(t − 1 + 0.2), m̂ = (W − B)/(t − 1 + 0.2),
    never below 1/(t + 1), recomputed here from the bets (λ_t = sqrt(2 ln(1/δ) / (n_max·v/4)))."""
    d = np.array([[1.0, 0.0, -1.0, 1.0, 1.0, 0.0, 0.0, -1.0]])
    n_max, delta = 100, 0.05
    bets = sequential.trinomial_bets(d, delta, n_max)[0]
    for t in range(1, d.shape[1] + 1):
        w, b = int(np.sum(d[0, : t - 1] == 1.0)), int(np.sum(d[0, : t - 1] == -1.0))
        share, mean = (w + b + 0.1) / (t - 1 + 0.2), (w - b) / (t - 1 + 0.2)
        variance = max(share - mean * mean, 1.0 / (t + 1)) / 4.0
        assert bets[t - 1] == pytest.approx(math.sqrt(2.0 * -math.log(delta) / (n_max * variance)), rel=1e-12)
    assert sequential.TRINOMIAL_PRIOR == 0.1
    text = _doc()
    assert "p̂_d = (W + B + 0.1)/(t − 1 + 0.2) and m̂ = (W − B)/(t − 1 + 0.2)" in text
    assert "never below 1/(t + 1)" in text
    assert "0.1 pseudo-count each" not in text


def test_the_simplex_corner_figures_are_computed() -> None:
    """At p_better = 0, p_worse just above upper(n − 1, 0), paired-binary-score misses with 1 − upper^n."""
    corner = {n: f"{1.0 - score.upper_limit(n - 1, 0, n, 0.05) ** n:.6f}" for n in (8, 25)}
    assert corner == {8: "0.049492", 25: "0.049474"}
    assert f"1 − upper^n = {corner[8]} at n = 8 and {corner[25]} at n = 25" in _doc()


@pytest.mark.slow
@pytest.mark.parametrize(("n", "limit", "p_better"), [
    # Points just past a limit where the enumeration's line search found each n's largest miss probability.
    (16, 0.10622978210449219, 0.2155545418538284),
    (17, 0.23108863830566406, 0.25476030751844003),
    (19, 0.08942413330078125, 0.1867014720402788),
    (20, 0.23417282104492188, 0.18332474963401332),
    (30, 0.0567779541015625, 0.1252296425659616),
])
def test_the_enumeration_table_holds_each_worst_case_found(n: int, limit: float, p_better: float) -> None:
    """The table's entry is the miss probability at the worst point found (a grid missed it: n = 16 gave 0.04950,
    n = 20 0.04951, n = 30 0.04955); at n = 17 it is above α = 0.0495, so the page no longer says the worst case
    stays α up to n = 17."""
    miss = _miss(n, p_better + limit + 1e-12, p_better)
    assert f"{miss:.5f}" == _table_worst()[n]
    if n == 17:
        assert miss > 0.0495
        assert "Up to n = 17 the worst case is the supremum α" not in _doc()
        assert "From n = 14 points of the interior exceed α (n = 14: 0.0495001, n = 17: 0.0495048)" in _doc()
