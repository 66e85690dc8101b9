"""Sample-size planning: how many paired units each bound method needs under a stated assumption.

Decision: the required n of a method is the smallest n at which its upper bound is ≤ ε with probability ≥ the
target power, when the data follow the stated assumption. Power is computed the way that is exact where it is
feasible and conservative where it is not, and each row says which:

* trinomial assumption (0/1 losses: p_worse, p_better), Hoeffding and Maurer–Pontil: exact, by summing the
  probabilities of every (worse, better) count whose bound is ≤ ε (the bound depends on the data only through the
  counts). Hoeffding depends only on W − B, so its successes are W − B ≤ t* and its power one trinomial tail.
  Mass beyond TAIL_CUT in the tails of the count distributions is counted as failure, so the power is a lower
  bound exact to about 1e-12.
* trinomial, paired-binary-exact: exact in the same way; a count "succeeds" when the test proves H0: Δ ≥ ε − 2^-30,
  which implies the reported upper limit is ≤ ε (see `invar.stats.trinomial`).
* trinomial, paired-binary-score: exact in the same way; a count succeeds when the proof at the largest grid point
  ≤ ε succeeds, which is exactly when the reported upper limit is ≤ ε (the proof is monotone; see
  `invar.stats.score`). A failure at a discordant count k also settles every outcome at larger k with an extreme
  set at least as large (the proof's domain only grows with k), so most counts need one proof.
* trinomial, betting: the bound depends on the order of the units, so power is simulated: n is searched on runs
  with common random numbers (smooth in n; to 0.5 % of n, below the simulation's own resolution), checked on
  independent runs (n grows by 1 % until the independent estimate reaches the target), and the power reported is a
  third, fresh independent estimate with its standard error, so no selection inflates it.
* variance assumption (general [a, b], Hoeffding and Maurer–Pontil only): a lower bound on power from the
  Berry–Esseen inequality for the mean (C = 0.4748, E|X − μ|³ ≤ (b − a)σ²) and, for Maurer–Pontil, a Bernstein
  upper bound on the sample variance that fails with probability β = (1 − power)/20, charged to the power.

The search is a secant on probit(power) against sqrt(n) (nearly linear), kept inside a bracket, so a plan needs a
handful of power evaluations; power is taken as non-decreasing in n, which holds up to the small ripples of
discrete distributions (the reported n reaches the target, n − 1 does not).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import NormalDist

import numpy as np
from scipy import stats

from invar.stats import bounds, score, trinomial
from invar.stats.bounds import METHODS, VERSIONS, StatisticsError

DECISION_MARGIN = 2.0**-30
"""Betting and paired-binary-exact plans test at ε − 2^-30, so a success implies the reported bound is ≤ ε despite
the bisection resolution of the bound (2^-41 to 2^-36)."""
TAIL_CUT = 1e-13
"""Count-distribution mass left out of the exact power sums (counted as failure)."""
SCORE_TAIL_CUT = 1e-10
"""The same for paired-binary-score, whose counts each need a proof: the power is exact to 1e-10."""
CHECK_RUNS_FACTOR = 2
"""Betting: the independent check and the reported estimate each use this many times the search's runs."""
BERRY_ESSEEN_C = 0.4748
"""Shevtsova (2011), iid summands."""
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


def _count_range(n: int, p: float, cut: float = TAIL_CUT) -> tuple[int, int]:
    """Counts of Bin(n, p) outside which at most `cut` of the mass lies."""
    if p <= 0.0:
        return 0, 0
    if p >= 1.0:
        return n, n
    lo = int(stats.binom.ppf(cut / 2, n, p))
    hi = int(stats.binom.ppf(1.0 - cut / 2, n, p))
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
    """Hoeffding's upper bound is ≤ ε exactly when W − B ≤ t* (its mean is (W − B)/n, correctly rounded as the
    bound computes it), so the power is one trinomial tail."""

    def admits(t: int) -> bool:
        _, upper = bounds.hoeffding_limits(t / n, n, -1.0, 1.0, delta)
        return bool(upper <= epsilon)

    lo, hi = -n - 1, n + 1  # admits(lo) by convention, not admits(hi)
    if not admits(-n):
        return 0.0
    lo = -n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if admits(mid):
            lo = mid
        else:
            hi = mid
    pi, q = _discordance(assumption)
    k_lo, k_hi = _count_range(n, pi)
    k = np.arange(k_lo, k_hi + 1)
    within = stats.binom.cdf(np.floor((lo + k) / 2.0), k, q)
    return min(1.0, float(np.sum(stats.binom.pmf(k, n, pi) * within)))


