"""Anytime-valid bounds and the stopping rule of sequential admission.

Decision: a sequential contract runs the plan's units in the plan's fixed order, batch by batch, and after each
batch evaluates an upper and a lower bound on E[d] that hold simultaneously for every number of units seen
(confidence sequences: P(the upper bound is ever below E[d]) ≤ δ, and likewise for the lower bound, however often
and whenever one looks). It stops as soon as upper ≤ ε (Admitted) or lower > ε (Violated), and at n_max otherwise
(Unknown). Because each side is a confidence sequence, stopping on the data keeps each error below δ:
P(Admitted while E[d] > ε) ≤ δ and P(Violated while E[d] ≤ ε) ≤ δ.

Two methods, each a test supermartingale per candidate mean m (Ville: P(sup_t K_t(m) ≥ 1/δ) ≤ δ at the true m):

* ``betting-sequence`` (any d in [a, b]): the betting capital of Waudby-Smith and Ramdas (2023) on
  x = (d − a)/(b − a) with predictable plug-in bets tuned to the horizon n_max,
  λ_t = sqrt(2·ln(1/δ)/(n_max·σ̂²_{t−1})) (WSR eq. 26 with n_max for n), truncated at 1/2 of the capital as in
  `invar.stats.bounds.betting`. With n_max = n it is exactly the fixed-n betting bound's process, which already
  holds at every t ≤ n.
* ``paired-binary-sequence`` (0/1 losses, d ∈ {-1, 0, 1}): a mixture e-process for paired trinomial data:
  weights 1/2, 1/4, 1/4 on the betting processes with bets ρ·λ_t, ρ = 1, 2, 4, where λ_t uses the trinomial
  variance estimate p̂_d − m̂² from the counts of worse and better units so far (0.1 pseudo-discordant units in 0.2
  pseudo-units: p̂_d = (W + B + 0.1)/(t − 1 + 0.2), m̂ = (W − B)/(t − 1 + 0.2)). A mixture of test
  supermartingales is one. The larger bets stop clearly fine or clearly broken candidates sooner; the unit bet keeps
  the boundary case close to the horizon-tuned process.

Each capital process is monotone in m (the truncation only moves with m in that direction), so each side's
crossing set is an interval and the bound is found by bisection on the dyadic grid 2^-42 of [0, 1]; a crossing
counts only if it clears ln(1/δ) by the summation error bound, so a reported bound is sound (see
`invar.stats.bounds.betting_crosses`). Bounds are mapped back to d with the same outward rounding as betting.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import partial
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from invar.stats import bounds
from invar.stats.bounds import StatisticsError
from invar.stats.rows import SequentialDecisionOutput, SequentialLook
from invar.stats.rows import SequentialPlanRow as SequentialPlanRow  # a stopping plan: what `use plan --json` prints

FloatArray = npt.NDArray[np.float64]

SEQUENTIAL_METHODS: tuple[str, ...] = ("betting-sequence", "paired-binary-sequence")
BINARY_SEQUENTIAL_METHODS: tuple[str, ...] = ("paired-binary-sequence",)
"""Sequential methods for 0/1 losses only: d ∈ {-1, 0, 1} in [-1, 1]; betting-sequence takes any declared range."""
SEQUENTIAL_VERSIONS: dict[str, str] = {
    "betting-sequence": "betting-sequence/1",
    "paired-binary-sequence": "paired-binary-sequence/1",
}
MIXTURE_SCALES: tuple[float, ...] = (1.0, 2.0, 4.0)
"""paired-binary-sequence: the bet multiples mixed (the unit one is the horizon-tuned bet)."""
MIXTURE_WEIGHTS: tuple[float, ...] = (0.5, 0.25, 0.25)
"""paired-binary-sequence: their weights (sum 1)."""
TRINOMIAL_PRIOR = 0.1
"""paired-binary-sequence: the variance estimate's pseudo-count: this many discordant units in the share's numerator,
twice as many units in both denominators."""

_UNIT = 2.0**-53
_STEPS = bounds.BET_RESOLUTION_STEPS


@dataclass(frozen=True)
class Look:
    """The anytime-valid bounds after one batch."""

    n: int
    """Units seen (a prefix of the plan's unit order)."""
    lower: float
    """Lower bound on E[d], valid simultaneously for every n."""
    upper: float
    """Upper bound on E[d], valid simultaneously for every n."""


@dataclass(frozen=True)
class SequentialDecision:
    """Where the stopping rule stops and why; JSON-ready via dataclasses.asdict."""

    method: str
    version: str
    answer: str
    """"Admitted", "Violated" or "Unknown"."""
    stop: int
    """Units the rule uses: the run must hold exactly this many (the prefix of the plan's order)."""
    reason: str
    """One line: which bound crossed ε at which look, or why the rule did not stop before n_max."""
    epsilon: str
    """ε as given (exact decimal or fraction text)."""
    delta: float
    n_max: int
    looks: tuple[Look, ...]
    """Every look evaluated, in order; the last is the stopping look."""

    @property
    def final(self) -> Look:
        return self.looks[-1]

    def output(self) -> SequentialDecisionOutput:
        """What a decision prints of it: which method version decided, at which look, and every look's bounds."""
        return SequentialDecisionOutput(
            method=self.method, version=self.version, answer=self.answer, look=len(self.looks), stop=self.stop,
            n_max=self.n_max, delta=self.delta, reason=self.reason,
            looks=[SequentialLook(n=look.n, lower=look.lower, upper=look.upper) for look in self.looks])


# --- validation -----------------------------------------------------------------------------------------------------


def _check_method(method: object) -> str:
    if method not in SEQUENTIAL_METHODS:
        raise StatisticsError(f"unknown sequential method {method!r}; choose one of {', '.join(SEQUENTIAL_METHODS)}")
    return str(method)


def _check_epsilon(epsilon: object, a: float = -1.0, b: float = 1.0) -> tuple[Fraction, str]:
    """ε exactly (a Fraction, compared without rounding) and as the caller wrote it; strictly inside the range
    [a, b] of d, where a bound can cross it."""
    if isinstance(epsilon, Fraction | Decimal):
        value, text = Fraction(epsilon), str(epsilon)
    else:
        number = bounds.check_real("epsilon", epsilon)
        value, text = Fraction(number), repr(number)
    if not Fraction(a) < value < Fraction(b):
        raise StatisticsError(f"epsilon must lie strictly between {a:g} and {b:g}; got {text}")
    return value, text


def _check_boundaries(boundaries: Sequence[int], n_max: int) -> list[int]:
    looks = [bounds.check_count("batch boundary", b, 1) for b in boundaries]
    if not looks:
        raise StatisticsError("no batch boundaries: the plan must cut its units into batches")
    if any(b2 <= b1 for b1, b2 in itertools.pairwise(looks)):
        raise StatisticsError(f"batch boundaries must increase strictly; got {looks[:8]}")
    if looks[-1] != n_max:
        raise StatisticsError(f"the last batch boundary must be n_max = {n_max}; got {looks[-1]}")
    return looks


# --- capital processes ----------------------------------------------------------------------------------------------


def horizon_bets(x: FloatArray, delta: float, n_max: int) -> FloatArray:
    """WSR plug-in bets tuned to the horizon n_max: λ_t = sqrt(2·ln(1/δ)/(n_max·σ̂²_{t−1})), rows of x in [0, 1]."""
    rows, n = x.shape
    steps = np.arange(1, n + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x, axis=1)) / (steps + 1.0)
    var = (0.25 + np.cumsum((x - mu) ** 2, axis=1)) / (steps + 1.0)
    previous = np.concatenate([np.full((rows, 1), 0.25), var[:, :-1]], axis=1)
    bets: FloatArray = np.sqrt(2.0 * -math.log(delta) / (n_max * previous))
    return bets


