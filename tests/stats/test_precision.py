"""Float64 bounds against 120-digit arithmetic.

Every float64 bound must lie on the safe side of the exact value (upper ≥ exact upper, lower ≤ exact lower) and,
for Hoeffding and Maurer–Pontil, within 32u·(max(|a|, |b|) + w) of it (u = 2^-53, w the exact half-width): the
rounding errors are relative to the numbers involved, so on an offset range (a = −250, b − a = 1e-3) that is far more
than 1e-12·(b − a), which the tests show the bounds do exceed there. For paired-binary-exact the
closed-form quantities are checked instead: the binomial-mixture tails and Clopper–Pearson limits it is built from
(never below the exact value, at most 1e-11 relative above), and, at the reported limit, the exact supremum over the
nuisance parameter (at most α, and the limit within 1e-9 of where the anchor tail crosses α).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

from invar.stats import bounds, score, trinomial

mp.mp.dps = 120
ROUNDOFF = 32 * 2.0**-53
"""The documented guarantee: |bound − exact| ≤ ROUNDOFF·(max(|a|, |b|) + w)."""

DELTAS = (1e-9, 1e-4, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9)
RANGES = ((-1.0, 1.0), (0.0, 1.0), (-3.5, 0.25), (0.0, 1000.0), (-1e-3, 2e-3), (-250.0, -250.0 + 1e-3))


def _cases(seed: int, count: int) -> list[tuple[np.ndarray, float, float, float]]:
    """(d, a, b, δ): trinomial counts on [-1, 1] and real-valued data on other ranges, many sizes."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        delta = float(DELTAS[i % len(DELTAS)])
        n = int(rng.choice([2, 3, 10, 57, 400, 2000, 20_000]))
        if i % 2 == 0:
            worse = int(rng.integers(0, n + 1))
            better = int(rng.integers(0, n - worse + 1))
            d = np.concatenate([np.ones(worse), -np.ones(better), np.zeros(n - worse - better)])
            cases.append((rng.permutation(d), -1.0, 1.0, delta))
        else:
            a, b = RANGES[i % len(RANGES)]
            shape = rng.choice([0.2, 1.0, 5.0])
            d = a + (b - a) * rng.beta(shape, 1.0, size=n)
            cases.append((np.clip(d, a, b), a, b, delta))
    cases.append((np.array([0.0, 0.0, 0.0]), -1.0, 1.0, 0.05))  # zero variance
    cases.append((np.full(10, 1.0), -1.0, 1.0, 0.05))  # mean at the boundary
    cases.append((np.array([-1.0, 1.0]), -1.0, 1.0, 0.5))
    return cases


def _exact_mean_var(d: np.ndarray) -> tuple[mp.mpf, mp.mpf]:
    values = [mp.mpf(float(x)) for x in d]
    mean = mp.fsum(values) / len(values)
    var = mp.fsum((x - mean) ** 2 for x in values) / (len(values) - 1) if len(values) > 1 else mp.mpf(0)
    return mean, var


def _check(name: str, got: float, exact: mp.mpf, side: str, a: float, b: float, half: mp.mpf) -> mp.mpf:
    """The bound is on the safe side of `exact` and within the documented roundoff; returns the gap."""
    gap = mp.mpf(got) - exact
    if side == "upper":
        assert gap >= 0, f"{name}: upper {got!r} below the exact {mp.nstr(exact, 30)}"
    else:
        assert gap <= 0, f"{name}: lower {got!r} above the exact {mp.nstr(exact, 30)}"
    allowed = ROUNDOFF * (max(abs(a), abs(b)) + half)
    assert abs(gap) <= allowed, f"{name}: {side} off by {mp.nstr(gap, 5)}, more than {mp.nstr(allowed, 5)}"
    return gap


