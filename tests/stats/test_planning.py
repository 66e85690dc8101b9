"""Sample-size planning: the powers it computes against brute force and simulation, and the table it renders."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from invar.parallel import forked
from invar.stats import (
    DEFAULT_BINARY_METHOD,
    METHODS,
    Assumed,
    Search,
    StatisticsError,
    betting,
    bound,
    maurer_pontil,
    paired_binary_exact,
    paired_binary_score,
    plan_table,
    planning,
    power_at,
    render_plan,
    required_n,
)


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(w, b) for w in range(n + 1) for b in range(n + 1 - w)]


def _counts_d(worse: int, better: int, n: int) -> np.ndarray:
    return np.concatenate([np.ones(worse), -np.ones(better), np.zeros(n - worse - better)])


def _brute_force_power(method: str, n: int, p_worse: float, p_better: float, epsilon: float, delta: float) -> float:
    """P(upper ≤ ε) by running the public bound on every possible (worse, better)."""
    total = 0.0
    for w, b in _pairs(n):
        probability = stats.multinomial.pmf([w, b, n - w - b], n, [p_worse, p_better, 1.0 - p_worse - p_better])
        if bound(method, _counts_d(w, b, n), -1.0, 1.0, delta).upper <= epsilon:
            total += float(probability)
    return total


@pytest.mark.parametrize(("method", "epsilon"), [("hoeffding", 0.45), ("maurer-pontil", 0.65)])
def test_exact_power_matches_brute_force(method: str, epsilon: float) -> None:
    args = (40, 0.15, 0.05, epsilon, 0.1)
    computed = power_at(method, 40, Assumed(0.15, 0.05), epsilon, 0.1)
    assert 0.05 < computed < 0.95
    assert computed == pytest.approx(_brute_force_power(method, *args), abs=1e-11)


@pytest.mark.parametrize(("method", "epsilon"), [("paired-binary-exact", 0.5), ("paired-binary-score", 0.25)])
def test_exact_method_power_matches_brute_force(method: str, epsilon: float) -> None:
    args = (8, 0.05, 0.3, epsilon, 0.05)
    computed = power_at(method, 8, Assumed(0.05, 0.3), epsilon, 0.05)
    assert 0.05 < computed < 0.95
    assert computed == pytest.approx(_brute_force_power(method, *args), abs=1e-9)


def test_score_plan_agrees_with_the_bound_at_the_planned_n() -> None:
    """At the planned n, every outcome the planner admits (w ≤ its threshold at each discordant count, the
    thresholds found with proofs shared across counts) has upper ≤ ε from the public function, and the next does
    not."""
    scenario = (Assumed(0.05, 0.05), 0.1, 0.05)
    n = required_n("paired-binary-score", *scenario)
    assert power_at("paired-binary-score", n, *scenario) >= 0.8 > power_at("paired-binary-score", n - 1, *scenario)
    planner = planning._ScorePlanner(planning._assumption(0.05, 0.05, None, 0.0, -1.0, 1.0), 0.1, 0.05)
    planner.power(n)
    for k in sorted(planner.previous)[::4]:
        w = planner.previous[k]
        if w >= 0:
            assert paired_binary_score(w, k - w, n, 0.05).upper <= 0.1
        if w + 1 <= k:
            assert paired_binary_score(w + 1, k - w - 1, n, 0.05).upper > 0.1


def test_required_n_is_where_power_crosses_the_target() -> None:
    scenario = (Assumed(0.05, 0.05), 0.1, 0.05)  # assumed, epsilon, delta
    n = required_n("maurer-pontil", *scenario)
    assert n == 397
    assert power_at("maurer-pontil", n, *scenario) >= 0.8 > power_at("maurer-pontil", n - 1, *scenario)
    exact = required_n("paired-binary-exact", *scenario)
    assert power_at("paired-binary-exact", exact, *scenario) >= 0.8
    assert power_at("paired-binary-exact", exact - 1, *scenario) < 0.8
    assert exact < n


def _simulated_successes(method: str, n: int, p_worse: float, p_better: float, epsilon: float, reps: int) -> int:
    rng = np.random.default_rng(2024)
    u = rng.random((reps, n))
    d = np.where(u < p_worse, 1.0, np.where(u >= 1.0 - p_better, -1.0, 0.0))
    function = maurer_pontil if method == "maurer-pontil" else betting
    return sum(function(row, -1.0, 1.0, 0.05).upper <= epsilon for row in d)


def test_planned_power_matches_simulation_of_the_bound() -> None:
    n, reps = 397, 2000
    hits = _simulated_successes("maurer-pontil", n, 0.05, 0.05, 0.1, reps)
    computed = power_at("maurer-pontil", n, Assumed(0.05, 0.05), 0.1, 0.05)
    assert float(stats.binomtest(hits, reps, computed).pvalue) > 1e-3


def test_betting_plan_reaches_its_power_in_simulation() -> None:
    n = required_n("betting", Assumed(0.05, 0.05), 0.1, 0.05, search=Search(reps=400))
    reps = 1000
    hits = _simulated_successes("betting", n, 0.05, 0.05, 0.1, reps)
    # Fresh simulations at the planned n: not significantly below the target power.
    assert float(stats.binom.cdf(hits, reps, 0.8)) > 1e-3
    assert power_at("betting", n, Assumed(0.05, 0.05), 0.1, 0.05, search=Search(reps=400)) >= 0.8


@pytest.mark.parametrize("method", ["hoeffding", "maurer-pontil"])
def test_variance_plan_is_conservative(method: str) -> None:
    """A stated variance plans conservatively: a distribution with that mean and variance admits more often."""
    n = required_n(method, Assumed(variance=0.1, mean=0.0), 0.1, 0.05)
    reps = 1000
    rng = np.random.default_rng(8)
    u = rng.random((reps, n))
    d = np.where(u < 0.05, 1.0, np.where(u >= 0.95, -1.0, 0.0))  # mean 0, variance 0.1
    hits = sum(bound(method, row, -1.0, 1.0, 0.05).upper <= 0.1 for row in d)
    assert hits / reps >= 0.8
    assert power_at(method, n - 1, Assumed(variance=0.1), 0.1, 0.05) < 0.8


def test_plan_table_and_rendering() -> None:
    rows = plan_table(Assumed(0.05, 0.05), 0.1, 0.05, search=Search(reps=400))
    assert [row.method for row in rows] == list(METHODS)
    by_method = {row.method: row for row in rows}
    assert by_method[DEFAULT_BINARY_METHOD].n < by_method["maurer-pontil"].n < by_method["hoeffding"].n
    for row in rows:
        if row.basis.startswith("Monte Carlo"):  # a fresh estimate: within three standard errors of the target
            error = float(row.basis.rsplit("standard error ", 1)[1])
            assert row.power >= row.power_target - 3.0 * error
        else:
            assert row.power >= row.power_target
        assert row.version.startswith(row.method + "/")
    text = render_plan(rows)
    assert "p_worse=0.05, p_better=0.05" in text
    for row in rows:
        assert row.method in text
        assert f"{row.n:,}" in text
    encoded = json.loads(json.dumps([row.model_dump(mode="json") for row in rows]))
    assert encoded[1]["n"] == by_method["maurer-pontil"].n
    assert "standard error" in by_method["betting"].basis
    variance_rows = plan_table(Assumed(variance=0.1), 0.1, 0.05)
    assert [row.method for row in variance_rows] == ["hoeffding", "maurer-pontil"]
    assert all(row.basis.startswith("conservative") for row in variance_rows)


def test_exact_plan_agrees_with_the_bound_at_the_planned_n() -> None:
    """Counts the planner calls successes give an upper limit ≤ ε from the public function, and vice versa."""
    n, epsilon = 114, 0.1
    assert required_n("paired-binary-exact", Assumed(0.05, 0.05), epsilon, 0.05) == n
    for discordant in (6, 11, 16):
        uppers = [paired_binary_exact(w, discordant - w, n, 0.05).upper for w in range(discordant + 1)]
        admitted = [u <= epsilon for u in uppers]
        assert admitted == sorted(admitted, reverse=True)  # a threshold in worse, as the planner assumes
        assert any(admitted)


def test_planning_errors() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: required_n("wald", Assumed(0.01, 0.01), 0.005, 0.05), "unknown bound method"),
        (lambda: required_n("maurer-pontil", Assumed(0.6, 0.6), 0.005, 0.05), "exceeds 1"),
        (lambda: required_n("maurer-pontil", Assumed(0.02, 0.01), 0.005, 0.05), "not below epsilon"),
        (lambda: required_n("maurer-pontil", Assumed(0.01, 0.01), 0.005, 0.05, power=1.0), "power"),
        (lambda: required_n("maurer-pontil", Assumed(0.01, 0.01), 0.005, 1.0), "delta"),
        (lambda: required_n("betting", Assumed(variance=0.1), 0.1, 0.05), "needs a distribution"),
        (lambda: required_n("maurer-pontil", Assumed(variance=2.0), 0.1, 0.05), "impossible"),
        (lambda: required_n("maurer-pontil", Assumed(0.01, 0.01, variance=0.1), 0.1, 0.05), "not both"),
        (lambda: required_n("maurer-pontil", Assumed(), 0.1, 0.05), "state the assumption"),
        # Searched to n_max and not reached; and, far beyond n_max (the normal approximation needs more than twice
        # it), refused before any search, naming the n it needs.
        (lambda: required_n("maurer-pontil", Assumed(0.01, 0.01), 0.005, 0.05, search=Search(n_max=3000)),
         "not reached with 3000"),
        (lambda: required_n("maurer-pontil", Assumed(0.01, 0.01), 0.005, 0.05, search=Search(n_max=1000)),
         "needs about 4,946 units (the normal approximation, below which no method admits much sooner), beyond the "
         "1,000 a plan searches"),
        (lambda: required_n("maurer-pontil", Assumed(0.01, 0.01, a=0.0, b=1.0), 0.005, 0.05), "d in [-1, 1]"),
        (lambda: required_n("hoeffding", Assumed(float("nan"), 0.01), 0.005, 0.05), "finite"),
    ]
    for call, fragment in cases:
        with pytest.raises(StatisticsError) as info:
            call()
        assert fragment in str(info.value)
        assert "\n" not in str(info.value)


@pytest.mark.slow
def test_seed_scenario_table() -> None:
    """p_worse = p_better = 0.01, ε = 0.005, δ = 0.05, power 0.8: the numbers docs/statistics.md reports, and the
    goal: the default within 1.05 times the z-test's 4,946 units."""
    rows = {row.method: row for row in plan_table(Assumed(0.01, 0.01), 0.005, 0.05)}
    assert rows["hoeffding"].n == 263_494
    assert rows["maurer-pontil"].n == 16_297
    assert rows["paired-binary-exact"].n == 6_142
    assert rows["paired-binary-score"].n == 5_101
    assert rows[DEFAULT_BINARY_METHOD].n <= 1.05 * 4_946
    assert 7_000 < rows["betting"].n < 7_500


