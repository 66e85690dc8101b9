"""paired-binary-score: the score-ordered exact bound for 0/1 losses.

Its numbers on the seed example, its structure (mirror, grid, monotone in the counts and δ), its validity by exact
enumeration of every outcome for small n (the miss probability maximised over (p_worse, p_better) on a grid, on
every simplex edge and corner, and just past every reported limit, where the supremum of a miss probability is
approached), its proof machinery against direct computation, and coverage by simulation.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from scipy import stats

from invar.stats import DEFAULT_BINARY_METHOD, bound, paired_binary_exact, paired_binary_score, score

DELTA = 0.05


def _seed_differences() -> np.ndarray:
    d = np.concatenate([np.ones(21), -np.ones(20), np.zeros(1959)])
    return np.random.default_rng(0).permutation(d)


def test_seed_example_numbers() -> None:
    """n = 2000, 21 worse, 20 better: [-0.0049, 0.0060], against [-0.0064, 0.0074] for paired-binary-exact."""
    result = bound("paired-binary-score", _seed_differences(), -1.0, 1.0, DELTA)
    assert result.version == "paired-binary-score/1"
    assert (round(result.lower, 4), round(result.upper, 4)) == (-0.0049, 0.006)
    old = paired_binary_exact(21, 20, 2000, DELTA)
    assert old.lower < result.lower < result.estimate < result.upper < old.upper


def test_default_for_binary_losses() -> None:
    assert DEFAULT_BINARY_METHOD == "paired-binary-score"


def test_limits_mirror_and_lie_on_the_grid() -> None:
    forward, mirrored = paired_binary_score(12, 3, 150, DELTA), paired_binary_score(3, 12, 150, DELTA)
    assert forward.lower == -mirrored.upper
    assert forward.upper == -mirrored.lower
    bits = score.grid_bits(150)
    for value in (forward.lower, forward.upper):
        assert ((value + 1.0) * 2.0**bits).is_integer()


def test_limits_move_with_the_counts_and_delta() -> None:
    base = paired_binary_score(10, 10, 500, DELTA)
    one_more_worse = paired_binary_score(11, 10, 500, DELTA)
    assert one_more_worse.upper > base.upper
    assert one_more_worse.lower > base.lower
    assert paired_binary_score(10, 10, 500, 0.01).upper > base.upper
    assert paired_binary_score(7, 0, 7, DELTA).upper == 1.0
    tied = paired_binary_score(0, 0, 1, DELTA)
    assert -1.0 < tied.lower < 0.0 < tied.upper < 1.0


def test_ordering_statistic() -> None:
    """S is Tango's limit: above the estimate, below the crude bound the search relies on, and it orders outcomes
    as the normal approximation would (more worse units, larger S)."""
    n, z = 500, score.order_z(DELTA)
    w = np.arange(0, 30)
    s = score.tango_limits(w, 30 - w, n, z)
    assert np.all(s >= (2 * w - 30) / n)
    assert np.all(s <= (2 * w - 30 + z * math.sqrt(n)) / n + score.ORDER_MARGIN / 2)
    assert np.all(np.diff(s) > 0)
    ordering = score.Ordering(n, z)
    assert ordering.statistic(12, 18) == float(np.max(s[:13]))


def test_memoised_bounds_equal_fresh_ones() -> None:
    """A plan's remembering Bounder gives the very numbers a fresh computation gives, whatever it saw before."""
    n, delta0 = 2000, 0.004
    ordering = score.Ordering(n, score.order_z(DELTA))
    tests = [score.make_test(w, 41 - w, n, DELTA, ordering) for w in (18, 21, 24)]
    width = max(t.c.size for t in tests)
    matrix = np.stack([np.concatenate([t.c, np.full(width - t.c.size, t.c[-1])]) for t in tests])
    a1 = np.array([0.01, 0.015, 0.02, 0.025, 0.0251])
    a2 = np.array([0.015, 0.02, 0.025, 0.03, 0.0251])
    remembering = score.Bounder(n, delta0)
    for _ in range(2):
        for row in range(3):
            owner = np.full(a1.size, row)
            kept = remembering.bounds(matrix, a1, a2, tests[0].alpha, owner)
            fresh = score.Bounder(n, delta0, remember=False).bounds(tests[row].c, a1, a2, tests[0].alpha)
            assert np.array_equal(kept, fresh)