@pytest.mark.parametrize("seed", range(4))
def test_hoeffding_matches_120_digits(seed: int) -> None:
    for d, a, b, delta in _cases(seed, 40):
        got = bounds.hoeffding(d, a, b, delta)
        mean, _ = _exact_mean_var(d)
        width = (mp.mpf(b) - mp.mpf(a)) * mp.sqrt(mp.log(1 / mp.mpf(delta)) / (2 * len(d)))
        _check("hoeffding", got.upper, min(mp.mpf(b), mean + width), "upper", a, b, width)
        _check("hoeffding", got.lower, max(mp.mpf(a), mean - width), "lower", a, b, width)


@pytest.mark.parametrize("seed", range(4))
def test_maurer_pontil_matches_120_digits(seed: int) -> None:
    for d, a, b, delta in _cases(100 + seed, 40):
        got = bounds.maurer_pontil(d, a, b, delta)
        mean, var = _exact_mean_var(d)
        n = len(d)
        log_term = mp.log(2 / mp.mpf(delta))
        half = mp.sqrt(2 * var * log_term / n) + 7 * (mp.mpf(b) - mp.mpf(a)) * log_term / (3 * (n - 1))
        _check("maurer-pontil", got.upper, min(mp.mpf(b), mean + half), "upper", a, b, half)
        _check("maurer-pontil", got.lower, max(mp.mpf(a), mean - half), "lower", a, b, half)


def test_seed_example_maurer_pontil_upper() -> None:
    """n = 2000, 21 worse, 20 better: the product's seed decision, upper ≈ 0.0178 at δ = 0.05."""
    d = np.concatenate([np.ones(21), -np.ones(20), np.zeros(1959)])
    got = bounds.maurer_pontil(d, -1.0, 1.0, 0.05)
    mean, var = mp.mpf(1) / 2000, (mp.mpf(41) - mp.mpf(1) / 2000) / 1999
    log_term = mp.log(40)
    half = mp.sqrt(2 * var * log_term / 2000) + 14 * log_term / (3 * 1999)
    _check("maurer-pontil", got.upper, mean + half, "upper", -1.0, 1.0, half)
    assert round(got.upper, 4) == 0.0178


# --- the exact method's closed-form parts --------------------------------------------------------------------------


def _binomial_pmfs(n: int, p: mp.mpf) -> list[mp.mpf]:
    """Bin(n, p) pmf for k = 0..n by the ratio recurrence (exact to the working precision)."""
    if p == 0:
        return [mp.mpf(1)] + [mp.mpf(0)] * n
    if p == 1:
        return [mp.mpf(0)] * n + [mp.mpf(1)]
    pmf = [(1 - p) ** n]
    ratio = p / (1 - p)
    for k in range(n):
        pmf.append(pmf[-1] * (n - k) / (k + 1) * ratio)
    return pmf


def _binomial_cdf(x: int, k: int, q: mp.mpf) -> mp.mpf:
    if x < 0:
        return mp.mpf(0)
    if x >= k:
        return mp.mpf(1)
    return mp.fsum(_binomial_pmfs(k, q)[: x + 1])