def _maurer_pontil_power(n: int, assumption: _Assumption, epsilon: float, delta: float) -> float:
    """Every (k, w) count in range at once: the bound from the counts' mean and variance, as the bound computes it."""
    pi, q = _discordance(assumption)
    k_lo, k_hi = _count_range(n, pi)
    ks, ws = [], []
    for k in range(k_lo, k_hi + 1):
        w_lo, w_hi = _count_range(k, q)
        ws.append(np.arange(w_lo, w_hi + 1))
        ks.append(np.full(w_hi - w_lo + 1, k))
    k_all, w_all = np.concatenate(ks), np.concatenate(ws)
    t = (2 * w_all - k_all).astype(np.float64)
    variance = (k_all - t * t / n) / (n - 1)
    _, upper = bounds.maurer_pontil_limits(t / n, variance, n, -1.0, 1.0, delta)
    ok = upper <= epsilon
    weight = stats.binom.pmf(k_all[ok], n, pi) * stats.binom.pmf(w_all[ok], k_all[ok], q)
    return min(1.0, float(np.sum(weight)))


def _exact_power(n: int, assumption: _Assumption, epsilon: float, delta: float) -> float:
    """Exact power of paired-binary-exact. Counts come in increasing k, so U_π grows: a refutation at W − B = t
    (a point of H0 with a tail above α) refutes every t' ≥ t at every later k without another proof."""
    gamma = trinomial.GAMMA_FRACTION * delta
    alpha = delta - gamma
    delta0 = epsilon - DECISION_MARGIN
    last = [-1]  # the largest succeeding w at the previous k: a warm start, the threshold moves slowly with k
    refuted = [math.inf]  # the smallest W − B refuted so far

    def succeeds(k: int, w: np.ndarray) -> np.ndarray:
        pi_upper = trinomial.clopper_pearson_upper(k, n, gamma)

        def ok(worse: int) -> bool:
            t = 2 * worse - k
            if t >= refuted[0]:
                return False
            status = trinomial.proof_status(delta0, t, n, pi_upper, alpha)
            if status == "refuted":
                refuted[0] = t
            return status == "proven"

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