@pytest.mark.slow
def test_betting_power_claim_holds_in_independent_replications() -> None:
    """The betting row's power is a fresh estimate: independent runs at the planned n reproduce it within Monte
    Carlo error (no selection inflates it, unlike the first n where one seed's simulation cleared the target)."""
    row = planning.plan_row("betting", Assumed(0.01, 0.01), 0.005, 0.05)
    error = float(row.basis.rsplit("standard error ", 1)[1])
    assumption = planning._assumption(0.01, 0.01, None, 0.0, -1.0, 1.0)
    runs = 8000
    hits = planning._betting_hits(row.n, assumption, 0.005, 0.05, runs, [123, 4])
    fresh = hits / runs
    assert abs(fresh - row.power) <= 3.0 * math.hypot(error, math.sqrt(fresh * (1 - fresh) / runs))
    assert fresh >= 0.8 - 3.0 * math.sqrt(0.16 / runs)


@pytest.mark.parametrize(
    ("method", "planner_class", "expected"),
    [("paired-binary-exact", planning._ExactPlanner, 114), ("paired-binary-score", planning._ScorePlanner, 78)],
)
def test_exact_plans_compute_the_exact_power_at_n_and_n_minus_1_only(
    method: str, planner_class: type, expected: int
) -> None:
    """The search runs on the cheap power; the exact power is computed where it decides (n reaches the target, n − 1
    does not), and is the same number a fresh computation at that n gives (no dependence on the search's path).
    paired-binary-exact computes it at n only: at n − 1 an upper bound below the target settles it (checked here
    against the exact power there)."""
    assumption = planning._assumption(0.05, 0.05, None, 0.0, -1.0, 1.0)
    planner = planner_class(assumption, 0.1, 0.05)
    start = round(planning.START_FACTORS[method] * planning._normal_guess(assumption, 0.1, 0.05, 0.8))
    n, power = planner.plan(0.8, 1, 10_000_000, start)
    assert n == expected
    assert power == planner.exact[n] >= 0.8
    assert power_at(method, n, Assumed(0.05, 0.05), 0.1, 0.05) == power
    if method == "paired-binary-exact":
        assert sorted(planner.exact) == [n]
        assert planner.below(n - 1, 0.8)
        assert power_at(method, n - 1, Assumed(0.05, 0.05), 0.1, 0.05) < 0.8
    else:  # at n = 78 the score test's supremum is inside the domain: searched twice
        assert 0.8 > planner.exact[n - 1] == power_at(method, n - 1, Assumed(0.05, 0.05), 0.1, 0.05)


