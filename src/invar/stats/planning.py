"""Sample-size planning: how many paired units each bound method needs under a stated assumption.

Decision: the required n of a method is the smallest n at which its upper bound is ≤ ε with probability ≥ the
target power, when the data follow the stated assumption. Power is computed the way that is exact where it is
feasible and conservative where it is not, and each row says which:

* trinomial assumption (0/1 losses: p_worse, p_better), Hoeffding and Maurer–Pontil: exact, by summing the
  probabilities of every (worse, better) count whose bound is ≤ ε (the bound depends on the data only through the
  counts). Mass beyond 1e-13 in the tails of the count distributions is counted as failure, so the power is a lower
  bound that is exact to 1e-12.
* trinomial, paired-binary-exact: exact in the same way; a count "succeeds" when the test proves H0: Δ ≥ ε − 2^-30,
  which implies the reported upper limit is ≤ ε (see `invar.stats.trinomial`).
* trinomial, betting: the bound depends on the order of the units, so power is simulated (fixed seed) and n is
  where the one-sided 95% Clopper–Pearson lower limit of the simulated power reaches the target: conservative with
  95% confidence.
* variance assumption (general [a, b], Hoeffding and Maurer–Pontil only): a lower bound on power from the
  Berry–Esseen inequality for the mean (C = 0.4748, E|X − μ|³ ≤ (b − a)σ²) and, for Maurer–Pontil, a Bernstein
  upper bound on the sample variance that fails with probability β = (1 − power)/20, charged to the power.

The search doubles n until the power is reached, then bisects; power is taken as non-decreasing in n, which holds
up to the small ripples of discrete distributions (the reported n reaches the target, n − 1 does not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy import stats

from invar.stats import bounds, trinomial
from invar.stats.bounds import METHODS, VERSIONS, StatisticsError

DECISION_MARGIN = 2.0**-30
"""Betting and paired-binary-exact plans test at ε − 2^-30, so a success implies the reported bound is ≤ ε despite
the bisection resolution of the bound (2^-41 to 2^-36)."""
TAIL_CUT = 1e-13
"""Count-distribution mass left out of the exact power sums (counted as failure)."""
BERRY_ESSEEN_C = 0.4748
"""Shevtsova (2011), iid summands."""
MONTE_CARLO_CONFIDENCE = 0.95
_CHUNK = 256  # simulated runs per vectorised block

_NORMAL = NormalDist()


@dataclass(frozen=True)
class PlanRow:
    """One method's required sample size under the stated assumption; JSON-ready via dataclasses.asdict."""

    method: str
    """Bound method (one of METHODS)."""
    version: str
    """The method's version string."""
    n: int
    """Smallest number of paired units at which P(upper bound ≤ ε) ≥ power_target."""
    power: float
    """Power at n as computed (the simulated estimate for Monte Carlo rows)."""
    power_target: float
    """The required probability of admission when the assumption holds."""
    epsilon: float
    """Largest allowed increase of the mean task loss."""
    delta: float
    """Error probability of the one-sided bound."""
    assumption: str
    """The stated distribution of d, in words."""
    basis: str
    """How power was computed: exact, Monte Carlo or conservative."""


# --- validation -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Assumption:
    p_worse: float | None
    p_better: float | None
    mean: float
    variance: float | None
    a: float
    b: float

    @property
    def trinomial(self) -> bool:
        return self.variance is None

    def words(self) -> str:
        if self.trinomial:
            return f"0/1 losses with p_worse={self.p_worse:g}, p_better={self.p_better:g}"
        return f"d in [{self.a:g}, {self.b:g}] with mean={self.mean:g}, variance={self.variance:g}"


def _probability(name: str, value: object) -> float:
    number = bounds.check_real(name, value)
    if not 0.0 <= number <= 1.0:
        raise StatisticsError(f"{name} must be a probability in [0, 1]; got {number!r}")
    return number