@dataclass
class _ScorePlanner:
    """Exact power of paired-binary-score at any n, remembering each n's thresholds as the next n's first guesses.

    Per discordant count k the admitted outcomes are w ≤ w*_k (the extreme set grows with w). All counts are
    settled together in rounds: each round proves one candidate w per unsettled k in one batch (`prove_many`),
    then narrows every k by what is known: a failure with statistic t at count k refuses every outcome with
    statistic ≥ t at counts ≥ k (larger U_π, the proof is monotone in both), a success admits every outcome with
    statistic ≤ t at counts ≤ k. The candidates gallop from the guess until bracketed, then bisect.
    """

    assumption: _Assumption
    epsilon: float
    delta: float
    previous: dict[int, int] = field(default_factory=dict)

    def power(self, n: int) -> float:
        pi, q = _discordance(self.assumption)
        if self.epsilon >= 1.0:
            return 1.0
        ordering = score.Ordering(n, score.order_z(self.delta))
        bits = score.grid_bits(n)
        delta0 = score.grid_point(score.grid_floor(self.epsilon, bits), bits)
        bounder = score.Bounder(n, delta0)
        gamma = score.GAMMA_FRACTION * self.delta
        alpha = self.delta - gamma
        k_lo, k_hi = (0, 0) if pi <= 0.0 else _count_range(n, pi, SCORE_TAIL_CUT)
        ks = list(range(k_lo, k_hi + 1))
        uppers = np.array([trinomial.clopper_pearson_upper(k, n, gamma) for k in ks])
        reach = int(score.k_ranges(n, uppers[-1:], uppers[-1:])[1][0])
        stats_cache: dict[tuple[int, int], float] = {}

        def statistic(w: int, k: int) -> float:
            key = (w, k)
            if key not in stats_cache:
                stats_cache[key] = ordering.statistic(w, k - w)
            return stats_cache[key]

        # every statistic a candidate can have lies well above this: the rows the table keeps start low enough
        ordering.prepare(delta0 - 4.0 * (1.0 + ordering.z) * math.sqrt(max(float(uppers[-1]), 1.0 / n) / n), reach)
        if self.previous:
            guess = {k: self.previous.get(k, self.previous[min(self.previous, key=lambda j: abs(j - k))]) for k in ks}
        else:
            asymptotic = ordering.thresholds(delta0, max(ks))  # where the score test at level δ would stop
            guess = {k: int(asymptotic[k]) for k in ks}
        lo = {k: -1 for k in ks}  # every w ≤ lo[k] admitted (−1: none known)
        hi = {k: k + 1 for k in ks}  # every w ≥ hi[k] refused (k + 1: none known)
        step = {k: 1 for k in ks}
        last: dict[int, bool] = {}
        oks: dict[int, float] = {}  # per k, the largest statistic proven admitted
        fails: dict[int, float] = {}  # per k, the smallest statistic proven refused
        while True:
            pending = [k for k in ks if hi[k] - lo[k] > 1]
            if not pending:
                break
            chosen = []
            for k in pending:
                if k not in last:
                    w = guess[k]
                elif lo[k] >= 0 and hi[k] <= k and (k in oks and k in fails):
                    w = (lo[k] + hi[k]) // 2
                elif last[k]:
                    w = lo[k] + step[k]
                    step[k] *= 2
                else:
                    w = hi[k] - step[k]
                    step[k] *= 2
                chosen.append(min(hi[k] - 1, max(lo[k] + 1, w)))
            regions = np.array([statistic(w, k) for w, k in zip(chosen, pending, strict=True)])
            matrix = np.stack([ordering.thresholds(float(t), reach) for t in regions])
            at = np.array([uppers[k - k_lo] for k in pending])
            proven = score.prove_many(bounder, matrix, at, alpha)
            for k, w, t, ok in zip(pending, chosen, regions.tolist(), proven.tolist(), strict=True):
                last[k] = ok
                if ok:
                    lo[k] = max(lo[k], w)
                    oks[k] = max(oks.get(k, -math.inf), t)
                else:
                    hi[k] = min(hi[k], w)
                    fails[k] = min(fails.get(k, math.inf), t)
            # what one count's proofs say about the others (monotone in the extreme set and in U_π)
            refused, admitted = math.inf, -math.inf
            for k in ks:
                refused = min(refused, fails.get(k, math.inf))
                if refused < math.inf and hi[k] - lo[k] > 1:
                    hi[k] = _first(partial(statistic, k=k), lo[k] + 1, hi[k], partial(operator.le, refused))
            for k in reversed(ks):
                admitted = max(admitted, oks.get(k, -math.inf))
                if admitted > -math.inf and hi[k] - lo[k] > 1:
                    above = _first(partial(statistic, k=k), lo[k] + 1, hi[k], partial(operator.lt, admitted))
                    lo[k] = max(lo[k], above - 1)
        self.previous = {k: lo[k] for k in ks}
        total = 0.0
        for k in ks:
            if lo[k] >= 0:
                total += float(stats.binom.pmf(k, n, pi)) * float(stats.binom.cdf(lo[k], k, q))
        return min(1.0, total)


def _first(value: Callable[[int], float], lo: int, hi: int, holds: Callable[[float], bool]) -> int:
    """The first w in [lo, hi) where holds(value(w)), for a property that, once it holds, holds for every larger w
    (value non-decreasing, holds a threshold from below); hi when none."""
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(value(mid)):
            hi = mid
        else:
            lo = mid + 1
    return lo