def test_cell_bounds_cover_the_tail() -> None:
    """Every cell bound is at least the probability of the extreme set at every boundary point of its cell."""
    n = 300
    ordering = score.Ordering(n, score.order_z(DELTA))
    rng = np.random.default_rng(4)
    for _ in range(12):
        k = int(rng.integers(5, 60))
        w = int(rng.integers(0, k + 1))
        delta0 = float(rng.uniform(-0.05, 0.05))
        test = score.make_test(w, k - w, n, DELTA, ordering)
        lo, hi = test.domain(delta0)
        if lo > hi:
            continue
        u1, u2 = score.fixed_cells(n, lo, hi)
        for fraction in (1.0, 0.3, 0.05):
            a1 = np.maximum(u1, lo)
            a2 = a1 + (np.minimum(u2, hi) - a1) * fraction
            cells = score.Bounder(n, delta0, remember=False).bounds(test.c, a1, a2, test.alpha)
            counts = np.arange(test.c.size)
            for i in range(a1.size):
                points = np.linspace(a1[i], a2[i], 9)
                q = np.clip(0.5 * (1.0 + delta0 / np.maximum(points, 1e-300)), 0.0, 1.0)
                within = np.where(
                    test.c[None, :] < 0, 0.0, stats.binom.cdf(np.maximum(test.c, 0)[None, :], counts, q[:, None])
                )
                tails = np.sum(stats.binom.pmf(counts[None, :], n, points[:, None]) * within, axis=1)
                assert np.max(tails) <= cells[i] or cells[i] >= 1.0


def test_kept_cell_parts_are_the_fresh_cells() -> None:
    """An outcome's proofs share the cells' Δ0-independent parts (`score.CellParts`): every field of every cell,
    padding and signed zeros included, is the byte-identical array a fresh computation gives."""
    rng = np.random.default_rng(5)
    for n in (1, 7, 60, 700):
        parts, e = score.CellParts(n), score.edges(n)
        for trial in range(24):
            delta0 = float(rng.choice([rng.uniform(-1.0, 1.0), rng.uniform(-0.1, 0.1), 0.0]))
            i = rng.integers(0, e.size - 1, int(rng.integers(1, 9)))
            u1, u2 = e[i], e[i + 1]
            if trial % 3 == 1:  # four-way splits, as the branch-and-bound makes them
                j, width = rng.integers(0, 4, i.size), u2 - u1
                u1, u2 = u1 + width * (j / 4), np.where(j + 1 < 4, u1 + width * ((j + 1) / 4), u2)
            elif trial % 3 == 2:  # points
                u1 = u2 = rng.uniform(0.0, 1.0, i.size)
            fresh, kept = score._cells(n, u1, u2, delta0), score._cells(n, u1, u2, delta0, parts)
            for name in score._Cells.__dataclass_fields__:
                a, b = getattr(fresh, name), getattr(kept, name)
                assert (a.dtype, a.shape) == (b.dtype, b.shape), name
                assert a.tobytes() == b.tobytes(), name


# --- validity by exact enumeration --------------------------------------------------------------------------------


@cache
def _uppers(n: int) -> dict[tuple[int, int], float]:
    """The upper limit of every outcome; the lower limit of (w, b) is −upper(b, w)."""
    return {(w, b): score.upper_limit(w, b, n, DELTA) for w in range(n + 1) for b in range(n + 1 - w)}


