"""The planner's search against an exhaustive one: on small cases, every n from the method's smallest upwards, the
power summed over every outcome (w, b) of the public bound (its multinomial probability in mpmath), until it
reaches the target. The planned n must be that first n, and the planned power that sum."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from invar.stats import Assumed, bound, plan_row

# (p_worse, p_better, ε, δ, power): plans of 5 to 41 units
CASES = [(0.0, 0.5, 0.1, 0.1, 0.8), (0.05, 0.45, 0.2, 0.1, 0.6)]
METHODS = ("hoeffding", "maurer-pontil", "paired-binary-exact", "paired-binary-score")


def _exhaustive_power(method: str, n: int, p_worse: float, p_better: float, epsilon: float, delta: float) -> float:
    """P(upper ≤ ε) over every (worse, better) of n units, each outcome's bound from the public function."""
    mpmath.mp.prec = 113
    pw, pb = mpmath.mpf(p_worse), mpmath.mpf(p_better)
    tie = 1 - pw - pb
    total = mpmath.mpf(0)
    for w in range(n + 1):
        for b in range(n + 1 - w):
            d = np.concatenate([np.ones(w), -np.ones(b), np.zeros(n - w - b)])
            if bound(method, d, -1.0, 1.0, delta).upper <= epsilon:
                ways = mpmath.factorial(n) / (mpmath.factorial(w) * mpmath.factorial(b) * mpmath.factorial(n - w - b))
                total += ways * pw**w * pb**b * tie ** (n - w - b)
    return float(total)


@pytest.mark.parametrize(
    ("method", "case"),
    # the exact method's public bound takes a bisection of proofs per outcome: its smaller case only
    [(m, c) for m in METHODS for c in CASES if m in ("hoeffding", "paired-binary-score") or c == CASES[1]],
    ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x)),
)
def test_plan_is_the_first_n_an_exhaustive_search_finds(method: str, case: tuple[float, ...]) -> None:
    p_worse, p_better, epsilon, delta, power = case
    row = plan_row(method, Assumed(p_worse, p_better), epsilon, delta, power)
    n = 2 if method == "maurer-pontil" else 1
    while (found := _exhaustive_power(method, n, p_worse, p_better, epsilon, delta)) < power:
        n += 1
        assert n <= row.n, f"the exhaustive search passed the planned n={row.n} without reaching {power}"
    assert row.n == n
    assert row.power == pytest.approx(found, abs=1e-9)
