"""Sequential admission: anytime-valid bounds, the stopping rule, and the plan's stopping-n figures.

Validity under continuous monitoring is checked by simulation: a confidence sequence misses when its bound ever
excludes the true mean at any number of units up to n_max, which (the capital being monotone in m) is exactly when
the capital process at the true mean ever reaches 1/δ. Misses are judged by a one-sided binomial test at level 1e-3
against δ.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from decimal import Decimal

import numpy as np
import pytest
from scipy import stats

from invar.errors import InvarError
from invar.stats import StatisticsError, betting
from invar.stats import sequential as seq

DELTA = 0.05

Sampler = Callable[[np.random.Generator, int, int], np.ndarray]


def _trinomial(p_worse: float, p_better: float) -> Sampler:
    def draw(rng: np.random.Generator, reps: int, n: int) -> np.ndarray:
        u = rng.random((reps, n))
        return np.where(u < p_worse, 1.0, np.where(u >= 1.0 - p_better, -1.0, 0.0))

    return draw


def _two_point(p: float, lo: float, hi: float) -> Sampler:
    return lambda rng, reps, n: np.where(rng.random((reps, n)) < p, hi, lo)


# name: (sampler, true mean, a, b, methods)
CASES: dict[str, tuple[Sampler, float, float, float, tuple[str, ...]]] = {
    "rare-event": (_trinomial(0.003, 0.0), 0.003, -1.0, 1.0, seq.SEQUENTIAL_METHODS),
    "balanced": (_trinomial(0.25, 0.25), 0.0, -1.0, 1.0, seq.SEQUENTIAL_METHODS),
    "skewed": (_trinomial(0.05, 0.01), 0.04, -1.0, 1.0, seq.SEQUENTIAL_METHODS),
    "at-epsilon": (_trinomial(0.0125, 0.0075), 0.005, -1.0, 1.0, seq.SEQUENTIAL_METHODS),
    "boundary-corner": (_trinomial(0.97, 0.0), 0.97, -1.0, 1.0, seq.SEQUENTIAL_METHODS),
    "two-point-range": (_two_point(0.3, 0.0, 1.0), 0.3, 0.0, 1.0, ("betting-sequence",)),
}


def _ever_misses(method: str, name: str, reps: int, n_max: int, seed: int) -> tuple[int, int]:
    """Runs whose upper / lower confidence sequence ever excludes the true mean, monitored at every unit."""
    sampler, mean, a, b, _ = CASES[name]
    rng = np.random.default_rng(seed)
    upper = lower = 0
    scales, weights = seq._components(method)
    for start in range(0, reps, 500):
        d = sampler(rng, min(500, reps - start), n_max)
        x = (d - a) / (b - a)
        bets = seq.trinomial_bets(d, DELTA, n_max) if method == "paired-binary-sequence" else seq.horizon_bets(
            x, DELTA, n_max
        )
        m = np.full(d.shape[0], (mean - a) / (b - a))
        m_up = np.minimum(m, 1.0 - 1e-12)  # the upper side tests means below 1, the lower side above 0
        m_low = np.maximum(m, 1e-12)
        upper += int(np.sum(seq.crossed_by(x, bets, m_up, "upper", DELTA, scales, weights)))
        lower += int(np.sum(seq.crossed_by(x, bets, m_low, "lower", DELTA, scales, weights)))
    return upper, lower


def _plausible(misses: int, reps: int) -> bool:
    return float(stats.binom.sf(misses - 1, reps, DELTA)) >= 1e-3


@pytest.mark.parametrize("name", sorted(CASES))
def test_continuous_monitoring_quick(name: str) -> None:
    for method in CASES[name][4]:
        upper, lower = _ever_misses(method, name, reps=300, n_max=400, seed=1)
        assert _plausible(upper, 300), f"{method}/{name}: upper ever missed in {upper} of 300 runs"
        assert _plausible(lower, 300), f"{method}/{name}: lower ever missed in {lower} of 300 runs"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_continuous_monitoring(name: str) -> None:
    for method in CASES[name][4]:
        upper, lower = _ever_misses(method, name, reps=10_000, n_max=2000, seed=7)
        assert _plausible(upper, 10_000), f"{method}/{name}: upper ever missed in {upper} of 10,000 runs"
        assert _plausible(lower, 10_000), f"{method}/{name}: lower ever missed in {lower} of 10,000 runs"


def test_monitoring_check_has_teeth() -> None:
    """A sequence that re-uses a fixed-n bound at every look (no Ville) misses far more than δ: the check sees it."""
    rng = np.random.default_rng(2)
    d = _trinomial(0.25, 0.25)(rng, 200, 400)
    misses = 0
    for row in d:
        means = np.cumsum(row) / np.arange(1, 401)
        sds = np.sqrt(0.5 / np.arange(1, 401))
        misses += bool(np.any(means[9:] - 1.645 * sds[9:] > 0.0))  # a one-sided z bound looked at every unit
    assert not _plausible(misses, 200)


# --- bounds -----------------------------------------------------------------------------------------------------


def test_betting_sequence_at_its_horizon_is_the_fixed_n_bound() -> None:
    """With n_max = n the sequence's process is the fixed-n betting process, which already holds at every t ≤ n."""
    d = _trinomial(0.05, 0.04)(np.random.default_rng(3), 1, 600)[0]
    (look,) = seq.sequence_bounds("betting-sequence", d, -1.0, 1.0, DELTA, 600, [600])
    fixed = betting(d, -1.0, 1.0, DELTA, order="plan")
    assert (look.lower, look.upper) == (fixed.lower, fixed.upper)