def _assumption(
    p_worse: float | None, p_better: float | None, variance: float | None, mean: float, a: float, b: float
) -> _Assumption:
    lo, hi = bounds.check_range(a, b)
    if variance is None:
        if p_worse is None or p_better is None:
            raise StatisticsError("state the assumption: p_worse and p_better (0/1 losses), or variance= and mean=")
        pw, pb = _probability("p_worse", p_worse), _probability("p_better", p_better)
        if pw + pb > 1.0:
            raise StatisticsError(f"p_worse + p_better = {pw + pb!r} exceeds 1")
        if (lo, hi) != (-1.0, 1.0):
            raise StatisticsError(f"a trinomial assumption means d in [-1, 1]; got a={lo!r}, b={hi!r}")
        return _Assumption(pw, pb, pw - pb, None, lo, hi)
    if p_worse is not None or p_better is not None:
        raise StatisticsError("state either p_worse/p_better or variance=, not both")
    mu, var = bounds.check_real("mean", mean), bounds.check_real("variance", variance)
    if not lo <= mu <= hi:
        raise StatisticsError(f"mean {mu!r} lies outside the declared range [{lo!r}, {hi!r}]")
    if not 0.0 <= var <= (mu - lo) * (hi - mu):
        raise StatisticsError(
            f"variance {var!r} is impossible for d in [{lo!r}, {hi!r}] with mean {mu!r}; "
            f"it must lie in [0, {(mu - lo) * (hi - mu)!r}]"
        )
    return _Assumption(None, None, mu, var, lo, hi)


# --- exact power under a trinomial ------------------------------------------------------------------------------


def _count_range(n: int, p: float) -> tuple[int, int]:
    """Counts of Bin(n, p) outside which at most TAIL_CUT of the mass lies."""
    if p <= 0.0:
        return 0, 0
    if p >= 1.0:
        return n, n
    lo = int(stats.binom.ppf(TAIL_CUT / 2, n, p))
    hi = int(stats.binom.ppf(1.0 - TAIL_CUT / 2, n, p))
    return max(0, lo), min(n, hi)


def _discordance(assumption: _Assumption) -> tuple[float, float]:
    """(π, q): probability a unit is discordant, and of "worse" given discordant."""
    pw, pb = float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0)
    pi = pw + pb
    return pi, (pw / pi if pi > 0.0 else 0.5)


def _power_by_counts(n: int, assumption: _Assumption, succeeds: Callable[[int, np.ndarray], np.ndarray]) -> float:
    """Σ P(D = k)·P(W = w | k) over the counts where succeeds(k, w) (w a vector of worse counts given k)."""
    pi, q = _discordance(assumption)
    k_lo, k_hi = _count_range(n, pi)
    total = 0.0
    for k in range(k_lo, k_hi + 1):
        w_lo, w_hi = _count_range(k, q)
        w = np.arange(w_lo, w_hi + 1)
        ok = succeeds(k, w)
        if ok.any():
            total += float(stats.binom.pmf(k, n, pi)) * float(np.sum(stats.binom.pmf(w[ok], k, q)))
    return min(1.0, total)


def _hoeffding_power(n: int, assumption: _Assumption, epsilon: float, delta: float) -> float:
    def succeeds(k: int, w: np.ndarray) -> np.ndarray:
        _, upper = bounds.hoeffding_limits((2 * w - k) / n, n, -1.0, 1.0, delta)
        return np.asarray(upper <= epsilon)

    return _power_by_counts(n, assumption, succeeds)


def _maurer_pontil_power(n: int, assumption: _Assumption, epsilon: float, delta: float) -> float:
    def succeeds(k: int, w: np.ndarray) -> np.ndarray:
        t = (2 * w - k).astype(np.float64)
        variance = (k - t * t / n) / (n - 1)
        _, upper = bounds.maurer_pontil_limits(t / n, variance, n, -1.0, 1.0, delta)
        return np.asarray(upper <= epsilon)

    return _power_by_counts(n, assumption, succeeds)


def _exact_power(n: int, assumption: _Assumption, epsilon: float, delta: float) -> float:
    gamma = trinomial.GAMMA_FRACTION * delta
    alpha = delta - gamma
    delta0 = epsilon - DECISION_MARGIN
    last = [-1]  # the largest succeeding w at the previous k: a warm start, the threshold moves slowly with k

    def succeeds(k: int, w: np.ndarray) -> np.ndarray:
        pi_upper = trinomial.clopper_pearson_upper(k, n, gamma)

        def ok(worse: int) -> bool:
            return trinomial.rejects(delta0, 2 * worse - k, n, pi_upper, alpha)

        # The test's p-value grows with W − B at fixed k, so the successes are w ≤ threshold.
        guess = min(k, max(0, last[0] + 1))
        if ok(guess):
            while guess < k and ok(guess + 1):
                guess += 1
        else:
            while guess >= 0 and not ok(guess):
                guess -= 1
        last[0] = guess
        return np.asarray(w <= guess)

    return _power_by_counts(n, assumption, succeeds)