# --- simulated power (betting) ----------------------------------------------------------------------------------


def _betting_hits(n: int, assumption: _Assumption, epsilon: float, delta: float, reps: int, stream: list[int]) -> int:
    """How many of `reps` simulated runs of n units admit by betting (upper bound ≤ ε), random stream `stream`.

    The runs are simulated in float32: a plan needs the frequency, not the last bits of each capital."""
    pw, pb = float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0)
    m_star = (epsilon + 1.0) / 2.0 - DECISION_MARGIN  # ε on the rescaled [0, 1] axis, minus the margin
    log_threshold = -math.log(delta)
    cap = bounds.BET_CAP / (1.0 - m_star)
    hits = 0
    for start in range(0, reps, _CHUNK):
        rows = min(_CHUNK, reps - start)
        # Common random numbers within a stream: run r of every n starts with the same units.
        u = np.random.default_rng([*stream, start]).random((n, rows), dtype=np.float32).T
        x = np.where(u < pw, np.float32(1.0), np.where(u >= 1.0 - pb, np.float32(0.0), np.float32(0.5)))
        steps = np.arange(1, n + 1, dtype=np.float32)
        mu = (np.float32(0.5) + np.cumsum(x, axis=1, dtype=np.float32)) / (steps + 1)
        var = (np.float32(0.25) + np.cumsum((x - mu) ** 2, axis=1, dtype=np.float32)) / (steps + 1)
        previous = np.concatenate([np.full((rows, 1), 0.25, dtype=np.float32), var[:, :-1]], axis=1)
        lam = np.minimum(np.sqrt(np.float32(2.0 * log_threshold / n) / previous), np.float32(cap))
        capital = np.cumsum(np.log1p(-lam * (x - np.float32(m_star))), axis=1, dtype=np.float32)
        hits += int(np.sum(np.max(capital, axis=1) >= log_threshold))
    return hits


@dataclass(frozen=True)
class _BettingPlan:
    n: int
    power: float
    standard_error: float
    runs: int