def _miss_probabilities(n: int, grid: int = 60) -> tuple[float, float]:
    """Largest P(upper < Δ) over true (p_worse, p_better): every outcome's probability summed exactly, maximised
    over a grid of the simplex, its edges and corners (with points 1e-12 to 1e-1 from them), and the lines just past
    every reported limit (p_worse − p_better = limit + 1e-12), where a miss probability jumps up. By the mirror
    symmetry the lower limit's largest miss probability is the same number."""
    uppers = _uppers(n)
    pairs = list(uppers)
    upper = np.array([uppers[p] for p in pairs])
    w = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    log_coef = np.array([math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(y + 1) - math.lgamma(n - x - y + 1)
                         for x, y in pairs])
    near = np.concatenate([[0.0], np.logspace(-12, -1, 23)])
    thetas = []
    steps = np.linspace(0.0, 1.0, grid + 1)
    for pw in np.unique(np.concatenate([steps, near, 1.0 - near])):
        for pb in np.unique(np.concatenate([steps, near, 1.0 - pw - near, [1.0 - pw]])):
            if 0.0 <= pb <= 1.0 - pw:
                thetas.append((pw, pb))
    for limit in np.unique(upper[upper < 1.0]):
        target = limit + 1e-12
        lo_b, hi_b = max(0.0, -target), (1.0 - target) / 2.0
        for pb in np.unique(np.concatenate([np.linspace(lo_b, hi_b, 41), lo_b + near, hi_b - near])):
            if lo_b <= pb <= hi_b:
                thetas.append((min(1.0, pb + target), pb))
    theta = np.array(thetas)
    misses = np.empty(theta.shape[0])
    block = 512  # points at a time: temporaries of ~1 MB instead of ~100 MB each (page faults), the same numbers
    for start in range(0, theta.shape[0], block):
        pw_, pb_ = theta[start : start + block, :1], theta[start : start + block, 1:]
        p0 = np.clip(1.0 - pw_ - pb_, 0.0, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = (log_coef + np.where(w > 0, w * np.log(pw_), 0.0) + np.where(b > 0, b * np.log(pb_), 0.0)
                     + np.where(n - w - b > 0, (n - w - b) * np.log(p0), 0.0))
        probability = np.nan_to_num(np.exp(log_p))
        misses[start : start + block] = np.sum(probability * (upper[None, :] < (pw_ - pb_)), axis=1)
    return float(misses.max()), float(upper.size)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_exact_enumeration_small_n(n: int) -> None:
    worst, _ = _miss_probabilities(n)
    assert worst <= DELTA
    alpha = DELTA - score.GAMMA_FRACTION * DELTA
    assert worst > 0.9 * alpha  # not vacuous: the test spends nearly all of δ − γ


def test_corner_of_the_simplex() -> None:
    """At p_better = 0, p_worse just above upper(n − 1, 0) every outcome but all-worse misses: the miss
    probability approaches 1 − upper^n, which the test keeps at or below α = δ − γ (0.0495)."""
    for n in (8, 25):
        u = score.upper_limit(n - 1, 0, n, DELTA)
        assert 0.0494 < 1.0 - u**n <= DELTA - score.GAMMA_FRACTION * DELTA


@pytest.mark.slow
@pytest.mark.parametrize("n", [12, 25])  # every n up to 40: bench/statistical_figures.py (docs/statistics.md)
def test_exact_enumeration(n: int) -> None:
    worst, _ = _miss_probabilities(n, grid=80)
    assert worst <= DELTA


# --- coverage by simulation ---------------------------------------------------------------------------------------

CASES = {
    "rare-event": (300, 0.003, 0.0),
    "balanced": (60, 0.25, 0.25),
    "worse-never": (100, 0.0, 0.3),
    "asymmetric": (200, 0.05, 0.02),
    "boundary-corner": (40, 0.96, 0.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_coverage_simulated(name: str) -> None:
    n, p_worse, p_better = CASES[name]
    reps = 10_000
    draws = np.random.default_rng(13).multinomial(n, [p_worse, p_better, 1.0 - p_worse - p_better], size=reps)
    outcomes, frequency = np.unique(draws[:, :2], axis=0, return_counts=True)
    true = p_worse - p_better
    upper_misses = lower_misses = 0
    for (w, b), count in zip(outcomes.tolist(), frequency.tolist(), strict=True):
        result = paired_binary_score(w, b, n, DELTA)
        upper_misses += count * (result.upper < true)
        lower_misses += count * (result.lower > true)
    for misses in (upper_misses, lower_misses):
        assert float(stats.binom.sf(misses - 1, reps, DELTA)) >= 1e-3, f"{name}: {misses} misses of {reps}"


def test_bad_counts_are_one_line() -> None:
    from invar.errors import InvarError
    from invar.stats import StatisticsError

    cases = [
        (lambda: paired_binary_score(5, 6, 10, DELTA), "exceeds n"),
        (lambda: paired_binary_score(0, 0, 0, DELTA), "at least 1"),
        (lambda: paired_binary_score(-1, 0, 10, DELTA), "at least 0"),
        (lambda: paired_binary_score(True, 0, 10, DELTA), "integer"),
        (lambda: paired_binary_score(1, 1, 10, 1.0), "delta"),
        (lambda: bound("paired-binary-score", np.array([0.5]), -1.0, 1.0, DELTA), "{-1, 0, 1}"),
        (lambda: bound("paired-binary-score", np.zeros(3), -2.0, 2.0, DELTA), "a=-1, b=1"),
        (lambda: bound("paired-binary-score", np.array([0.0, math.nan]), -1.0, 1.0, DELTA), "NaN"),
        (lambda: bound("paired-binary-score", np.array([]), -1.0, 1.0, DELTA), "empty"),
    ]
    for call, fragment in cases:
        with pytest.raises(StatisticsError) as info:
            call()
        assert fragment in str(info.value)
        assert "\n" not in str(info.value)
        assert isinstance(info.value, InvarError)