# --- simulated power (betting) ----------------------------------------------------------------------------------


def _betting_power(
    n: int, assumption: _Assumption, epsilon: float, delta: float, reps: int, seed: int
) -> tuple[float, float]:
    """(simulated power, its one-sided Clopper–Pearson lower limit) for the betting upper bound."""
    pw, pb = float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0)
    m_star = (epsilon + 1.0) / 2.0 - DECISION_MARGIN  # ε on the rescaled [0, 1] axis, minus the margin
    hits = 0
    for start in range(0, reps, _CHUNK):
        rows = min(_CHUNK, reps - start)
        # Common random numbers: run r of every n starts with the same units, so power is smooth in n.
        u = np.random.default_rng([seed, start]).random((n, rows)).T
        x = np.where(u < pw, 1.0, np.where(u >= 1.0 - pb, 0.0, 0.5))
        bets = bounds.plugin_bets(x, delta)
        hits += int(np.sum(bounds.betting_crosses(x, bets, np.full(rows, m_star), "upper", delta)))
    lower = 0.0 if hits == 0 else float(stats.beta.ppf(1.0 - MONTE_CARLO_CONFIDENCE, hits, reps - hits + 1))
    return hits / reps, lower


# --- conservative power under a variance assumption ---------------------------------------------------------------


def _normal_lower(n: int, assumption: _Assumption, threshold: float) -> float:
    """Lower bound on P(mean of n draws ≤ threshold) by Berry–Esseen."""
    sigma = math.sqrt(float(assumption.variance or 0.0))
    if sigma == 0.0:
        return 1.0 if assumption.mean <= threshold else 0.0
    z = (threshold - assumption.mean) * math.sqrt(n) / sigma
    return max(0.0, _NORMAL.cdf(z) - BERRY_ESSEEN_C * (assumption.b - assumption.a) / (sigma * math.sqrt(n)))


def _variance_power(method: str, n: int, assumption: _Assumption, epsilon: float, delta: float, power: float) -> float:
    a, b = assumption.a, assumption.b
    var = float(assumption.variance or 0.0)
    if method == "hoeffding":
        width = (b - a) * math.sqrt(-math.log(delta) / (2.0 * n))
        return _normal_lower(n, assumption, epsilon - width - 1e-15 * (b - a))
    beta = (1.0 - power) / 20.0
    log_beta = -math.log(beta)
    # Bernstein for the mean of (X − μ)² ∈ [0, (b − a)²]; Σ(X − X̄)² ≤ Σ(X − μ)².
    spread = (b - a) ** 2
    var_high = n / (n - 1) * (var + math.sqrt(2.0 * spread * var * log_beta / n) + spread * log_beta / (3.0 * n))
    log_term = math.log(2.0 / delta)
    half = math.sqrt(2.0 * var_high * log_term / n) + 7.0 * (b - a) * log_term / (3.0 * (n - 1))
    return max(0.0, _normal_lower(n, assumption, epsilon - half - 1e-15 * (b - a)) - beta)


# --- search -------------------------------------------------------------------------------------------------------


def _search(
    power_at: Callable[[int], tuple[float, float]], target: float, n_min: int, n_max: int, start: int
) -> tuple[int, float]:
    """Smallest n in [n_min, n_max] whose certified power (second element) reaches target; (n, reported power).

    Brackets from `start` by halving or doubling, then narrows by regula falsi (power is smooth in n), falling
    back to halving whenever the same end of the bracket moved twice in a row.
    """
    seen: dict[int, tuple[float, float]] = {}

    def at(n: int) -> tuple[float, float]:
        if n not in seen:
            seen[n] = power_at(n)
        return seen[n]

    fail, reach = n_min - 1, min(n_max, max(n_min, start))
    if at(reach)[1] >= target:
        while reach > n_min:
            lower = max(n_min, reach // 2)
            if at(lower)[1] < target:
                fail = lower
                break
            reach = lower
    else:
        while at(reach)[1] < target:
            if reach >= n_max:
                raise StatisticsError(
                    f"the target power is not reached with {n_max} units; relax epsilon or delta, or raise n_max"
                )
            fail, reach = reach, min(n_max, 2 * reach)
    moved: list[str] = []
    while reach - fail > 1:
        mid = (fail + reach) // 2
        if fail in seen and moved[-2:] not in (["fail", "fail"], ["reach", "reach"]):
            low, high = at(fail)[1], at(reach)[1]
            if high > low:
                guess = fail + round((target - low) / (high - low) * (reach - fail))
                mid = min(reach - 1, max(fail + 1, guess))
        if at(mid)[1] >= target:
            reach = mid
            moved.append("reach")
        else:
            fail = mid
            moved.append("fail")
    return reach, at(reach)[0]


def _normal_guess(assumption: _Assumption, epsilon: float, delta: float, power: float) -> int:
    """n of a one-sided z-test with known variance: a lower-side starting point for every method's search."""
    if assumption.trinomial:
        pw, pb = float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0)
        variance = pw + pb - (pw - pb) ** 2
    else:
        variance = float(assumption.variance or 0.0)
    z = _NORMAL.inv_cdf(1.0 - delta) + _NORMAL.inv_cdf(power)
    return max(1, int(variance * (z / (epsilon - assumption.mean)) ** 2))