def _exact_tail(t: int, n: int, pi: float, q: float) -> mp.mpf:
    """P(W − B ≤ t): every discordant count whose probability exceeds 1e-130 (the rest cannot move 1e-100)."""
    pmf = _binomial_pmfs(n, mp.mpf(pi))
    floor = mp.mpf(10) ** -130
    return mp.fsum(
        pmf[k] * _binomial_cdf((t + k) // 2, k, mp.mpf(q)) for k in range(max(0, -t), n + 1) if pmf[k] > floor
    )


TAIL_CASES = [
    (-3, 10, 0.3, 0.4),
    (0, 1, 0.5, 0.5),
    (5, 40, 0.2, 0.9),
    (-12, 100, 0.5, 0.1),
    (2, 300, 0.05, 0.55),
    (17, 2000, 0.0205, 0.6),
    (20, 6000, 0.02, 0.62),
    (-40, 6000, 0.031, 0.25),
    (0, 50, 0.0, 0.5),
    (0, 50, 1.0, 0.5),
    (10, 50, 0.4, 1.0),
    (-10, 50, 0.4, 0.0),
    (90, 20_000, 0.01, 0.7),
]


@pytest.mark.parametrize(("t", "n", "pi", "q"), TAIL_CASES)
def test_trinomial_tails_never_below_exact(t: int, n: int, pi: float, q: float) -> None:
    got = float(trinomial.tails(t, n, np.array([pi]), np.array([q]))[0])
    exact = _exact_tail(t, n, pi, q)
    assert mp.mpf(got) >= exact, f"tail {got!r} below the exact {mp.nstr(exact, 30)}"
    assert mp.mpf(got) <= exact * (1 + mp.mpf("1e-11")) + mp.mpf("1e-19")


@pytest.mark.parametrize(("k", "n", "gamma"), [(0, 1, 0.001), (0, 100, 0.001), (41, 2000, 0.001), (7, 30, 0.2)])
def test_clopper_pearson_upper_is_safe_and_tight(k: int, n: int, gamma: float) -> None:
    limit = trinomial.clopper_pearson_upper(k, n, gamma)
    at_limit = _binomial_cdf(k, n, mp.mpf(limit))
    assert at_limit <= gamma  # P(Bin(n, U) ≤ k) ≤ γ: U is at or above the exact limit
    assert at_limit >= gamma * (1 - mp.mpf("1e-9"))  # and not far above it


def _boundary_tail(delta0: float, t: int, n: int, pb: float) -> mp.mpf:
    pw = mp.mpf(pb) + mp.mpf(delta0)
    pi = pw + mp.mpf(pb)
    return _exact_tail_mp(t, n, pi, pw / pi)


def _exact_tail_mp(t: int, n: int, pi: mp.mpf, q: mp.mpf) -> mp.mpf:
    pmf = _binomial_pmfs(n, pi)
    floor = mp.mpf(10) ** -130
    return mp.fsum(pmf[k] * _binomial_cdf((t + k) // 2, k, q) for k in range(max(0, -t), n + 1) if pmf[k] > floor)


@pytest.mark.parametrize(("worse", "better", "n"), [(21, 20, 2000), (3, 7, 10), (0, 0, 100), (12, 2, 150)])
def test_exact_limit_is_sound_and_tight(worse: int, better: int, n: int) -> None:
    delta = 0.05
    gamma = trinomial.GAMMA_FRACTION * delta
    alpha = delta - gamma
    upper = bounds.paired_binary_exact(worse, better, n, delta).upper
    pi_upper = mp.mpf(trinomial.clopper_pearson_upper(worse + better, n, gamma))
    t = worse - better
    top = (pi_upper - mp.mpf(upper)) / 2
    assert top > 0
    # Sound: at the reported limit the tail stays ≤ α all along the nuisance range (a fine sample of it).
    for fraction in np.linspace(0.0, 1.0, 9):
        pb = float(max(mp.mpf(0), -mp.mpf(upper)) + fraction * (top - max(mp.mpf(0), -mp.mpf(upper))))
        assert _boundary_tail(upper, t, n, pb) <= alpha
    # Tight: 1e-9 lower, the tail at the top of the nuisance range already exceeds α.
    below = upper - 1e-9
    assert _boundary_tail(below, t, n, float((pi_upper - mp.mpf(below)) / 2)) > alpha


def test_offset_range_error_is_relative_to_the_offset() -> None:
    """On [-250, -250 + 1e-3] the distance to the exact bound is ~5e-10·(b − a): the guarantee is 32u·max(|a|, |b|)
    (plus the half-width), not 1e-12·(b − a), which docs/statistics.md once claimed."""
    a, width = -250.0, 1e-3
    rng = np.random.default_rng(0)
    d = np.clip(a + width * rng.beta(0.5, 1.0, size=2000), a, a + width)
    mean, _ = _exact_mean_var(d)
    half = (mp.mpf(a + width) - mp.mpf(a)) * mp.sqrt(mp.log(1 / mp.mpf(0.05)) / (2 * d.size))
    gap = _check("hoeffding", bounds.hoeffding(d, a, a + width, 0.05).upper, mean + half, "upper", a, a + width, half)
    assert gap > 1e-12 * width
    assert gap / width > mp.mpf("1e-10")


def test_outward_rounding_allowance_is_small() -> None:
    """The outward allowance costs at most a few ulps of the range: bounds stay comparable at 1e-15."""
    d = np.concatenate([np.ones(21), -np.ones(20), np.zeros(1959)])
    got = bounds.hoeffding(d, -1.0, 1.0, 0.05)
    plain = 0.0005 + 2.0 * math.sqrt(math.log(20.0) / 4000.0)
    assert plain < got.upper < plain + 1e-15


# --- paired-binary-score: the proof's numbers against 120 digits -------------------------------------------------


def _extreme_set_tail(n: int, c: np.ndarray, pi: float, delta0: float) -> mp.mpf:
    """P(T ≤ t) at the boundary point (π, q = (1 + Δ0/π)/2 clipped), every count whose probability exceeds 1e-130."""
    p = mp.mpf(pi)
    q = (1 + mp.mpf(delta0) / p) / 2 if p > 0 else (mp.mpf(0) if delta0 < 0 else mp.mpf(1) / 2)
    q = min(max(q, mp.mpf(0)), mp.mpf(1))
    pmf = _binomial_pmfs(n, p)
    floor = mp.mpf(10) ** -130
    return mp.fsum(
        pmf[k] * _binomial_cdf(int(c[k]), k, q) for k in range(min(n, c.size - 1) + 1) if pmf[k] > floor
    )


@pytest.mark.parametrize(
    ("worse", "better", "n"), [(3, 7, 10), (12, 2, 150), pytest.param(21, 20, 2000, marks=pytest.mark.slow)]
)
def test_score_limit_is_sound_and_tight(worse: int, better: int, n: int) -> None:
    """At the reported upper limit the 120-digit probability of the extreme set stays ≤ α = δ − γ along the
    nuisance range (41 points); ten grid steps lower it exceeds α somewhere, and one step lower the proof fails."""
    delta = 0.05
    test = score.make_test(worse, better, n, delta)
    upper = score.upper_limit(worse, better, n, delta)
    step = 2.0 ** -score.grid_bits(n)
    lo, hi = test.domain(upper)
    assert max(_extreme_set_tail(n, test.c, p, upper) for p in np.linspace(lo, hi, 41)) <= test.alpha
    below = upper - 10 * step
    lo, hi = test.domain(below)
    assert max(_extreme_set_tail(n, test.c, p, below) for p in np.linspace(lo, hi, 201)) > test.alpha
    assert not test.proves(upper - step)


@pytest.mark.parametrize(("worse", "better", "n", "delta0"), [(20, 21, 2000, 0.004), (6, 1, 40, -0.1)])
def test_score_cell_bounds_above_120_digits(worse: int, better: int, n: int, delta0: float) -> None:
    """Each cell bound (first and third order) is at or above the 120-digit tail at points of its cell, and a cell
    of width zero is its tail to within TAIL_SLACK."""
    test = score.make_test(worse, better, n, 0.05)
    lo, hi = test.domain(delta0)
    u1, u2 = score.fixed_cells(n, lo, hi)
    a1, a2 = np.maximum(u1, lo), np.minimum(u2, hi)
    bounder = score.Bounder(n, delta0, remember=False)
    for fraction in (1.0, 0.1):
        ends = a1 + (a2 - a1) * fraction
        cells = bounder.bounds(test.c, a1, ends, test.alpha)
        for i in range(a1.size):
            for p in np.linspace(a1[i], ends[i], 5):
                # a probability of exactly 1 may come out 1 + 1e-120 at 120 digits
                assert mp.mpf(float(cells[i])) >= min(_extreme_set_tail(n, test.c, float(p), delta0), mp.mpf(1))
    points = bounder.bounds(test.c, a2, a2, test.alpha)
    for i in range(a2.size):
        exact = min(_extreme_set_tail(n, test.c, float(a2[i]), delta0), mp.mpf(1))
        assert exact <= mp.mpf(float(points[i])) <= exact * (1 + mp.mpf("1e-10")) + mp.mpf("1e-20")