def test_bounds_narrow_as_units_arrive() -> None:
    d = _trinomial(0.02, 0.01)(np.random.default_rng(4), 1, 3000)[0]
    for method in seq.SEQUENTIAL_METHODS:
        looks = seq.sequence_bounds(method, d, -1.0, 1.0, DELTA, 3000, [500, 1000, 2000, 3000])
        assert all(a.lower <= b.lower and a.upper >= b.upper for a, b in itertools.pairwise(looks))
        assert looks[-1].lower < 0.01 < looks[-1].upper


# --- the stopping rule ----------------------------------------------------------------------------------------------

BATCHES = list(range(100, 4001, 100))


def test_clear_cases_stop_early() -> None:
    rng = np.random.default_rng(5)
    fine = _trinomial(0.002, 0.002)(rng, 1, 4000)[0]
    broken = _trinomial(0.05, 0.01)(rng, 1, 4000)[0]
    for method in seq.SEQUENTIAL_METHODS:
        admitted = seq.sequential_decision(method, fine, BATCHES, Decimal("0.005"), DELTA, 4000)
        assert admitted.answer == "Admitted"
        assert admitted.stop < 4000
        assert admitted.final.upper <= 0.005
        assert admitted.version == seq.SEQUENTIAL_VERSIONS[method]
        violated = seq.sequential_decision(method, broken, BATCHES, Decimal("0.005"), DELTA, 4000)
        assert violated.answer == "Violated"
        assert violated.final.lower > 0.005
        assert violated.stop < admitted.stop


def test_unknown_at_n_max_and_running_before() -> None:
    d = _trinomial(0.01, 0.01)(np.random.default_rng(6), 1, 400)[0]
    decision = seq.sequential_decision("paired-binary-sequence", d, [100, 200, 300, 400], 0.005, DELTA, 400)
    assert (decision.answer, decision.stop, len(decision.looks)) == ("Unknown", 400, 4)
    assert "n_max = 400 reached" in decision.reason
    running = seq.sequential_decision("paired-binary-sequence", d[:250], [100, 200, 300, 400], 0.005, DELTA, 400)
    assert (running.answer, running.stop) == ("Running", 200)


def test_admit_recomputes_the_stop_and_refuses_any_other() -> None:
    """The decision on exactly the units up to the stop is the same decision; a run holding more units (it went on)
    or fewer (it stopped where the rule does not) is refused with one line."""
    d = _trinomial(0.002, 0.002)(np.random.default_rng(7), 1, 4000)[0]
    full = seq.sequential_decision("betting-sequence", d, BATCHES, 0.005, DELTA, 4000)
    again = seq.sequential_decision("betting-sequence", d[: full.stop], BATCHES, 0.005, DELTA, 4000)
    assert (again.answer, again.stop, again.looks) == (full.answer, full.stop, full.looks)
    seq.check_stop(full.stop, again)
    went_on = seq.sequential_decision("betting-sequence", d[: full.stop + 100], BATCHES, 0.005, DELTA, 4000)
    for call in (
        lambda: seq.check_stop(full.stop + 100, went_on),
        lambda: seq.check_stop(
            full.stop - 100,
            seq.sequential_decision("betting-sequence", d[: full.stop - 100], BATCHES, 0.005, DELTA, 4000),
        ),
    ):
        with pytest.raises(StatisticsError) as info:
            call()
        assert "\n" not in str(info.value)
        assert "stop" in str(info.value)