def _twice(power_at: Callable[[int], float]) -> Callable[[int], tuple[float, float]]:
    """An exact (or conservative) power is both the reported and the certified power."""

    def both(n: int) -> tuple[float, float]:
        value = power_at(n)
        return value, value

    return both


def _power_function(
    method: str, assumption: _Assumption, epsilon: float, delta: float, power: float, reps: int, seed: int
) -> tuple[Callable[[int], tuple[float, float]], int, str]:
    """(n -> (reported power, certified power), smallest n the method accepts, basis in words)."""
    exact_basis = "exact: summed over the distribution of (worse, better) counts"
    if not assumption.trinomial:
        if method not in ("hoeffding", "maurer-pontil"):
            raise StatisticsError(
                f"{method} needs a distribution, not only a variance; state p_worse and p_better for 0/1 losses"
            )
        beta_note = "" if method == "hoeffding" else f" and Bernstein on the variance (beta={(1 - power) / 20:g})"
        return (
            _twice(lambda k: _variance_power(method, k, assumption, epsilon, delta, power)),
            1 if method == "hoeffding" else 2,
            f"conservative: Berry-Esseen (C={BERRY_ESSEEN_C}) on the mean{beta_note}",
        )
    if method == "hoeffding":
        return _twice(lambda k: _hoeffding_power(k, assumption, epsilon, delta)), 1, exact_basis
    if method == "maurer-pontil":
        return _twice(lambda k: _maurer_pontil_power(k, assumption, epsilon, delta)), 2, exact_basis
    if method == "paired-binary-exact":
        return (
            _twice(lambda k: _exact_power(k, assumption, epsilon, delta)),
            1,
            exact_basis + ", test at epsilon - 2^-30",
        )
    confidence = f"{MONTE_CARLO_CONFIDENCE:.0%}"
    return (
        lambda k: _betting_power(k, assumption, epsilon, delta, reps, seed),
        1,
        f"Monte Carlo: {reps} runs (seed {seed}); the {confidence} lower limit reaches the target",
    )


def _validated(
    method: str,
    p_worse: float | None,
    p_better: float | None,
    epsilon: float,
    delta: float,
    power: float,
    variance: float | None,
    mean: float,
    a: float,
    b: float,
) -> tuple[_Assumption, float, float, float]:
    if method not in METHODS:
        raise StatisticsError(f"unknown bound method {method!r}; choose one of {', '.join(METHODS)}")
    assumption = _assumption(p_worse, p_better, variance, mean, a, b)
    eps = bounds.check_real("epsilon", epsilon)
    dlt = bounds.check_delta(delta)
    target = bounds.check_real("power", power)
    if not 0.0 < target < 1.0:
        raise StatisticsError(f"power must lie strictly between 0 and 1 (e.g. 0.8); got {target!r}")
    if not assumption.mean < eps:
        raise StatisticsError(
            f"the assumed mean increase {assumption.mean!r} is not below epsilon {eps!r}: no sample size admits; "
            "plan for the increase you expect the candidate to have"
        )
    return assumption, eps, dlt, target