def test_exact_planners_upper_bound_never_claims_a_power_below_the_target_wrongly() -> None:
    """`_ExactPlanner.below(n, target)` (the shortcut for n − 1) holds only where the exact power is below target."""
    assumption = planning._assumption(0.05, 0.05, None, 0.0, -1.0, 1.0)
    planner = planning._ExactPlanner(assumption, 0.1, 0.05)
    for n in (100, 110, 113, 114, 120):
        exact = planner.power(n)
        for target in (0.5, exact, 0.8, float(np.nextafter(exact, 1.0)), 0.9):
            if planner.below(n, target):
                assert exact < target, (n, target)
    assert planner.below(113, 0.8)  # where the plan uses it
    assert not planner.below(114, 0.8)


def test_exact_plan_searches_again_when_the_cheap_power_misleads() -> None:
    """A cheap power that points at the wrong n is caught by the exact check at n and n − 1; the plan then searches
    on the exact power from the same start, the search it always made, and finds the same n."""
    assumption = planning._assumption(0.05, 0.05, None, 0.0, -1.0, 1.0)
    planner = planning._ExactPlanner(assumption, 0.1, 0.05)
    true_anchor = planner.anchor_power
    planner.anchor_power = lambda n: true_anchor(n + 10)  # type: ignore[method-assign]
    start = round(planning.START_FACTORS["paired-binary-exact"] * planning._normal_guess(assumption, 0.1, 0.05, 0.8))
    n, power = planner.plan(0.8, 1, 10_000_000, start)
    assert n == 114
    assert len(planner.exact) > 2
    assert power == planner.exact[114] >= 0.8 > planner.exact[113]


