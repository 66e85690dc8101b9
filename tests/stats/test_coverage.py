"""Coverage: each one-sided bound misses the true mean with probability at most δ.

Simulated misses are judged by a one-sided binomial test at level 1e-3 against δ (a valid bound fails it with
probability ≤ 1e-3). The paired-binary-exact method is also checked without Monte Carlo error: for small n its
limits are computed for every possible (worse, better) and the exact miss probability is maximised over a grid of
true (p_worse, p_better) that includes the boundary of the simplex.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
from scipy import stats

from invar.stats import bounds

DELTA = 0.05
TEST_LEVEL = 1e-3

Sampler = Callable[[np.random.Generator, int, int], np.ndarray]


def _plausible(misses: int, reps: int, delta: float = DELTA) -> bool:
    """False when `misses` out of `reps` is significantly (level 1e-3) more than δ·reps."""
    return float(stats.binom.sf(misses - 1, reps, delta)) >= TEST_LEVEL


def _two_point(p: float, lo: float, hi: float) -> Sampler:
    return lambda rng, reps, n: np.where(rng.random((reps, n)) < p, hi, lo)


def _trinomial(p_worse: float, p_better: float) -> Sampler:
    def draw(rng: np.random.Generator, reps: int, n: int) -> np.ndarray:
        u = rng.random((reps, n))
        return np.where(u < p_worse, 1.0, np.where(u >= 1.0 - p_better, -1.0, 0.0))

    return draw


def _beta(shape_a: float, shape_b: float, lo: float, hi: float) -> Sampler:
    return lambda rng, reps, n: lo + (hi - lo) * rng.beta(shape_a, shape_b, size=(reps, n))


# name: (sampler, true mean, a, b)
DISTRIBUTIONS: dict[str, tuple[Sampler, float, float, float]] = {
    "rare-event": (_two_point(0.003, 0.0, 1.0), 0.003, 0.0, 1.0),
    "two-point": (_two_point(0.5, -1.0, 1.0), 0.0, -1.0, 1.0),
    "skewed-two-point": (_two_point(0.05, -1.0, 1.0), -0.9, -1.0, 1.0),
    "asymmetric-beta": (_beta(0.3, 3.0, 0.0, 1.0), 0.3 / 3.3, 0.0, 1.0),
    "paired-trinomial": (_trinomial(0.02, 0.01), 0.01, -1.0, 1.0),
    "mean-at-boundary": (_two_point(0.0, -1.0, 1.0), -1.0, -1.0, 1.0),
}


def _limits(method: str, d: np.ndarray, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) per row of d (R, n). Hoeffding and Maurer–Pontil through the public functions; betting
    through the vectorised kernel the public function wraps (checked equal in test_bounds)."""
    if method == "betting":
        lower_x, upper_x = bounds.betting_limits_rescaled(bounds.rescale(d, a, b), DELTA)
        return bounds.unscale_limits(lower_x, upper_x, a, b)
    function = bounds.hoeffding if method == "hoeffding" else bounds.maurer_pontil
    results = [function(row, a, b, DELTA) for row in d]
    return np.array([r.lower for r in results]), np.array([r.upper for r in results])


def _check_coverage(method: str, name: str, reps: int, n: int, seed: int) -> None:
    sampler, mean, a, b = DISTRIBUTIONS[name]
    rng = np.random.default_rng(seed)
    upper_misses = lower_misses = 0
    for start in range(0, reps, 2500):
        d = sampler(rng, min(2500, reps - start), n)
        lower, upper = _limits(method, d, a, b)
        upper_misses += int(np.sum(upper < mean))
        lower_misses += int(np.sum(lower > mean))
    assert _plausible(upper_misses, reps), f"{method}/{name}: upper missed {upper_misses} of {reps}"
    assert _plausible(lower_misses, reps), f"{method}/{name}: lower missed {lower_misses} of {reps}"


GENERAL_METHODS = ("hoeffding", "maurer-pontil", "betting")