def required_n(
    method: str,
    p_worse: float | None,
    p_better: float | None,
    epsilon: float,
    delta: float,
    power: float = 0.8,
    *,
    variance: float | None = None,
    mean: float = 0.0,
    a: float = -1.0,
    b: float = 1.0,
    n_max: int = 10_000_000,
    reps: int = 2000,
    seed: int = 0,
) -> int:
    """Smallest n at which `method`'s upper bound is ≤ ε with probability ≥ power under the assumption.

    Assumption: 0/1 losses with P(worse) = p_worse, P(better) = p_better (d ∈ {-1, 0, 1}); or, with p_worse and
    p_better None, d in [a, b] with the given mean and variance (Hoeffding and Maurer–Pontil only). reps and seed
    drive the betting simulation.
    """
    row = plan_row(
        method,
        p_worse,
        p_better,
        epsilon,
        delta,
        power,
        variance=variance,
        mean=mean,
        a=a,
        b=b,
        n_max=n_max,
        reps=reps,
        seed=seed,
    )
    return row.n


def plan_row(
    method: str,
    p_worse: float | None,
    p_better: float | None,
    epsilon: float,
    delta: float,
    power: float = 0.8,
    *,
    variance: float | None = None,
    mean: float = 0.0,
    a: float = -1.0,
    b: float = 1.0,
    n_max: int = 10_000_000,
    reps: int = 2000,
    seed: int = 0,
) -> PlanRow:
    """`required_n` with the power reached and how it was computed."""
    assumption, eps, dlt, target = _validated(method, p_worse, p_better, epsilon, delta, power, variance, mean, a, b)
    n_cap = bounds.check_count("n_max", n_max, 2)
    runs = bounds.check_count("reps", reps, 1)
    power_of, n_min, basis = _power_function(method, assumption, eps, dlt, target, runs, int(seed))
    n, achieved = _search(power_of, target, n_min, n_cap, _normal_guess(assumption, eps, dlt, target))
    return PlanRow(method, VERSIONS[method], n, achieved, target, eps, dlt, assumption.words(), basis)


def power_at(
    method: str,
    n: int,
    p_worse: float | None,
    p_better: float | None,
    epsilon: float,
    delta: float,
    *,
    power: float = 0.8,
    variance: float | None = None,
    mean: float = 0.0,
    a: float = -1.0,
    b: float = 1.0,
    reps: int = 2000,
    seed: int = 0,
) -> float:
    """Probability that `method`'s upper bound on n units is ≤ ε under the assumption (as `required_n` computes
    it: exact, simulated, or a conservative lower bound; `power` only sets β of the variance-based bound)."""
    assumption, eps, dlt, target = _validated(method, p_worse, p_better, epsilon, delta, power, variance, mean, a, b)
    units = bounds.check_count("n", n, 1)
    power_of, n_min, _ = _power_function(
        method, assumption, eps, dlt, target, bounds.check_count("reps", reps, 1), seed
    )
    if units < n_min:
        raise StatisticsError(f"{method} needs at least {n_min} units; got n={units}")
    return power_of(units)[0]


def plan_table(
    p_worse: float | None,
    p_better: float | None,
    epsilon: float,
    delta: float,
    power: float = 0.8,
    *,
    methods: Sequence[str] | None = None,
    variance: float | None = None,
    mean: float = 0.0,
    a: float = -1.0,
    b: float = 1.0,
    n_max: int = 10_000_000,
    reps: int = 2000,
    seed: int = 0,
) -> list[PlanRow]:
    """Every method's required n (those that apply: a variance assumption plans Hoeffding and Maurer–Pontil)."""
    if methods is None:
        methods = METHODS if variance is None else ("hoeffding", "maurer-pontil")
    return [
        plan_row(
            method,
            p_worse,
            p_better,
            epsilon,
            delta,
            power,
            variance=variance,
            mean=mean,
            a=a,
            b=b,
            n_max=n_max,
            reps=reps,
            seed=seed,
        )
        for method in methods
    ]


def render_plan(rows: Sequence[PlanRow]) -> str:
    """The plan as a text table: the assumption lines, then one line per method with its n, power and basis."""
    if not rows:
        return "no methods planned\n"
    lines = []
    for words, eps, dlt, target in dict.fromkeys((r.assumption, r.epsilon, r.delta, r.power_target) for r in rows):
        lines.append(f"assumption: {words}; epsilon={eps:g}, delta={dlt:g}, power>={target:g}")
    header = ("method", "version", "units", "power", "basis")
    body = [(r.method, r.version, f"{r.n:,}", f"{r.power:.4f}", r.basis) for r in rows]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(4)]
    for row in [header, *body]:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2]), row[3].rjust(widths[3])]
        lines.append("  ".join([*cells, row[4]]))
    return "\n".join(lines) + "\n"
