"""Confidence bounds on the mean paired loss difference: the numbers the task-loss requirement is decided on.

Decision: a use contract compares reference and candidate on n paired prompts; d_i = loss_cand_i − loss_ref_i lies
in a declared [a, b]. The decision takes the upper bound on E[d] (Admitted when ≤ ε) and the lower bound (Violated
when > ε), so each must be a valid one-sided (1 − δ) bound on its own, and every float it returns is rounded outward
so that rounding can only make it more conservative. Five methods, each with a version string that changes whenever
its arithmetic does, so a recorded decision can be replayed bit for bit:

* ``hoeffding``: range only; the diagnostic that shows what ignoring the variance costs.
* ``maurer-pontil``: the empirical Bernstein bound of Maurer and Pontil (2009), the product's seed decider.
* ``betting``: the betting confidence bound of Waudby-Smith and Ramdas (2023), valid for any bounded d.
* ``paired-binary-exact``: an exact unconditional test for 0/1 losses (d ∈ {-1, 0, 1}) ordered by W − B,
  inverted (see `invar.stats.trinomial`); kept, with its version, for contracts that name it.
* ``paired-binary-score``: an exact unconditional test for 0/1 losses ordered by Tango's score limit, inverted
  (see `invar.stats.score`); within a few percent of the normal limit, and the default for binary task losses.

Betting is the one method whose result depends on the order of the units; `bound` and `betting` take the order's
origin (``order="plan"`` when the plan fixed it before the data existed) and a Bound computed on any other order
carries a warning saying so.

Bounds never leave [a, b]: E[d] lies there, so clipping keeps validity and a method without enough data to say
more answers [a, b]. NaN or infinity in the input, or an input outside [a, b], is a `StatisticsError`, never a
decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from invar.errors import InvarError
from invar.stats import score, trinomial
from invar.stats.rows import BoundOutput, HoeffdingOutput

FloatArray = npt.NDArray[np.float64]


class StatisticsError(InvarError):
    """Input a bound or plan cannot use (NaN, out of range, too few units, bad δ); the message says what to fix."""


METHODS: tuple[str, ...] = ("hoeffding", "maurer-pontil", "betting", "paired-binary-exact", "paired-binary-score")
DEFAULT_BINARY_METHOD = "paired-binary-score"
BINARY_METHODS: tuple[str, ...] = ("paired-binary-exact", "paired-binary-score")
"""Methods for 0/1 losses only: [a, b] = [-1, 1] and d ∈ {-1, 0, 1}."""
VERSIONS: dict[str, str] = {
    "hoeffding": "hoeffding/1",
    "maurer-pontil": "maurer-pontil/1",
    "betting": "betting/1",
    "paired-binary-exact": "paired-binary-exact/1",
    "paired-binary-score": "paired-binary-score/1",
}
ORDERS: tuple[str, ...] = ("plan", "unverified")
"""Where the order of d came from: "plan" (fixed by the plan before the data existed) or "unverified"."""
UNPLANNED_ORDER_WARNING = (
    "betting used the units in an order the plan did not fix; its bounds hold only if that order was fixed before "
    "the data existed (an order that depends on the values can give lower > upper, with the mean outside both)"
)

BET_CAP = 0.5
"""Betting: a bet never risks more than half the capital (WSR's truncation c = 1/2)."""
BET_RESOLUTION_STEPS = 42
"""Betting: bisection steps on the rescaled mean in [0, 1], i.e. a resolution of 2^-42."""

_UNIT = 2.0**-53  # float64 unit roundoff


@dataclass(frozen=True)
class Bound:
    """One-sided (1 − δ) confidence bounds on E[d], each valid on its own, for one method and version."""

    method: str
    """One of METHODS."""
    version: str
    """Method and arithmetic revision, e.g. "hoeffding/1"; replaying a decision requires the same version."""
    n: int
    """Number of paired units."""
    delta: float
    """Error probability of each one-sided bound."""
    estimate: float
    """Sample mean of d."""
    lower: float
    """Lower confidence bound on E[d], rounded toward -inf, ≥ a."""
    upper: float
    """Upper confidence bound on E[d], rounded toward +inf, ≤ b."""
    warnings: tuple[str, ...] = ()
    """What the caller must know to rely on the bound (betting on an order the plan did not fix)."""

    def output(self) -> BoundOutput:
        """What a decision prints of it (its warnings are the caller's to say)."""
        return BoundOutput(method=self.method, version=self.version, n=self.n, delta=self.delta,
                           estimate=self.estimate, lower=self.lower, upper=self.upper)

    def hoeffding_output(self) -> HoeffdingOutput:
        """What the diagnostics print of a Hoeffding bound."""
        return HoeffdingOutput(version=self.version, delta=self.delta, lower=self.lower, upper=self.upper)


# --- validation -------------------------------------------------------------------------------------------------


def check_real(name: str, value: object) -> float:
    """A finite real number (not a bool) as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise StatisticsError(f"{name} must be a real number; got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise StatisticsError(f"{name} must be finite; got {result!r}")
    return result


def check_delta(delta: object) -> float:
    """δ as a float in (0, 1), or a StatisticsError naming what to declare instead."""
    value = check_real("delta", delta)
    if not 0.0 < value < 1.0:
        raise StatisticsError(f"delta must lie strictly between 0 and 1 (e.g. 0.05); got {value!r}")
    return value


def check_range(a: object, b: object) -> tuple[float, float]:
    """The declared range [a, b] of d as finite floats with a < b."""
    lo, hi = check_real("a", a), check_real("b", b)
    if not lo < hi:
        raise StatisticsError(f"the declared range of d must have a < b; got a={lo!r}, b={hi!r}")
    return lo, hi


def check_count(name: str, value: object, minimum: int = 0) -> int:
    """A count as an int ≥ minimum."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise StatisticsError(f"{name} must be an integer count; got {value!r}")
    result = int(value)
    if result < minimum:
        raise StatisticsError(f"{name} must be at least {minimum}; got {result}")
    return result


def check_counts(worse: object, better: object, n: object) -> tuple[int, int, int]:
    """Trinomial counts: worse + better ≤ n, n ≥ 1."""
    w, bt, total = check_count("worse", worse), check_count("better", better), check_count("n", n, 1)
    if w + bt > total:
        raise StatisticsError(f"worse + better = {w + bt} exceeds n = {total}; count every unit once")
    return w, bt, total


def check_data(d: object, a: float, b: float) -> FloatArray:
    """d as a finite 1-D float64 array with every value in [a, b]."""
    try:
        values = np.asarray(d, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatisticsError(f"d must be a 1-D array of numbers: {exc}") from None
    if values.ndim != 1:
        raise StatisticsError(f"d must be 1-D (one difference per unit); got shape {values.shape}")
    if values.size == 0:
        raise StatisticsError("d is empty: a bound needs at least one paired unit")
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise StatisticsError(
            f"d has {int(bad.sum())} NaN or infinite value(s) (first at index {first}); "
            "every unit needs a finite loss difference"
        )
    outside = (values < a) | (values > b)
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        raise StatisticsError(
            f"d has {int(outside.sum())} value(s) outside the declared range [{a!r}, {b!r}] "
            f"(first: d[{first}] = {float(values[first])!r}); fix the scorer or declare the range that holds"
        )
    return values


def _finished(
    method: str, n: int, delta: float, estimate: float, lower: float, upper: float, warnings: tuple[str, ...] = ()
) -> Bound:
    for name, value in (("estimate", estimate), ("lower", lower), ("upper", upper)):
        if not math.isfinite(value):
            raise StatisticsError(f"{method} produced a non-finite {name} ({value!r}); no decision can use it")
    return Bound(method, VERSIONS[method], n, delta, estimate, lower, upper, warnings)


def check_order(order: object) -> str:
    """The order's origin, one of ORDERS."""
    if order not in ORDERS:
        raise StatisticsError(f"order must be one of {', '.join(ORDERS)}; got {order!r}")
    return str(order)


# --- outward rounding ---------------------------------------------------------------------------------------------


def round_up(value: FloatArray | float, error: FloatArray | float) -> FloatArray:
    """value + error, then one ulp further up: covers `error` plus the rounding of the addition itself."""
    return np.nextafter(np.asarray(value, dtype=np.float64) + error, np.inf)


def round_down(value: FloatArray | float, error: FloatArray | float) -> FloatArray:
    """value − error, then one ulp further down."""
    return np.nextafter(np.asarray(value, dtype=np.float64) - error, -np.inf)


# --- Hoeffding ---------------------------------------------------------------------------------------------------


def hoeffding_limits(
    mean: FloatArray | float, n: int, a: float, b: float, delta: float
) -> tuple[FloatArray, FloatArray]:
    """Hoeffding's one-sided limits mean ∓ (b − a)·sqrt(ln(1/δ)/(2n)), outward, clipped to [a, b].

    mean: (...) sample means of d (as computed by `mean_of`), any shape; returns (lower, upper) of that shape.
    Error allowance: 16 unit roundoffs of |mean| + width (the computation has at most ~8), then one ulp.
    """
    width = (b - a) * math.sqrt(-math.log(delta) / (2.0 * n))
    m = np.asarray(mean, dtype=np.float64)
    error = 16.0 * _UNIT * (np.abs(m) + width)
    upper = np.minimum(b, round_up(m + width, error))
    lower = np.maximum(a, round_down(m - width, error))
    return lower, upper


def exact_sum(values: FloatArray) -> float:
    """The correctly rounded sum of a 1-d float64 array (math.fsum), read through a memoryview rather than a list of
    n Python floats (`tolist`), which would be built and dropped at every call."""
    return math.fsum(np.ascontiguousarray(values, dtype=np.float64).data)


def mean_of(d: FloatArray) -> float:
    """The sample mean: a correctly rounded sum (math.fsum) divided by n, so within 2 ulps of the exact mean."""
    return exact_sum(d) / d.size


def hoeffding(d: npt.ArrayLike, a: float, b: float, delta: float) -> Bound:
    """Hoeffding bound: E[d] ∈ [mean − w, mean + w] one-sidedly, w = (b − a)·sqrt(ln(1/δ)/(2n)).

    d: (n,) paired differences in [a, b], n ≥ 1.
    """
    a, b = check_range(a, b)
    delta = check_delta(delta)
    values = check_data(d, a, b)
    mean = mean_of(values)
    lower, upper = hoeffding_limits(mean, values.size, a, b, delta)
    return _finished("hoeffding", values.size, delta, mean, float(lower), float(upper))


# --- Maurer–Pontil empirical Bernstein ---------------------------------------------------------------------------


def maurer_pontil_limits(
    mean: FloatArray | float, variance: FloatArray | float, n: int, a: float, b: float, delta: float
) -> tuple[FloatArray, FloatArray]:
    """Maurer–Pontil one-sided limits mean ∓ (sqrt(2·V·ln(2/δ)/n) + 7(b − a)·ln(2/δ)/(3(n − 1))).

    mean, variance: (...) sample means and unbiased sample variances V, broadcastable; n ≥ 2.
    Returns (lower, upper), outward by 16 unit roundoffs of |mean| + the half-width, clipped to [a, b].
    """
    log_term = math.log(2.0 / delta)
    m = np.asarray(mean, dtype=np.float64)
    v = np.maximum(np.asarray(variance, dtype=np.float64), 0.0)
    half = np.sqrt(2.0 * v * log_term / n) + 7.0 * (b - a) * log_term / (3.0 * (n - 1))
    error = 16.0 * _UNIT * (np.abs(m) + half)
    upper = np.minimum(b, round_up(m + half, error))
    lower = np.maximum(a, round_down(m - half, error))
    return lower, upper


def maurer_pontil(d: npt.ArrayLike, a: float, b: float, delta: float) -> Bound:
    """Maurer–Pontil empirical Bernstein bound (Theorem 4 of Maurer & Pontil 2009, rescaled to [a, b]).

    d: (n,) paired differences in [a, b], n ≥ 2. V = Σ(d_i − mean)²/(n − 1) is summed with math.fsum around the
    computed mean; any centre other than the exact mean only enlarges the sum, so V never errs low by more than a
    few roundoffs, which the outward allowance covers.
    """
    a, b = check_range(a, b)
    delta = check_delta(delta)
    values = check_data(d, a, b)
    n = values.size
    if n < 2:
        raise StatisticsError("maurer-pontil needs at least 2 units (its variance term divides by n - 1); got 1")
    mean = mean_of(values)
    variance = exact_sum((values - mean) ** 2) / (n - 1)
    lower, upper = maurer_pontil_limits(mean, variance, n, a, b, delta)
    return _finished("maurer-pontil", n, delta, mean, float(lower), float(upper))


# --- betting (Waudby-Smith & Ramdas 2023) ------------------------------------------------------------------------


def plugin_bets(x: FloatArray, delta: float) -> FloatArray:
    """Predictable plug-in bets λ_t = sqrt(2·ln(1/δ)/(n·σ̂²_{t−1})) for rows of rescaled data.

    x: (R, n) values in [0, 1], each row in the order fixed before the data. σ̂²_t = (1/4 + Σ_{i≤t}(x_i − μ̂_i)²)/(t+1)
    with μ̂_t = (1/2 + Σ_{i≤t} x_i)/(t+1), σ̂²_0 = 1/4 (WSR eq. 26, tuned to the fixed n). Returns (R, n); λ_t
    depends only on x_1..x_{t−1}, which is all the validity argument needs (rounding included).
    """
    rows, n = x.shape
    steps = np.arange(1, n + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x, axis=1)) / (steps + 1.0)
    var = (0.25 + np.cumsum((x - mu) ** 2, axis=1)) / (steps + 1.0)
    previous = np.concatenate([np.full((rows, 1), 0.25), var[:, :-1]], axis=1)
    bets: FloatArray = np.sqrt(2.0 * -math.log(delta) / (n * previous))
    return bets


def betting_crosses(x: FloatArray, bets: FloatArray, m: FloatArray, side: str, delta: float) -> npt.NDArray[np.bool_]:
    """Whether the one-sided capital process for mean m reaches 1/δ at some t ≤ n (Ville's inequality).

    x, bets: (R, n); m: (R,) candidate means in (0, 1). side "upper": capital Π(1 − λ_i(m)(x_i − m)) with
    λ_i(m) = min(λ_i, c/(1 − m)), large when the mean is below m; side "lower": Π(1 + λ_i(m)(x_i − m)) with
    λ_i(m) = min(λ_i, c/m). Each is a nonnegative supermartingale at the true mean and monotone in m.
    Summed in log space; a crossing counts only if it clears ln(1/δ) by the rounding allowance
    (n + 16)·2u·Σ|log terms|, so a reported crossing is a crossing of the exact process.
    """
    mm = m[:, None]
    if side == "upper":
        lam = np.minimum(bets, BET_CAP / (1.0 - mm))
        terms = np.log1p(-lam * (x - mm))
    else:
        lam = np.minimum(bets, BET_CAP / mm)
        terms = np.log1p(lam * (x - mm))
    peak = np.max(np.cumsum(terms, axis=1), axis=1)
    threshold = -math.log(delta)
    n = x.shape[1]
    allowance = (n + 16) * 2.0 * _UNIT * np.sum(np.abs(terms), axis=1) + 4.0 * _UNIT * threshold
    crossed: npt.NDArray[np.bool_] = peak >= threshold + allowance
    return crossed


def betting_limits_rescaled(x: FloatArray, delta: float) -> tuple[FloatArray, FloatArray]:
    """Betting bounds on the mean of each row of x ∈ [0, 1]^(R×n): (lower (R,), upper (R,)) on [0, 1].

    Bisection on the dyadic grid of [0, 1]: the upper bound is the smallest grid point shown to cross (the
    crossing set is an interval [U, 1] because the capital is monotone in m), the lower bound the largest.
    """
    bets = plugin_bets(x, delta)
    rows = x.shape[0]
    lo, hi = np.zeros(rows), np.ones(rows)  # upper side: hi crosses (or is the trivial 1), lo does not
    for _ in range(BET_RESOLUTION_STEPS):
        mid = 0.5 * (lo + hi)
        crossed = betting_crosses(x, bets, mid, "upper", delta)
        hi = np.where(crossed, mid, hi)
        lo = np.where(crossed, lo, mid)
    upper = hi
    lo, hi = np.zeros(rows), np.ones(rows)  # lower side: lo crosses (or is the trivial 0), hi does not
    for _ in range(BET_RESOLUTION_STEPS):
        mid = 0.5 * (lo + hi)
        crossed = betting_crosses(x, bets, mid, "lower", delta)
        lo = np.where(crossed, mid, lo)
        hi = np.where(crossed, hi, mid)
    return lo, upper


def rescale(d: FloatArray, a: float, b: float) -> FloatArray:
    """x = (d − a)/(b − a) in [0, 1]; within 2 roundoffs of the exact ratio, a shift `betting` widens for."""
    x: FloatArray = np.clip((d - a) / (b - a), 0.0, 1.0)
    return x


def unscale_limits(lower_x: FloatArray, upper_x: FloatArray, a: float, b: float) -> tuple[FloatArray, FloatArray]:
    """Map bounds on the mean of x back to d, outward: 4 roundoffs for the rescaling of the data, 4·(|a| + b − a)
    for the affine map, one ulp for the final addition; clipped to [a, b]."""
    scale = b - a
    error = 4.0 * _UNIT * (abs(a) + scale)
    upper = np.minimum(b, round_up(a + scale * (upper_x + 4.0 * _UNIT), error))
    lower = np.maximum(a, round_down(a + scale * (lower_x - 4.0 * _UNIT), error))
    return lower, upper


def betting(d: npt.ArrayLike, a: float, b: float, delta: float, *, order: str = "unverified") -> Bound:
    """Betting confidence bound (Waudby-Smith & Ramdas 2023), each side a one-sided (1 − δ) bound.

    d: (n,) paired differences in [a, b], in the order fixed before the data (the plan's unit order). Each side
    uses its own capital process with threshold 1/δ (the hedged process with all weight on that side), so the two
    sides together form a two-sided (1 − 2δ) interval. order: "plan" when the plan fixed the order before the data
    existed; otherwise the Bound carries UNPLANNED_ORDER_WARNING.
    """
    a, b = check_range(a, b)
    delta = check_delta(delta)
    origin = check_order(order)
    values = check_data(d, a, b)
    lower_x, upper_x = betting_limits_rescaled(rescale(values, a, b)[None, :], delta)
    lower, upper = unscale_limits(lower_x, upper_x, a, b)
    warnings = () if origin == "plan" else (UNPLANNED_ORDER_WARNING,)
    return _finished("betting", values.size, delta, mean_of(values), float(lower[0]), float(upper[0]), warnings)


# --- paired binary exact -------------------------------------------------------------------------------------------


def paired_binary_exact(worse: int, better: int, n: int, delta: float) -> Bound:
    """Exact one-sided bounds on p_worse − p_better from trinomial counts (n units: worse, better, the rest tied).

    The upper limit inverts the Berger–Boos exact unconditional test of `invar.stats.trinomial`; the lower limit is
    minus the upper limit with the roles of worse and better swapped. P(Δ > upper) ≤ δ for every n ≥ 1 and every true
    (p_worse, p_better) (the cap at 1 is proven for no Δ0). Limits lie on the dyadic grid 2^-41 of [-1, 1], so they
    are exact floats.
    """
    w, bt, total = check_counts(worse, better, n)
    delta = check_delta(delta)
    upper = trinomial.upper_limit(w, bt, total, delta)
    lower = -trinomial.upper_limit(bt, w, total, delta)
    return _finished("paired-binary-exact", total, delta, (w - bt) / total, lower, upper)


def paired_binary_score(worse: int, better: int, n: int, delta: float) -> Bound:
    """Exact one-sided bounds on p_worse − p_better from trinomial counts, by the score-ordered test.

    The upper limit inverts the exact unconditional test of `invar.stats.score` (outcomes ordered by Tango's
    asymptotic limit, Berger–Boos restriction with γ = δ/100, supremum proven by branch-and-bound); the lower limit
    is minus the upper limit with worse and better swapped. P(Δ > upper) ≤ δ for every n ≥ 1 and every true
    (p_worse, p_better) (the cap at 1 is proven for no Δ0). Limits lie on the grid 2^-(17 + ⌊bit_length(n − 1)/2⌋)
    of [-1, 1].
    """
    w, bt, total = check_counts(worse, better, n)
    delta = check_delta(delta)
    upper = score.upper_limit(w, bt, total, delta)
    lower = -score.upper_limit(bt, w, total, delta)
    return _finished("paired-binary-score", total, delta, (w - bt) / total, lower, upper)


def trinomial_counts(d: FloatArray, method: str = "paired-binary-exact") -> tuple[int, int]:
    """(worse, better) of d ∈ {-1, 0, 1}^n, or a StatisticsError when another value occurs."""
    other = (d != -1.0) & (d != 0.0) & (d != 1.0)
    if other.any():
        first = int(np.flatnonzero(other)[0])
        raise StatisticsError(
            f"{method} needs 0/1 losses, so d in {{-1, 0, 1}}; d[{first}] = {float(d[first])!r}. "
            "Use maurer-pontil or betting for graded losses"
        )
    return int(np.sum(d == 1.0)), int(np.sum(d == -1.0))


def bound(method: str, d: npt.ArrayLike, a: float, b: float, delta: float, *, order: str = "unverified") -> Bound:
    """The bound `method` (one of METHODS) on E[d] for d in [a, b].

    The binary methods (BINARY_METHODS) require [a, b] = [-1, 1] and d ∈ {-1, 0, 1} (0/1 losses). order: where
    the order of d came from ("plan" or "unverified"); only betting depends on it, and warns unless it is "plan".
    """
    origin = check_order(order)
    if method == "hoeffding":
        return hoeffding(d, a, b, delta)
    if method == "maurer-pontil":
        return maurer_pontil(d, a, b, delta)
    if method == "betting":
        return betting(d, a, b, delta, order=origin)
    if method in BINARY_METHODS:
        a, b = check_range(a, b)
        if (a, b) != (-1.0, 1.0):
            raise StatisticsError(
                f"{method} models 0/1 losses, so d lies in [-1, 1]; got a={a!r}, b={b!r}. "
                "Declare a=-1, b=1 or use maurer-pontil or betting"
            )
        values = check_data(d, a, b)
        worse, better = trinomial_counts(values, method)
        if method == "paired-binary-exact":
            return paired_binary_exact(worse, better, values.size, delta)
        return paired_binary_score(worse, better, values.size, delta)
    raise StatisticsError(f"unknown bound method {method!r}; choose one of {', '.join(METHODS)}")