@pytest.mark.parametrize("method", GENERAL_METHODS)
@pytest.mark.parametrize("name", ["two-point", "paired-trinomial", "mean-at-boundary"])
def test_coverage_quick(method: str, name: str) -> None:
    _check_coverage(method, name, reps=300, n=80, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("method", GENERAL_METHODS)
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_coverage(method: str, name: str) -> None:
    _check_coverage(method, name, reps=10_000, n=200, seed=7)


def test_binomial_check_rejects_an_invalid_bound() -> None:
    """The check has teeth: a 'bound' that is the sample mean misses half the time and is caught."""
    sampler, mean, _, _ = DISTRIBUTIONS["two-point"]
    d = sampler(np.random.default_rng(3), 300, 80)
    misses = int(np.sum(d.mean(axis=1) < mean))
    assert not _plausible(misses, 300)


# --- paired-binary-exact ------------------------------------------------------------------------------------------


@cache
def _exact_limits(worse: int, better: int, n: int) -> tuple[float, float]:
    result = bounds.paired_binary_exact(worse, better, n, DELTA)
    return result.lower, result.upper


def _exact_miss_probabilities(n: int, grid: int) -> tuple[float, float]:
    """Largest exact P(upper < Δ) and P(lower > Δ) over a grid of (p_worse, p_better) on the simplex."""
    pairs = [(w, b) for w in range(n + 1) for b in range(n + 1 - w)]
    lower = np.array([_exact_limits(w, b, n)[0] for w, b in pairs])
    upper = np.array([_exact_limits(w, b, n)[1] for w, b in pairs])
    counts = np.array([(w, b, n - w - b) for w, b in pairs])
    worst_upper = worst_lower = 0.0
    steps = np.linspace(0.0, 1.0, grid + 1)
    for p_worse in steps:
        for p_better in steps[steps <= 1.0 - p_worse + 1e-12]:
            p_better = min(p_better, 1.0 - p_worse)
            probs = stats.multinomial.pmf(counts, n, [p_worse, p_better, max(0.0, 1.0 - p_worse - p_better)])
            true = p_worse - p_better
            worst_upper = max(worst_upper, float(np.sum(probs[upper < true])))
            worst_lower = max(worst_lower, float(np.sum(probs[lower > true])))
    return worst_upper, worst_lower


def test_exact_method_exact_coverage_small_n() -> None:
    worst_upper, worst_lower = _exact_miss_probabilities(n=8, grid=40)
    assert worst_upper <= DELTA
    assert worst_lower <= DELTA
    assert worst_upper > 0.005  # and it is not vacuous: the limits are informative enough to miss sometimes


@pytest.mark.slow
def test_exact_method_exact_coverage_n25() -> None:
    worst_upper, worst_lower = _exact_miss_probabilities(n=25, grid=60)
    assert worst_upper <= DELTA
    assert worst_lower <= DELTA


EXACT_CASES = {
    "rare-event": (300, 0.003, 0.0),
    "two-point-like": (60, 0.25, 0.25),
    "worse-never": (100, 0.0, 0.3),
    "asymmetric": (200, 0.05, 0.02),
    "all-tied": (50, 0.0, 0.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXACT_CASES))
def test_exact_method_coverage_simulated(name: str) -> None:
    n, p_worse, p_better = EXACT_CASES[name]
    reps = 10_000
    draws = np.random.default_rng(11).multinomial(n, [p_worse, p_better, 1.0 - p_worse - p_better], size=reps)
    outcomes, frequency = np.unique(draws[:, :2], axis=0, return_counts=True)
    true = p_worse - p_better
    upper_misses = lower_misses = 0
    for (w, b), count in zip(outcomes.tolist(), frequency.tolist(), strict=True):
        lower, upper = _exact_limits(w, b, n)
        upper_misses += count * (upper < true)
        lower_misses += count * (lower > true)
    assert _plausible(upper_misses, reps), f"{name}: upper missed {upper_misses} of {reps}"
    assert _plausible(lower_misses, reps), f"{name}: lower missed {lower_misses} of {reps}"