def test_parallel_planning_gives_the_numbers_of_one_process() -> None:
    """plan_table's worker processes and the betting simulation's blocks in parallel change no number."""
    scenario = (Assumed(0.05, 0.05), 0.1, 0.05)
    with forked():
        rows = plan_table(*scenario, search=Search(reps=400),
                          methods=("maurer-pontil", "betting", "paired-binary-exact"))
    alone = [planning.plan_row(row.method, *scenario, search=Search(reps=400)) for row in rows]
    assert rows == alone
    assumption = planning._assumption(0.05, 0.05, None, 0.0, -1.0, 1.0)
    starts = list(range(0, 700, planning._CHUNK))
    in_one = planning._betting_share(300, assumption, 0.1, 0.05, 700, [5, 1], starts)
    with forked():
        assert planning._betting_hits(300, assumption, 0.1, 0.05, 700, [5, 1]) == in_one


def test_a_call_beside_the_table_gives_its_own_result_and_the_tables_rows() -> None:
    """`plan_table_beside` runs one more call in the table's pool (the contract's own power, in `use plan`): the rows
    are the table's, the call's result its own, forked or not; rows are reported as they are ready, the call is not."""
    scenario = (Assumed(0.05, 0.05), 0.1, 0.05, 0.8)
    methods = ("maurer-pontil", "paired-binary-exact")
    table = plan_table(*scenario, methods=methods)

    def beside() -> float:
        return power_at("paired-binary-exact", 300, Assumed(0.05, 0.05), 0.1, 0.05)

    expected = beside()
    for fork in (False, True):
        reported: list[str] = []
        with forked() if fork else contextlib.nullcontext():
            rows, got = planning.plan_table_beside(*scenario, beside, methods=methods,
                                                   done=lambda row, seen=reported: seen.append(row.method))
        assert (rows, got) == (table, expected)
        assert sorted(reported) == sorted(methods)


def test_normal_n_is_the_z_tests_and_refuses_what_plans_nothing() -> None:
    # 0/1 losses at 0.01 / 0.01: variance 0.02; (z_0.95 + z_0.8)² · 0.02 / 0.005²
    z = stats.norm.ppf(0.95) + stats.norm.ppf(0.8)
    assert planning.normal_n(Assumed(0.01, 0.01), 0.005, 0.05, 0.8) == int(0.02 * (z / 0.005) ** 2)
    with pytest.raises(StatisticsError, match="not below epsilon"):
        planning.normal_n(Assumed(0.05, 0.01), 0.005, 0.05, 0.8)
    # beyond reach, where every method refuses before it searches: no n either
    with pytest.raises(StatisticsError, match="beyond the 1,000 a plan searches"):
        planning.normal_n(Assumed(0.01, 0.01), 0.005, 0.05, 0.8, search=Search(n_max=1000))


def test_statistics_fork_no_process_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside `invar.parallel.forked()` the pieces run in this process, in order."""
    import invar.parallel

    def no_fork(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process pool was started outside forked()")

    monkeypatch.setattr(invar.parallel, "ProcessPoolExecutor", no_fork)
    assert invar.parallel.map_calls([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
    rows = plan_table(Assumed(0.05, 0.05), 0.1, 0.05, methods=("maurer-pontil", "paired-binary-exact"))
    assert [r.method for r in rows] == ["maurer-pontil", "paired-binary-exact"]


def test_vectorised_clopper_pearson_limits_are_the_bounds_own() -> None:
    """The planners compute U_π for all counts at once; each is the number the bound computes for its count."""
    from invar.stats import trinomial

    for n in (1, 8, 114, 6_142):
        for gamma in (0.0005, 0.001):
            ks = np.arange(0, min(n, 300) + 1)
            expected = [trinomial.clopper_pearson_upper(int(k), n, gamma) for k in ks]
            assert planning._clopper_pearson_uppers(ks, n, gamma) == expected