def test_bad_input_is_one_line() -> None:
    good = np.zeros(400)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: seq.sequential_decision("wald", good, [400], 0.005, DELTA, 400), "unknown sequential method"),
        (lambda: seq.sequential_decision("betting-sequence", np.array([]), [400], 0.005, DELTA, 400), "empty"),
        (lambda: seq.sequential_decision("betting-sequence", [0.0, math.nan], [400], 0.005, DELTA, 400), "NaN"),
        (lambda: seq.sequential_decision("betting-sequence", [0.0, 2.0], [400], 0.005, DELTA, 400), "outside"),
        (lambda: seq.sequential_decision("paired-binary-sequence", [0.5], [400], 0.005, DELTA, 400), "{-1, 0, 1}"),
        (lambda: seq.sequential_decision("betting-sequence", good, [200, 100, 400], 0.005, DELTA, 400), "increase"),
        (lambda: seq.sequential_decision("betting-sequence", good, [100, 300], 0.005, DELTA, 400), "n_max = 400"),
        (lambda: seq.sequential_decision("betting-sequence", np.zeros(500), [400], 0.005, DELTA, 400), "more than"),
        (lambda: seq.sequential_decision("betting-sequence", good, [400], 0.005, 1.5, 400), "delta"),
        (lambda: seq.sequential_decision("betting-sequence", good, [400], 2.0, DELTA, 400), "epsilon"),
        (lambda: seq.sequential_plan("betting-sequence", 0.7, 0.7, 0.005, DELTA, 400), "probabilities"),
    ]
    for call, fragment in cases:
        with pytest.raises(StatisticsError) as info:
            call()
        assert fragment in str(info.value)
        assert "\n" not in str(info.value)
        assert isinstance(info.value, InvarError)


# --- planning ----------------------------------------------------------------------------------------------------


def test_plan_reports_stopping_n() -> None:
    plan = seq.sequential_plan("paired-binary-sequence", 0.002, 0.002, 0.005, DELTA, 3000, 100, runs=300, seed=1)
    assert plan.admitted > 0.95
    assert plan.violated == 0.0
    assert 0 < plan.expected_n < 3000
    assert plan.expected_n <= plan.p90_n <= 3000
    assert plan.expected_n_error > 0.0


def test_plan_matches_the_decision_function() -> None:
    """The plan's fast simulation stops where sequential_decision stops, on the same data."""
    stops, answers = seq.simulate_stops("betting-sequence", 0.002, 0.002, 0.005, DELTA, 2000, 100, 20, seed=9)
    u = np.random.default_rng([9, 0]).random((20, 2000))
    d = np.where(u < 0.002, 1.0, np.where(u >= 1.0 - 0.002, -1.0, 0.0))
    agree = 0
    for row, stop, answer in zip(d, stops.tolist(), answers.tolist(), strict=True):
        decision = seq.sequential_decision("betting-sequence", row, list(range(100, 2001, 100)), 0.005, DELTA, 2000)
        expected = {"Admitted": 1, "Violated": -1, "Unknown": 0}[decision.answer]
        agree += (decision.stop, expected) == (stop, answer)
    assert agree >= 19  # the plan tests at ε itself, the bounds on their 2^-42 grid: a tie may differ


@pytest.mark.slow
def test_goal_figures() -> None:
    """With n_max giving the boundary case power 0.8: clearly fine and clearly broken candidates stop in at most
    half of the fixed-n default's 5,101 units on average, the boundary case in at most 1.3 times."""
    for method in seq.SEQUENTIAL_METHODS:
        boundary = seq.sequential_max_n(method, 0.01, 0.01, 0.005, DELTA, 0.8, 100, runs=2000)
        assert boundary.admitted >= 0.8
        assert boundary.expected_n <= 1.3 * 5101
        for p_worse, p_better in ((0.002, 0.002), (0.05, 0.01)):
            clear = seq.sequential_plan(method, p_worse, p_better, 0.005, DELTA, boundary.n_max, 100, runs=2000)
            assert clear.expected_n <= 5101 / 2