def _betting_plan(
    assumption: _Assumption, epsilon: float, delta: float, target: float, n_min: int, n_max: int, reps: int, seed: int
) -> _BettingPlan:
    """Search on common random numbers, check on independent runs (n grows by 1 % until the check reaches the
    target), then report a fresh independent estimate of the power at n."""

    def searched(k: int) -> tuple[float, float]:
        value = _betting_hits(k, assumption, epsilon, delta, reps, [seed, 0]) / reps
        return value, value

    start = round(START_FACTORS["betting"] * _normal_guess(assumption, epsilon, delta, target))
    n, _ = _search(searched, target, n_min, n_max, start, tolerance=max(1, start // 200))
    runs = CHECK_RUNS_FACTOR * reps
    while _betting_hits(n, assumption, epsilon, delta, runs, [seed, 1, n]) < target * runs:
        if n >= n_max:
            raise StatisticsError(
                f"the target power is not reached with {n_max} units; relax epsilon or delta, or raise n_max"
            )
        n = min(n_max, n + max(1, n // 100))
    power = _betting_hits(n, assumption, epsilon, delta, runs, [seed, 2, n]) / runs
    return _BettingPlan(n, power, math.sqrt(max(power * (1.0 - power), 1.0 / runs) / runs), runs)


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


def _probit(p: float) -> float:
    return _NORMAL.inv_cdf(min(max(p, 1e-12), 1.0 - 1e-12))


def _search(
    power_at: Callable[[int], tuple[float, float]], target: float, n_min: int, n_max: int, start: int,
    tolerance: int = 1,
) -> tuple[int, float]:
    """Smallest n in [n_min, n_max] whose certified power (second element) reaches target; (n, reported power).
    With `tolerance` > 1 (a simulated power, whose ripples are noise) the search stops once the bracket is that
    narrow and returns its upper end.

    probit(power) is nearly linear in sqrt(n), so each step is a secant (Newton from the z-test's slope at first)
    on that scale, kept inside the bracket (fail, reach); when the same end moves twice in a row the step is the
    bracket's midpoint instead (Illinois), so ripples cannot stall it.
    """
    seen: dict[int, tuple[float, float]] = {}

    def gap(n: int) -> float:
        if n not in seen:
            seen[n] = power_at(n)
        return _probit(seen[n][1]) - _probit(target)

    fail, reach = n_min - 1, n_max + 1  # fail: known below target (or none), reach: known at it (or none)
    n = min(n_max, max(n_min, start))
    last: tuple[int, float] | None = None
    moved: list[str] = []
    while reach - fail > tolerance:
        value = gap(n)
        if value >= 0.0:
            reach = n
            moved.append("reach")
        else:
            fail = n
            moved.append("fail")
        if reach - fail <= tolerance:
            break
        if fail >= n_max:
            raise StatisticsError(
                f"the target power is not reached with {n_max} units; relax epsilon or delta, or raise n_max"
            )
        slope = 2.5 / math.sqrt(n)  # the z-test's: probit(power) = sqrt(n)·gap/sigma − z_δ
        if last is not None and last[0] != n and value != last[1]:
            secant = (value - last[1]) / (math.sqrt(n) - math.sqrt(last[0]))
            if secant > 0.0:
                slope = secant
        last = (n, value)
        guess = round((math.sqrt(n) - value / slope) ** 2)
        if reach > n_max:  # no upper end yet: at least 1 % further, at most 4 times as far
            guess = min(n_max, max(guess, n + max(1, n // 100)), 4 * n)
        elif reach - fail <= 16 or (moved[-2:] in (["fail", "fail"], ["reach", "reach"]) and len(moved) > 2):
            guess = (fail + reach) // 2  # ripples make secants unreliable over a few units
        n = min(reach - 1, max(fail + 1, guess))
    if reach > n_max:
        raise StatisticsError(
            f"the target power is not reached with {n_max} units; relax epsilon or delta, or raise n_max"
        )
    gap(reach)
    return reach, seen[reach][0]


START_FACTORS: dict[str, float] = {
    "hoeffding": 50.0,
    "maurer-pontil": 3.0,
    "betting": 1.45,
    "paired-binary-exact": 1.2,
    "paired-binary-score": 1.03,
}
"""Where each method's search starts, as a multiple of the z-test's n (typical ratios; only speed depends on it)."""


def _normal_guess(assumption: _Assumption, epsilon: float, delta: float, power: float) -> int:
    """n of a one-sided z-test with known variance: the normal limit, and the scale of every method's search."""
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
    if method == "paired-binary-score":
        planner = _ScorePlanner(assumption, epsilon, delta)
        return (
            _twice(planner.power),
            1,
            exact_basis + ", proof at the grid point of epsilon",
        )
    # betting is planned by `_betting_plan`; this is the search's estimate, for `power_at`
    return (
        _twice(lambda k: _betting_hits(k, assumption, epsilon, delta, reps, [seed, 2, k]) / reps),
        1,
        f"Monte Carlo: {reps} independent runs (seed {seed})",
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
    if method == "betting":
        if not assumption.trinomial:
            raise StatisticsError(
                "betting needs a distribution, not only a variance; state p_worse and p_better for 0/1 losses"
            )
        plan = _betting_plan(assumption, eps, dlt, target, 1, n_cap, runs, int(seed))
        basis = (
            f"Monte Carlo: n searched on {runs} runs with common random numbers (seed {int(seed)}) and checked on "
            f"{plan.runs} independent runs; power estimated on {plan.runs} fresh runs, standard error "
            f"{plan.standard_error:.4f}"
        )
        return PlanRow(method, VERSIONS[method], plan.n, plan.power, target, eps, dlt, assumption.words(), basis)
    power_of, n_min, basis = _power_function(method, assumption, eps, dlt, target, runs, int(seed))
    factor = START_FACTORS[method] if assumption.trinomial else 1.0
    start = round(factor * _normal_guess(assumption, eps, dlt, target))
    n, achieved = _search(power_of, target, n_min, n_cap, start)
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
