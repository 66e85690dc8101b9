"""The planner's proofs take their comparisons with α from `trinomial.tails_bounds` (recurrences between Boost
anchors, with every rounding and Boost's error allowed for): the bounds hold the very numbers `tails` returns, and
the proofs, the exact power and the anchor power they give are those of the proof as it was written before
(`_reference_status`, kept here verbatim), to the bit, where the bounds apply."""

from __future__ import annotations

import numpy as np
import pytest

from invar.stats import planning, trinomial
from invar.stats.trinomial import _corner_params, _point_params, _segment, _up, anchor_tail, tails

MARGIN = 2.0**-30


def _reference_status(delta0: float, t: int, n: int, pi_upper: float, alpha: float) -> str:
    """`trinomial.proof_status` before the bounds (every tail computed in full)."""
    if delta0 <= -1.0:
        return "refuted"
    if anchor_tail(delta0, t, n, pi_upper) > alpha:
        return "refuted"
    if delta0 < 0.0:
        edge = np.array([_up(min(-delta0, pi_upper))])
        if tails(t, n, np.minimum(1.0, edge), np.array([0.0]))[0] > alpha:
            return "refuted"
    lo, hi = _segment(delta0, pi_upper)
    if hi < lo:
        return "proven"
    edges = np.linspace(lo, hi, 9)
    edges[0], edges[-1] = lo, hi
    g1, g2 = edges[:-1], edges[1:]
    while g1.size:
        pi, q = _corner_params(g1, g2, delta0)
        corner = tails(t, n, pi, q)
        open_ = corner > alpha
        g1, g2 = g1[open_], g2[open_]
        if not g1.size:
            return "proven"
        if g1.size > trinomial._MAX_OPEN_CELLS or np.any(g2 - g1 <= trinomial._MIN_CELL):
            return "abandoned"
        worst = int(np.argmax(corner[open_]))
        pi, q = _point_params(g2[worst : worst + 1], delta0)
        if tails(t, n, pi, q)[0] > alpha:
            return "refuted"
        width = g2 - g1
        parts = [g1 + width * f for f in (0.0, 0.25, 0.5, 0.75)] + [g2]
        g1 = np.concatenate(parts[:-1])
        g2 = np.concatenate(parts[1:])
    return "proven"


@pytest.mark.parametrize("seed", range(4))
def test_the_bounds_hold_the_numbers_tails_returns(seed: int) -> None:
    rng = np.random.default_rng(seed)
    applied = 0
    for _ in range(40):
        n = int(rng.choice([300, 2000, 6000, 34127, 100000]))
        epsilon = float(rng.choice([0.002, 0.005, 0.02, -0.01, 0.3]))
        delta0 = epsilon - MARGIN
        upper = float(rng.uniform(max(0.001, abs(epsilon) * 1.05), 0.5))
        t = int(rng.integers(-int(0.05 * n) - 2, int(0.05 * n) + 3))
        lo, hi = _segment(delta0, upper)
        if hi < lo:
            continue
        edges = np.linspace(lo, hi, int(rng.choice([2, 9, 33])))
        pi, q = _corner_params(edges[:-1], edges[1:], delta0)
        exact = tails(t, n, pi, q)
        bounds = trinomial.tails_bounds(t, n, pi, q)
        if bounds is None:
            continue
        applied += 1
        lower, upper_bound = bounds
        assert np.all(lower <= exact), (n, epsilon, upper, t)
        assert np.all(exact <= upper_bound), (n, epsilon, upper, t)
        # and tight enough to settle nearly every comparison: within 1e-8 relative or 1e-9 absolute
        assert np.all(upper_bound - lower <= 1e-8 * exact + 1e-9), (n, epsilon, upper, t)
    assert applied >= 15  # the bounds applied to most batches: the test is not vacuous


def _threshold_cases(n: int, epsilon: float, delta: float) -> list[tuple[int, float]]:
    """(t, U_π) at a few discordant counts around the mean of Bin(n, 0.02), t around the largest the anchor
    passes (where the proofs are hardest and a comparison lies closest to α)."""
    gamma = trinomial.GAMMA_FRACTION * delta
    alpha = delta - gamma
    delta0 = epsilon - MARGIN
    cases = []
    for k in (int(0.02 * n - 2.0 * (0.02 * n) ** 0.5), int(0.02 * n), int(0.02 * n + 2.0 * (0.02 * n) ** 0.5)):
        upper = trinomial.clopper_pearson_upper(k, n, gamma)
        lo, hi = -k, k  # anchor_tail(lo) ≤ α < anchor_tail(hi) (the tail grows with t)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if anchor_tail(delta0, mid, n, upper) <= alpha else (lo, mid)
        cases += [(t, upper) for t in (lo - 3, lo - 1, lo, lo + 1)]
    return cases


@pytest.mark.parametrize(("n", "epsilon", "delta"), [(6000, 0.005, 0.05), (20000, 0.005, 0.01),
                                                      (34127, 0.002, 0.05), (3000, -0.002, 0.05)])
def test_fast_proofs_are_the_proofs(n: int, epsilon: float, delta: float) -> None:
    alpha = delta - trinomial.GAMMA_FRACTION * delta
    delta0 = epsilon - MARGIN
    statuses = []
    for t, upper in _threshold_cases(n, epsilon, delta):
        fast = trinomial.proof_status(delta0, t, n, upper, alpha, fast=True)
        reference = _reference_status(delta0, t, n, upper, alpha)
        assert fast == reference, (t, upper)
        assert trinomial.proof_status(delta0, t, n, upper, alpha) == reference, (t, upper)  # the bounds' own path
        assert trinomial.anchor_above(delta0, t, n, upper, alpha) == (anchor_tail(delta0, t, n, upper) > alpha)
        statuses.append(fast)
    assert "proven" in statuses  # both outcomes were compared
    assert "refuted" in statuses


@pytest.mark.parametrize("case", [(0.01, 0.01, 0.005, 0.05, 6142), (0.01, 0.01, 0.005, 0.01, 9000),
                                  (0.02, 0.01, 0.02, 0.05, 7000)], ids=str)
def test_exact_and_anchor_power_are_those_of_the_full_tails(case: tuple[float, float, float, float, int],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pw, pb, eps, dlt, n = case
    assumption = planning._assumption(pw, pb, None, 0.0, -1.0, 1.0)
    calls = []
    original = trinomial.tails_bounds

    def counted(*args: object) -> object:
        got = original(*args)  # type: ignore[arg-type]
        calls.append(got is not None)
        return got

    monkeypatch.setattr(trinomial, "tails_bounds", counted)
    fast = planning._ExactPlanner(assumption, eps, dlt)
    fast_values = (fast.anchor_power(n), fast.power(n), fast.anchor_power(n - 40))
    assert sum(calls) > 100  # the bounds settled most of the comparisons
    monkeypatch.setattr(trinomial, "tails_bounds", lambda *_args: None)  # every tail in full, as before
    monkeypatch.setattr(trinomial, "proof_status",
                        lambda delta0, t, n, upper, alpha, **_kw: _reference_status(delta0, t, n, upper, alpha))
    full = planning._ExactPlanner(assumption, eps, dlt)
    full_values = (full.anchor_power(n), full.power(n), full.anchor_power(n - 40))
    assert [v.hex() for v in fast_values] == [v.hex() for v in full_values]
    assert 0.0 < full_values[1] < 1.0