def trinomial_bets(d: FloatArray, delta: float, n_max: int) -> FloatArray:
    """Horizon-tuned bets from the trinomial variance of the units before t: v̂ = p̂_d − m̂² on the d scale (p̂_d the
    discordant share, m̂ the mean, both with TRINOMIAL_PRIOR pseudo-counts), a quarter of that on x, and never below
    1/(4(t + 1)); rows of d in {-1, 0, 1}."""
    rows, n = d.shape
    worse = np.cumsum(d == 1.0, axis=1)
    better = np.cumsum(d == -1.0, axis=1)
    zeros = np.zeros((rows, 1))
    w_prev = np.concatenate([zeros, worse[:, :-1]], axis=1)
    b_prev = np.concatenate([zeros, better[:, :-1]], axis=1)
    seen = np.arange(n, dtype=np.float64)  # units before t
    total = seen + 2.0 * TRINOMIAL_PRIOR
    share = (w_prev + b_prev + TRINOMIAL_PRIOR) / total
    mean = (w_prev - b_prev) / total
    variance = np.maximum(share - mean * mean, 1.0 / (seen + 2.0)) / 4.0
    bets: FloatArray = np.sqrt(2.0 * -math.log(delta) / (n_max * variance))
    return bets


def _components(method: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if method == "betting-sequence":
        return (1.0,), (1.0,)
    return MIXTURE_SCALES, MIXTURE_WEIGHTS


def crossed_by(
    x: FloatArray, bets: FloatArray, m: FloatArray, side: str, delta: float, scales: Sequence[float],
    weights: Sequence[float],
) -> npt.NDArray[np.bool_]:
    """Whether the mixture Σ_j w_j Π_i (1 ∓ λ_ij(m)(x_i − m)) reaches 1/δ at some t ≤ (columns of x).

    λ_ij(m) = min(s_j·λ_i, c/(1 − m)) on the upper side (capital large when the mean is below m), min(s_j·λ_i, c/m)
    on the lower side, c = 1/2. Summed in log space; a crossing counts only if the log-mixture clears ln(1/δ) by the
    largest component's summation error bound plus the log-sum-exp rounding, so a counted crossing is a crossing of
    the exact process. x, bets: (R, n); m: (R,).
    """
    mm = m[:, None]
    n = x.shape[1]
    mixture, slack = None, np.zeros(x.shape[0])
    for scale, weight in zip(scales, weights, strict=True):
        if side == "upper":
            lam = np.minimum(scale * bets, bounds.BET_CAP / (1.0 - mm))
            terms = np.log1p(-lam * (x - mm))
        else:
            lam = np.minimum(scale * bets, bounds.BET_CAP / mm)
            terms = np.log1p(lam * (x - mm))
        slack = np.maximum(slack, (n + 16) * 2.0 * _UNIT * np.sum(np.abs(terms), axis=1))
        logged = np.add(math.log(weight), np.cumsum(terms, axis=1, out=terms), out=terms)
        # logaddexp.reduce over the stacked components is this left fold, element by element, without the stack
        mixture = logged if mixture is None else np.logaddexp(mixture, logged, out=mixture)
    assert mixture is not None
    peak = np.max(mixture, axis=1)
    threshold = -math.log(delta)
    allowance = slack + 16.0 * _UNIT * (np.abs(peak) + threshold + 1.0)
    crossed: npt.NDArray[np.bool_] = peak >= threshold + allowance
    return crossed


def _limits(x: FloatArray, bets: FloatArray, delta: float, method: str) -> tuple[FloatArray, FloatArray]:
    """(lower, upper) on the rescaled mean for each row of x, as betting_limits_rescaled does for one process."""
    scales, weights = _components(method)
    rows = x.shape[0]
    lo, hi = np.zeros(rows), np.ones(rows)
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        crossed = crossed_by(x, bets, mid, "upper", delta, scales, weights)
        hi = np.where(crossed, mid, hi)
        lo = np.where(crossed, lo, mid)
    upper = hi
    lo, hi = np.zeros(rows), np.ones(rows)
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        crossed = crossed_by(x, bets, mid, "lower", delta, scales, weights)
        lo = np.where(crossed, mid, lo)
        hi = np.where(crossed, hi, mid)
    return lo, upper


def _prepare(
    method: str, d: npt.ArrayLike, a: float, b: float, delta: float, n_max: int
) -> tuple[FloatArray, FloatArray]:
    """(x, bets) for the whole recorded prefix: x = (d − a)/(b − a), bets for the method."""
    values = bounds.check_data(d, a, b)
    if values.size > n_max:
        raise StatisticsError(f"{values.size} units recorded, more than n_max = {n_max}; the rule never goes past it")
    x = bounds.rescale(values, a, b)[None, :]
    if method == "paired-binary-sequence":
        if (a, b) != (-1.0, 1.0):
            raise StatisticsError(
                f"paired-binary-sequence models 0/1 losses, so d lies in [-1, 1]; got a={a!r}, b={b!r}. "
                "Declare a=-1, b=1 or use betting-sequence"
            )
        bounds.trinomial_counts(values, method)  # d ∈ {-1, 0, 1}, or one line saying which unit is not
        return x, trinomial_bets(values[None, :], delta, n_max)
    return x, horizon_bets(x, delta, n_max)


def sequence_bounds(
    method: str, d: npt.ArrayLike, a: float, b: float, delta: float, n_max: int, looks: Sequence[int]
) -> list[Look]:
    """The anytime-valid (lower, upper) on E[d] after each prefix length in `looks`.

    d: the differences in the plan's unit order (at least max(looks) of them, at most n_max). Each bound covers
    every t up to the look (the running intersection), so it holds simultaneously for all looks.
    """
    name = _check_method(method)
    a, b = bounds.check_range(a, b)
    delta = bounds.check_delta(delta)
    horizon = bounds.check_count("n_max", n_max, 1)
    x, bets = _prepare(name, d, a, b, delta, horizon)
    out = []
    for t in looks:
        if not 1 <= t <= x.shape[1]:
            raise StatisticsError(f"a look at {t} units needs 1..{x.shape[1]} recorded units")
        lower_x, upper_x = _limits(x[:, :t], bets[:, :t], delta, name)
        lower, upper = bounds.unscale_limits(lower_x, upper_x, a, b)
        out.append(Look(t, float(lower[0]), float(upper[0])))
    return out


def sequential_decision(
    method: str,
    d: npt.ArrayLike,
    boundaries: Sequence[int],
    epsilon: float | Fraction | Decimal,
    delta: float,
    n_max: int,
    *,
    a: float = -1.0,
    b: float = 1.0,
) -> SequentialDecision:
    """Where the stopping rule stops, given the differences recorded so far in the plan's unit order.

    boundaries: the cumulative unit counts at which batches end, increasing, the last equal to n_max. The rule
    looks after each batch in turn: Admitted when upper ≤ ε, Violated when lower > ε (Unknown when both, which
    needs the two bounds to cross), and Unknown at n_max. `stop` is the units the decision uses. With fewer
    units recorded than the rule needs, the result is the state at the last complete look with answer "Running".
    ε is compared exactly (Fraction).
    """
    name = _check_method(method)
    a, b = bounds.check_range(a, b)
    eps, eps_text = _check_epsilon(epsilon, a, b)
    horizon = bounds.check_count("n_max", n_max, 1)
    looks_at = _check_boundaries(boundaries, horizon)
    delta = bounds.check_delta(delta)
    x, bets = _prepare(name, d, a, b, delta, horizon)
    version = SEQUENTIAL_VERSIONS[name]
    seen: list[Look] = []
    for t in looks_at:
        if t > x.shape[1]:
            have = seen[-1].n if seen else 0
            return SequentialDecision(
                name, version, "Running", have, f"{x.shape[1]} units recorded; the next look is at {t}",
                eps_text, delta, horizon, tuple(seen),
            )
        lower_x, upper_x = _limits(x[:, :t], bets[:, :t], delta, name)
        low, up = bounds.unscale_limits(lower_x, upper_x, a, b)
        look = Look(t, float(low[0]), float(up[0]))
        seen.append(look)
        admits, violates = Fraction(look.upper) <= eps, Fraction(look.lower) > eps
        where = f"after {t} units ({name} {version})"
        if admits and violates:
            reason = (
                f"the bounds cross {where}: lower {look.lower:.6g} > upper {look.upper:.6g}; "
                "this evidence does not decide"
            )
            return SequentialDecision(name, version, "Unknown", t, reason, eps_text, delta, horizon, tuple(seen))
        if admits:
            reason = f"upper bound {look.upper:.6g} ≤ ε = {eps_text} {where}, valid at every look"
            return SequentialDecision(name, version, "Admitted", t, reason, eps_text, delta, horizon, tuple(seen))
        if violates:
            reason = f"lower bound {look.lower:.6g} > ε = {eps_text} {where}, valid at every look"
            return SequentialDecision(name, version, "Violated", t, reason, eps_text, delta, horizon, tuple(seen))
    last = seen[-1]
    reason = f"n_max = {horizon} reached with [{last.lower:.6g}, {last.upper:.6g}] containing ε = {eps_text}"
    return SequentialDecision(name, version, "Unknown", horizon, reason, eps_text, delta, horizon, tuple(seen))


def check_stop(recorded: int, decision: SequentialDecision) -> None:
    """Refuse a run that did not stop where the rule stops: StatisticsError with one line.

    recorded: the units the run holds (a prefix of the plan's order); the decision is `sequential_decision` on
    exactly those units. A run that went on after the rule stopped holds more units than `decision.stop`; a closed
    run that stopped early holds fewer (the rule is still "Running").
    """
    units = bounds.check_count("recorded units", recorded, 0)
    if decision.answer == "Running":
        raise StatisticsError(
            f"the run stopped after {units} units, where the stopping rule does not stop ({decision.reason}); "
            "resume it to the rule's stop"
        )
    if units != decision.stop:
        raise StatisticsError(
            f"the run holds {units} units but the stopping rule stops at {decision.stop} ({decision.answer}); "
            "a sequential run must stop exactly where the rule says"
        )


# --- planning: expected stopping n ---------------------------------------------------------------------------------


CHUNK_UNITS = 4_000_000
"""Simulated units per chunk of runs (each chunk draws its own random numbers, seeded by its first run: changing
this changes the runs)."""


def simulate_stops(
    method: str, p_worse: float, p_better: float, epsilon: float, delta: float, n_max: int, batch: int,
    runs: int, seed: int, done: Callable[[int], None] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int8]]:
    """(stopping n, answer: +1 Admitted, −1 Violated, 0 Unknown) of `runs` simulated runs of 0/1 losses; `done`, if
    given, is told the number of runs simulated so far after each chunk of runs (one run per chunk at the largest
    n_max, where a run takes seconds).

    The rule is evaluated at every batch end by the crossing test at ε itself (capital at m = ε on each side), which
    is what the reported bounds decide up to their 2^-42 grid; a plan needs frequencies, not the last bits.
    """
    name = _check_method(method)
    scales, weights = _components(name)
    m = (epsilon + 1.0) / 2.0
    stops = np.full(runs, n_max, dtype=np.int64)
    answers = np.zeros(runs, dtype=np.int8)
    chunk = max(1, min(runs, CHUNK_UNITS // max(1, n_max)))
    ends = np.arange(batch, n_max + batch, batch)
    ends[-1] = n_max
    for start in range(0, runs, chunk):
        rows = min(chunk, runs - start)
        rng = np.random.default_rng([seed, start])
        # one run: its uniforms drawn as its segments need them (the same stream, in order); else all at once
        if rows == 1:  # one run: its uniforms drawn as its segments need them (the same stream, in order)
            stop, answer = _stops_in_segments(partial(_draw, rng), name, p_worse, p_better, m, delta, n_max, ends,
                                              scales, weights)
            stops[start], answers[start] = stop[0], answer[0]
        else:  # the chunk's uniforms at once, its runs simulated ROW_BLOCK at a time (the same figures, less memory)
            u = rng.random((rows, n_max))
            for first in range(0, rows, ROW_BLOCK):
                block = slice(start + first, start + min(rows, first + ROW_BLOCK))
                stops[block], answers[block] = _stops_in_segments(
                    u[first : first + ROW_BLOCK], name, p_worse, p_better, m, delta, n_max, ends, scales, weights)
        if done is not None:
            done(start + rows)
    return stops, answers


def _draw(rng: np.random.Generator, lo: int, hi: int) -> FloatArray:
    """One run's uniforms of units [lo, hi), the next ones of its stream (`rng.random((1, n))` in pieces)."""
    drawn: FloatArray = rng.random((1, hi - lo))
    return drawn


ROW_BLOCK = 32
"""Runs simulated together: their temporaries (1 MB each at the first segment) stay in the caches and the allocator's
reuse, where a whole chunk of hundreds of runs made each temporary a fresh mapping of tens of MB, its pages faulted in
anew (4-5 times the CPU). Rows are independent, so the figures do not depend on it."""

SEGMENT_UNITS = 4096
"""Units of the first segment of the runs still undecided (rounded to whole looks), each next segment twice the one
before: most runs stop long before n_max, and the undecided ones go on in ever fewer, larger pieces."""


def _stops_in_segments(
    u: FloatArray | Callable[[int, int], FloatArray], name: str, p_worse: float, p_better: float, m: float,
    delta: float, n_max: int, ends: npt.NDArray[np.int64], scales: Sequence[float], weights: Sequence[float],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int8]]:
    """(stopping n, answer) of the runs whose uniforms are the rows of `u`, as one pass over all n_max units would
    give them (`trinomial_bets`, `horizon_bets`, the mixture's running maximum at each look) bit for bit. `u` may
    instead draw one run's uniforms of units [lo, hi) when asked, segment after segment (so a run that stops early
    draws only what it uses).

    The units go in segments of whole looks, and a run leaves once either side has crossed at a look: its stop and
    answer are then fixed (a side that crosses later cannot change which crossed first). Each running sum continues
    from the value carried over as its first element, and numpy's accumulate adds in order, so every count, mean,
    variance, bet and log-capital is that of the single pass."""
    rows = 1 if callable(u) else u.shape[0]
    stops = np.full(rows, n_max, dtype=np.int64)
    answers = np.zeros(rows, dtype=np.int8)
    threshold = -math.log(delta)
    trinomial = name == "paired-binary-sequence"
    live = np.arange(rows)
    carried_w = np.zeros(rows)  # worse units so far (trinomial bets)
    carried_b = np.zeros(rows)  # better units so far
    carried_x = np.zeros(rows)  # Σ x so far (horizon bets)
    carried_sq = np.zeros(rows)  # Σ (x − mu)² so far
    carried_var = np.full(rows, 0.25)  # the variance estimate the next horizon bet uses
    sides = ("upper", "lower")
    carried_log = {(side, j): np.zeros(rows) for side in sides for j in range(len(scales))}  # Σ log terms so far
    carried_max = {side: np.full(rows, -np.inf) for side in sides}  # the mixture's running maximum so far
    first_look, per_segment = 0, max(1, SEGMENT_UNITS // max(1, int(ends[0])))
    while first_look < ends.size:
        looks = ends[first_look : first_look + per_segment]
        lo = 0 if first_look == 0 else int(ends[first_look - 1])
        first_look, per_segment = first_look + looks.size, 2 * per_segment
        hi = int(looks[-1])
        seg = u(lo, hi) if callable(u) else u[live, lo:hi]
        d = np.where(seg < p_worse, 1.0, np.where(seg >= 1.0 - p_better, -1.0, 0.0))
        x = (d + 1.0) / 2.0
        if trinomial:
            worse = np.cumsum(np.concatenate([carried_w[:, None], d == 1.0], axis=1), axis=1)
            better = np.cumsum(np.concatenate([carried_b[:, None], d == -1.0], axis=1), axis=1)
            w_prev, b_prev = worse[:, :-1], better[:, :-1]
            carried_w, carried_b = worse[:, -1], better[:, -1]
            seen = np.arange(lo, hi, dtype=np.float64)  # units before t
            total = seen + 2.0 * TRINOMIAL_PRIOR
            share = (w_prev + b_prev + TRINOMIAL_PRIOR) / total
            mean = (w_prev - b_prev) / total
            variance = np.maximum(share - mean * mean, 1.0 / (seen + 2.0)) / 4.0
            bets = np.sqrt(2.0 * threshold / (n_max * variance))
        else:
            steps = np.arange(lo + 1, hi + 1, dtype=np.float64)
            sums = np.cumsum(np.concatenate([carried_x[:, None], x], axis=1), axis=1)[:, 1:]
            carried_x = sums[:, -1]
            mu = (0.5 + sums) / (steps + 1.0)
            squares = np.cumsum(np.concatenate([carried_sq[:, None], (x - mu) ** 2], axis=1), axis=1)[:, 1:]
            carried_sq = squares[:, -1]
            var = (0.25 + squares) / (steps + 1.0)
            previous = np.concatenate([carried_var[:, None], var[:, :-1]], axis=1)
            carried_var = var[:, -1]
            bets = np.sqrt(2.0 * -math.log(delta) / (n_max * previous))
        first = {}
        # Each look's block of units, as offsets into the segment: the running maximum is only read at the looks.
        blocks = np.concatenate([[0], looks[:-1] - lo])
        for side in sides:
            mixture = None
            for j, (scale, weight) in enumerate(zip(scales, weights, strict=True)):
                if side == "upper":
                    lam = np.minimum(scale * bets, bounds.BET_CAP / (1.0 - m))
                    terms = np.log1p(-lam * (x - m))
                else:
                    lam = np.minimum(scale * bets, bounds.BET_CAP / m)
                    terms = np.log1p(lam * (x - m))
                # The carried sum added to the first term, then the running sum in place: numpy's accumulate adds
                # in order, so each sum is the one continued from the carried value.
                terms[:, 0] += carried_log[side, j]
                summed = np.cumsum(terms, axis=1, out=terms)
                carried_log[side, j] = summed[:, -1].copy()
                logged = np.add(math.log(weight), summed, out=summed)
                # logaddexp.reduce over the stacked components is this left fold, element by element
                mixture = logged if mixture is None else np.logaddexp(mixture, logged, out=mixture)
            assert mixture is not None
            block_max = np.maximum.reduceat(mixture, blocks, axis=1)
            peak = np.maximum.accumulate(np.concatenate([carried_max[side][:, None], block_max], axis=1), axis=1)
            carried_max[side] = peak[:, -1]
            running = peak[:, 1:] >= -math.log(delta)
            first[side] = np.where(running.any(axis=1), np.argmax(running, axis=1), looks.size)
        up, low = first["upper"], first["lower"]
        look = np.minimum(up, low)
        stopped = look < looks.size
        where = live[stopped]
        stops[where] = looks[look[stopped]]
        answers[where] = np.where(up < low, 1, np.where(low < up, -1, 0))[stopped]
        keep = ~stopped
        live = live[keep]
        if live.size == 0:
            break
        carried_w, carried_b, carried_x = carried_w[keep], carried_b[keep], carried_x[keep]
        carried_sq, carried_var = carried_sq[keep], carried_var[keep]
        carried_log = {key: value[keep] for key, value in carried_log.items()}
        carried_max = {key: value[keep] for key, value in carried_max.items()}
    return stops, answers


def sequential_plan(
    method: str, p_worse: float, p_better: float, epsilon: float, delta: float, n_max: int, batch: int = 100,
    *, runs: int = 2000, seed: int = 0, done: Callable[[int], None] | None = None,
) -> SequentialPlanRow:
    """Expected and 90th-percentile stopping n, and the answer frequencies, by simulation under the assumption
    (0/1 losses with the given p_worse, p_better; runs independent runs, seed fixed). `done` is told the runs
    simulated so far as they finish (`simulate_stops`); the figures do not depend on it."""
    name = _check_method(method)
    pw = bounds.check_real("p_worse", p_worse)
    pb = bounds.check_real("p_better", p_better)
    if not (0.0 <= pw <= 1.0 and 0.0 <= pb <= 1.0 and pw + pb <= 1.0):
        raise StatisticsError(f"p_worse={pw!r}, p_better={pb!r} must be probabilities with a sum at most 1")
    eps = float(_check_epsilon(epsilon)[0])
    dlt = bounds.check_delta(delta)
    horizon = bounds.check_count("n_max", n_max, 1)
    size = bounds.check_count("batch", batch, 1)
    count = bounds.check_count("runs", runs, 1)
    stops, answers = simulate_stops(name, pw, pb, eps, dlt, horizon, size, count, int(seed), done)
    return SequentialPlanRow(
        method=name, version=SEQUENTIAL_VERSIONS[name], n_max=horizon, batch=size,
        admitted=float(np.mean(answers == 1)), violated=float(np.mean(answers == -1)),
        unknown=float(np.mean(answers == 0)), expected_n=float(np.mean(stops)),
        expected_n_error=float(np.std(stops) / math.sqrt(count)), p90_n=int(np.percentile(stops, 90)),
        runs=count,
        basis=f"Monte Carlo: {count} independent runs (seed {int(seed)}), looks every {size} units",
    )


def sequential_max_n(
    method: str, p_worse: float, p_better: float, epsilon: float, delta: float, power: float = 0.8,
    batch: int = 100, *, runs: int = 2000, seed: int = 0, n_limit: int = 10_000_000,
) -> SequentialPlanRow:
    """The plan at the smallest n_max (a multiple of `batch`) whose simulated P(Admitted) reaches `power` under the
    assumption: the sequential design with the power of a fixed-n plan. Every n_max is simulated on the same
    stream (common random numbers: the power is then smooth in n_max, and the search does not pick one lucky
    stream among many); report a plan at the n_max found on a fresh seed for unselected frequencies."""
    target = bounds.check_real("power", power)
    if not 0.0 < target < 1.0:
        raise StatisticsError(f"power must lie strictly between 0 and 1 (e.g. 0.8); got {target!r}")
    size = bounds.check_count("batch", batch, 1)
    seen: dict[int, SequentialPlanRow] = {}

    def at(blocks: int) -> SequentialPlanRow:
        if blocks not in seen:
            seen[blocks] = sequential_plan(
                method, p_worse, p_better, epsilon, delta, blocks * size, size, runs=runs, seed=seed
            )
        return seen[blocks]

    pw, pb = bounds.check_real("p_worse", p_worse), bounds.check_real("p_better", p_better)
    variance = pw + pb - (pw - pb) ** 2
    gap = float(_check_epsilon(epsilon)[0]) - (pw - pb)
    if gap <= 0.0:
        raise StatisticsError(f"the assumed mean increase {pw - pb!r} is not below epsilon: no n_max admits")
    z = NormalDist().inv_cdf(1.0 - bounds.check_delta(delta)) + NormalDist().inv_cdf(target)
    guess = max(1, math.ceil(1.5 * variance * (z / gap) ** 2 / size))  # sequential designs need about this
    lo, hi = 0, guess  # lo: below target (or none), hi: at or above
    while at(hi).admitted < target:
        lo, hi = hi, 2 * hi
        if hi * size > n_limit:
            raise StatisticsError(f"the target power is not reached with n_max up to {n_limit}")
    while lo == 0 and hi > 1 and at(hi // 2).admitted >= target:
        hi //= 2
    lo = max(lo, hi // 2) if lo == 0 and hi > 1 else lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid).admitted >= target:
            hi = mid
        else:
            lo = mid
    return at(hi)


def render_sequential(plan: SequentialPlanRow) -> str:
    """One line for a person: the stopping n and the answers' frequencies, and how they were obtained."""
    return (
        f"sequential {plan.version}, n_max {plan.n_max:,}, looks every {plan.batch:,}: expected stop "
        f"{plan.expected_n:,.0f} (±{plan.expected_n_error:,.0f}), 90th percentile {plan.p90_n:,}; Admitted "
        f"{plan.admitted:.3f}, Violated {plan.violated:.3f}, Unknown {plan.unknown:.3f} ({plan.basis})\n"
    )
