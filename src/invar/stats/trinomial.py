"""The exact unconditional test behind the paired-binary-exact bound.

Decision: for 0/1 task losses every prompt is worse, tied or better, so the counts (W, B) of a run of n prompts are
one trinomial draw and Δ = p_worse − p_better is the expected loss increase. The upper confidence limit on Δ is the
inversion of an exact unconditional test of H0: Δ ≥ Δ0 with statistic T = W − B (small T is evidence against H0).
Its nuisance parameter π = p_worse + p_better is handled by Berger and Boos (1994): the supremum of the tail
P(T ≤ t) is taken only over π ≤ U_π, the one-sided Clopper–Pearson upper (1 − γ) limit of π from D = W + B, and γ is
added to the p-value. No step is asymptotic:

* dominance: moving probability from "tied" to "worse" or from "better" to "tied" can only raise T, so the
  supremum over H0 ∩ {π ≤ U_π} is attained on the boundary Δ = Δ0 (or, for Δ0 < 0, at p_worse = 0) and, on a cell
  p_better ∈ [g1, g2] of the boundary, P(T ≤ t) is at most its value at the corner (p_worse, p_better) = (g1 + Δ0,
  g2). A branch-and-bound over cells proves "sup ≤ α" with finitely many tail evaluations;
* the p-value is non-increasing in Δ0 (H0 shrinks, the statistic does not depend on Δ0), so a proof at Δ0 proves
  every larger Δ0, and the reported limit (a proven point) is a valid one-sided (1 − δ) upper confidence bound;
* every tail is an upper bound: the binomial mixture is summed in float64 with scipy's (Boost) binomial pmf and cdf,
  enlarged by TAIL_SLACK relative and by the whole binomial mass left outside the summed range.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from invar.stats import _binom

FloatArray = npt.NDArray[np.float64]

GAMMA_FRACTION = 1.0 / 50.0
"""γ = δ/50 of the error budget goes to the nuisance restriction (Berger and Boos recommend 0.001 at δ = 0.05)."""

TAIL_SLACK = 4e-12
"""Relative allowance on every computed tail: 10x the worst error of scipy's binomial pmf/cdf measured against
mpmath (3.4e-13) plus the float64 summation error of a few thousand positive terms."""

_TRUNCATION_LOG = 46.0  # summed range leaves out at most ~e^-46 ≈ 1e-20 of the mass, which is then added back
_UNIT = 2.0**-53  # float64 unit roundoff
_MIN_CELL = 2.0**-44  # a nuisance cell narrower than this is not split further; the proof then fails (safe side)
_MAX_OPEN_CELLS = 2048  # a proof needing more cells at once is abandoned (safe side: not rejected)
_CERTIFY_STEPS = (2.0**-36, 2.0**-30, 2.0**-24)  # certify this far above the last point known not rejected
_BISECTIONS = 42  # Δ0 ∈ [-1, 1] to a resolution of 2^-41


def _up(x: float) -> float:
    """x enlarged past the rounding error of one or two float64 operations."""
    return math.nextafter(x + 4.0 * _UNIT * abs(x), math.inf)


def tails(t: int, n: int, pi: FloatArray, q: FloatArray) -> FloatArray:
    """Upper bounds on P(W − B ≤ t) for n prompts, one per trinomial.

    pi: (M,) discordance probabilities π = p_worse + p_better in [0, 1]; q: (M,) shares p_worse/π in [0, 1].
    Returns (M,) probabilities, each ≥ the exact tail and ≤ it·(1 + 1e-11) + 2e-20.
    Given D = W + B = k discordant prompts, W ~ Bin(k, q) and W − B = 2W − k, so the tail is
    Σ_k Bin(k; n, π)·BinCdf(⌊(t + k)/2⌋; k, q).
    """
    pi = np.clip(np.asarray(pi, dtype=np.float64), 0.0, 1.0)
    q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
    if t >= n:
        return np.ones_like(pi)
    if t < -n:
        return np.zeros_like(pi)
    k_needed = max(0, -t)  # below this many discordant prompts W − B ≤ t is impossible
    # Bernstein: P(D − nπ ≥ s) ≤ exp(−L) for s = sqrt(2σ²L) + 2L/3, and below the mean sqrt(2σ²L) suffices.
    spread = np.sqrt(2.0 * _TRUNCATION_LOG * n * pi * (1.0 - pi))
    k_lo = max(k_needed, int(np.floor(np.min(n * pi - spread))))
    k_hi = min(n, int(np.ceil(np.max(n * pi + spread + 2.0 * _TRUNCATION_LOG / 3.0))))
    if k_hi < k_lo:
        k_hi = k_lo
    k = np.arange(k_lo, k_hi + 1, dtype=np.float64)
    # every argument is known valid here, so the binomial functions go unchecked (`_binom.pmf_inside`); the
    # numbers are those of `scipy.stats.binom`
    pmf = _binom.pmf_inside(k[None, :], n, pi[:, None])
    c = np.floor((t + k) / 2.0)
    within = np.zeros(pmf.shape)
    within[:, c >= k] = 1.0  # the cdf at or above the top of the support (and 0 below its bottom)
    middle = (c >= 0.0) & (c < k)
    if middle.any():
        within[:, middle] = _binom.cdf_inside(c[None, middle], k[None, middle], q[:, None])
    total = np.sum(pmf * within, axis=1)
    left_out = _binom.sf_inside(k_hi, n, pi) if k_hi < n else np.zeros_like(pi)
    if k_lo > k_needed:
        left_out = left_out + _binom.cdf_inside(k_lo - 1, n, pi)
    result: FloatArray = np.minimum(1.0, (total + left_out) * (1.0 + TAIL_SLACK))
    return result


def clopper_pearson_upper(k: int, n: int, gamma: float) -> float:
    """One-sided Clopper–Pearson upper (1 − γ) limit of a binomial proportion from k successes in n trials.

    Enlarged by 1e-12 relative so that rounding in the inverse incomplete beta cannot land below the exact limit.
    """
    if k >= n:
        return 1.0
    limit = float(_binom.beta_isf(gamma, k + 1, n - k))
    return min(1.0, math.nextafter(limit * (1.0 + 1e-12), math.inf))


def _corner_params(g1: FloatArray, g2: FloatArray, delta0: float) -> tuple[FloatArray, FloatArray]:
    """(π, q) of a trinomial that puts no more mass on "worse" and no less on "better" than any boundary point
    (p_better + Δ0, p_better) with p_better ∈ [g1, g2]: the corner (g1 + Δ0, g2), rounded toward the safe side."""
    worse = g1 + delta0  # ≥ 0 exactly: g1 ≥ max(0, -Δ0) and float addition is monotone
    total = worse + g2
    pi = np.minimum(1.0, np.nextafter(total * (1.0 + 4.0 * _UNIT), np.inf))
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(pi > 0.0, worse / pi, 0.0)
    q = np.maximum(0.0, np.nextafter(q * (1.0 - 4.0 * _UNIT), -np.inf))
    return pi, q


def _point_params(pb: FloatArray, delta0: float) -> tuple[FloatArray, FloatArray]:
    """(π, q) of the boundary points (p_better + Δ0, p_better), without safe-side rounding (used only to refute)."""
    pw = np.maximum(0.0, pb + delta0)
    pi = np.minimum(1.0, pw + pb)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(pi > 0.0, pw / pi, 0.0)
    return pi, q


def _segment(delta0: float, pi_upper: float) -> tuple[float, float]:
    """The p_better range of boundary points with π ≤ π_upper; empty when hi < lo."""
    lo = max(0.0, -delta0)
    hi = _up(min((pi_upper - delta0) * 0.5, (1.0 - delta0) * 0.5))
    return lo, hi


def _anchor_point(delta0: float, pi_upper: float) -> tuple[FloatArray, FloatArray] | None:
    """(π, q) of `anchor_tail`'s point; None where H0 ∩ {π ≤ π_upper} is empty."""
    lo, hi = _segment(delta0, pi_upper)
    if hi >= lo:
        top = min((pi_upper - delta0) * 0.5, (1.0 - delta0) * 0.5)
        return _point_params(np.array([max(lo, top)]), delta0)
    if delta0 < 0.0:
        return np.array([min(-delta0, pi_upper)]), np.array([0.0])
    return None  # Δ ≥ Δ0 > 0 needs π ≥ Δ0 > π_upper


def anchor_tail(delta0: float, t: int, n: int, pi_upper: float) -> float:
    """The tail at the point of H0(Δ0) ∩ {π ≤ π_upper} where it is usually largest: the top of the boundary
    segment (largest π), or (0, min(-Δ0, π_upper)) when the segment is empty. A lower bound on the supremum;
    non-increasing in Δ0."""
    point = _anchor_point(delta0, pi_upper)
    return 0.0 if point is None else float(tails(t, n, *point)[0])


def anchor_above(delta0: float, t: int, n: int, pi_upper: float, alpha: float) -> bool:
    """`anchor_tail(delta0, t, n, pi_upper) > alpha`, the same answer (`tails_above`)."""
    point = _anchor_point(delta0, pi_upper)
    return point is not None and bool(tails_above(t, n, *point, alpha)[0][0])


def rejects(delta0: float, t: int, n: int, pi_upper: float, alpha: float) -> bool:
    """Whether the test provably rejects H0: Δ ≥ Δ0 at level α + γ, i.e. sup P(W − B ≤ t) ≤ α over the boundary
    points with π ≤ π_upper (and, for Δ0 < 0, the points with p_worse = 0).

    True is a proof (every bound used is an upper bound). False means refuted (a point exceeds α) or not proven
    at the finest cell width; both are the safe answer.
    """
    return proof_status(delta0, t, n, pi_upper, alpha) == "proven"


def proof_status(delta0: float, t: int, n: int, pi_upper: float, alpha: float, *, fast: bool = False) -> str:
    """`rejects` with its reason: "proven"; "refuted" (a point of H0 ∩ {π ≤ π_upper} has a tail above α, so no
    proof exists at any larger t or π_upper either); or "abandoned" (no proof within the cell limits).

    `fast` takes every comparison with α, and the choice of the worst open cell, from `tails_bounds` where they
    settle it (`tails` where not): the same steps, cells and status, at a fraction of the cost (the planner's
    proofs)."""
    if delta0 <= -1.0:
        return "refuted"

    def above(pi: FloatArray, q: FloatArray) -> bool:
        if fast:
            return bool(tails_above(t, n, pi, q, alpha)[0][0])
        return bool(tails(t, n, pi, q)[0] > alpha)

    point = _anchor_point(delta0, pi_upper)
    if point is not None and above(*point):
        return "refuted"
    if delta0 < 0.0:
        edge = np.array([_up(min(-delta0, pi_upper))])
        if above(np.minimum(1.0, edge), np.array([0.0])):
            return "refuted"
    lo, hi = _segment(delta0, pi_upper)
    if hi < lo:
        return "proven"
    edges = np.linspace(lo, hi, 9)
    edges[0], edges[-1] = lo, hi
    g1, g2 = edges[:-1], edges[1:]
    while g1.size:
        pi, q = _corner_params(g1, g2, delta0)
        worst = _worst_open(t, n, pi, q, alpha, fast)
        open_ = worst[0]
        g1, g2 = g1[open_], g2[open_]
        if not g1.size:
            return "proven"
        if g1.size > _MAX_OPEN_CELLS or np.any(g2 - g1 <= _MIN_CELL):
            return "abandoned"
        at = worst[1]  # refute early if the supremum is not where the anchor sits
        if above(*_point_params(g2[at : at + 1], delta0)):
            return "refuted"
        width = g2 - g1
        parts = [g1 + width * f for f in (0.0, 0.25, 0.5, 0.75)] + [g2]
        g1 = np.concatenate(parts[:-1])
        g2 = np.concatenate(parts[1:])
    return "proven"


def _worst_open(t: int, n: int, pi: FloatArray, q: FloatArray, alpha: float,
                fast: bool) -> tuple[npt.NDArray[np.bool_], int]:
    """The cells whose corner tail exceeds α, and the position among them of the largest (the first, on ties)."""
    if fast:
        bounds = tails_bounds(t, n, pi, q)
        if bounds is not None:
            lower, upper = bounds
            open_ = lower > alpha
            if np.all(open_ | (upper <= alpha)):
                if not open_.any():
                    return open_, 0
                low, high = lower[open_], upper[open_]
                at = int(np.argmax(low))
                if high.size == 1 or low[at] > np.max(np.delete(high, at)):
                    return open_, at
    corner = tails(t, n, pi, q)
    open_ = corner > alpha
    return open_, int(np.argmax(corner[open_])) if open_.any() else 0


def searched_tail(delta0: float, t: int, n: int, pi_upper: float) -> float:
    """The largest tail found on H0(Δ0) ∩ {π ≤ π_upper} by a 33-point grid along the boundary segment, zoomed
    eight times around its best point (plus the anchor). A lower bound on the supremum for when the supremum is
    not at the anchor (small n, large π)."""
    best = anchor_tail(delta0, t, n, pi_upper)
    lo = max(0.0, -delta0)
    top = min((pi_upper - delta0) * 0.5, (1.0 - delta0) * 0.5)
    if top <= lo:
        return best
    points = np.linspace(lo, top, 33)
    for _ in range(9):
        values = tails(t, n, *_point_params(points, delta0))
        best = max(best, float(values.max()))
        i = int(np.argmax(values))
        points = np.linspace(points[max(i - 1, 0)], points[min(i + 1, points.size - 1)], 9)
    return best


def _bisect(lo: float, hi: float, exceeds: Callable[[float], bool]) -> float:
    """The upper end of [lo, hi] after bisecting it _BISECTIONS times: lo moves to points where exceeds(mid)."""
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if exceeds(mid):
            lo = mid
        else:
            hi = mid
    return hi


def upper_limit(worse: int, better: int, n: int, delta: float) -> float:
    """One-sided (1 − δ) upper confidence limit on p_worse − p_better from trinomial counts.

    A dyadic point of [-1, 1] at which the test provably rejects. Found in up to three passes, each a bisection
    over Δ0 whose lower end always has a point with tail > α (so the exact Berger–Boos limit is above it):
    (1) on the anchor tail, then certify 2^-36 higher (or 2^-30, 2^-24); (2) if that fails, on the searched tail,
    certify again; (3) if that fails too, on the branch-and-bound proof itself. After (1) or (2) the exact limit
    lies within 2^-24 + 2^-41 (almost always 2^-36 + 2^-41) below the returned value.
    """
    gamma = GAMMA_FRACTION * delta
    alpha = delta - gamma
    pi_upper = clopper_pearson_upper(worse + better, n, gamma)
    t = worse - better
    hi = _bisect(-1.0, 1.0, lambda d0: anchor_tail(d0, t, n, pi_upper) > alpha)
    if hi >= 1.0:
        return 1.0
    certified = _certify(hi, t, n, pi_upper, alpha)
    if certified is not None:
        return certified
    hi = _bisect(hi - 2.0**-41, 1.0, lambda d0: searched_tail(d0, t, n, pi_upper) > alpha)
    certified = _certify(hi, t, n, pi_upper, alpha)
    if certified is not None:
        return certified
    return _bisect(hi, 1.0, lambda d0: not rejects(d0, t, n, pi_upper, alpha))


def _certify(hi: float, t: int, n: int, pi_upper: float, alpha: float) -> float | None:
    """The first of hi + 2^-36, 2^-30, 2^-24 the branch-and-bound proves rejected (1.0 needs no proof)."""
    for step in _CERTIFY_STEPS:
        candidate = min(1.0, hi + step)
        if candidate >= 1.0 or rejects(candidate, t, n, pi_upper, alpha):
            return candidate
    return None


# --- the same decisions without a special-function call per term (the planner's proofs) ----------------------------

BOOST_RELATIVE = 1e-10
"""Assumed bound on the relative error of one Boost binomial pmf or cdf value (TAIL_SLACK rests on the measured
worst, 3.4e-13, 300 times smaller), with BOOST_ABSOLUTE for values near underflow."""
BOOST_ABSOLUTE = 1e-280
_BLOCK = 64  # terms per recurrence from one Boost anchor
_SMALL = 2048  # (cell, count) pairs below which `tails` is cheaper than the bounds


def tails_bounds(t: int, n: int, pi: FloatArray, q: FloatArray) -> tuple[FloatArray, FloatArray] | None:
    """(lo, hi) with lo ≤ `tails(t, n, pi, q)` ≤ hi elementwise (the very numbers `tails` returns for this batch of
    cells: its summed range depends on the whole batch), at a fraction of its cost; None where it does not apply
    (π or q at 0 or 1, t outside [-n, n), a value out of float range) or would cost more than `tails`.

    Why: the planner's proofs only compare tails with α (and take the largest of a few), and `tails` spends its
    time in two Boost calls per (cell, count). Here Boost gives the values at every _BLOCK-th count, and the terms
    between follow by exact recurrences: Bin(k+1; n, π) = Bin(k; n, π)·(n − k)/(k + 1)·π/(1 − π) and, along the
    path c_k = ⌊(t + k)/2⌋, F(c; k+1) = F(c; k) − q·b(c; k) and F(c+1; k+1) = F(c; k) + q·b(c; k)·(k − c)/(c + 1)
    (F the Bin(k, q) cdf, b its pmf, itself a product of ratios along the path). The interval bounds the float
    result, not the exact tail: it allows every rounding of the recurrences (a few units in the last place per
    step), the error of each Boost value `tails` sums (BOOST_RELATIVE, BOOST_ABSOLUTE), any order of summation
    (count·u relative), and takes `tails`' own last steps (monotone) at both ends."""
    pi = np.clip(np.asarray(pi, dtype=np.float64), 0.0, 1.0)
    q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
    if t >= n or t < -n or not (np.all((pi > 0.0) & (pi < 1.0)) and np.all((q > 0.0) & (q < 1.0))):
        return None
    k_needed = max(0, -t)  # the summed range exactly as `tails` takes it
    spread = np.sqrt(2.0 * _TRUNCATION_LOG * n * pi * (1.0 - pi))
    k_lo = max(k_needed, int(np.floor(np.min(n * pi - spread))))
    k_hi = min(n, int(np.ceil(np.max(n * pi + spread + 2.0 * _TRUNCATION_LOG / 3.0))))
    if k_hi < k_lo:
        k_hi = k_lo
    cells, width = pi.size, k_hi - k_lo + 1
    if cells * width < _SMALL:
        return None  # `tails` itself costs less
    blocks = -(-width // _BLOCK)
    raw = k_lo + np.arange(blocks * _BLOCK, dtype=np.float64)
    valid = (raw <= k_hi).reshape(blocks, _BLOCK)
    k = np.minimum(raw, k_hi).reshape(blocks, _BLOCK)  # the padding repeats k_hi and is masked out
    c = np.floor((t + k) / 2.0)
    middle = (c >= 0.0) & (c < k)  # once a count is in it, every larger one is (k > t and k ≥ −t)
    ran = middle[:, 0]  # blocks that start inside it: the recurrence
    entering = ~ran & middle.any(axis=1)  # the one block that enters it after its first count: Boost throughout
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        # Bin(k; n, π): Boost at each block's first count, the ratios after it (column 0 of a ratio is 1)
        shift = np.ones((blocks, _BLOCK))
        shift[:, 1:] = (n - k[:, :-1]) / (k[:, :-1] + 1.0)
        odds = np.ones((cells, 1, _BLOCK))
        odds[:, 0, 1:] = (pi / (1.0 - pi))[:, None]
        growth = np.cumprod(shift[None] * odds, axis=2)
        pmf = _binom.pmf_inside(k[None, :, 0], n, pi[:, None])[:, :, None] * growth
        within = np.zeros((cells, blocks, _BLOCK))
        within[:, c >= k] = 1.0
        block_error = np.zeros((cells, blocks))  # per block, a bound on every |within − F| in it
        if ran.any():
            kr, cr = k[ran], c[ran]
            step_k, step_c = kr[:, :-1], cr[:, :-1]
            up = cr[:, 1:] > step_c
            # ratio of b along the path: (k+1)/(c+1)·q going up, (k+1)/(k+1−c)·(1 − q) staying
            on_q = np.zeros(kr.shape)
            on_q[:, 1:] = np.where(up, (step_k + 1.0) / (step_c + 1.0), 0.0)
            on_p = np.zeros(kr.shape)
            on_p[:, 1:] = np.where(up, 0.0, (step_k + 1.0) / (step_k + 1.0 - step_c))
            qq = q[:, None, None]
            b_ratio = on_q[None] * qq + on_p[None] * (1.0 - qq)
            b_ratio[:, :, 0] = 1.0
            b_growth = np.cumprod(b_ratio, axis=2)
            # each step's F increment over b, the rest as b: q·(k − c)/(c + 1) going up, −q staying (column 0: 0)
            lift = np.zeros(kr.shape)
            lift[:, 1:] = np.where(up, (step_k - step_c) / (step_c + 1.0), -1.0)
            start_f = _binom.cdf_inside(cr[None, :, 0], kr[None, :, 0], q[:, None])
            start_b = _binom.pmf_inside(cr[None, :, 0], kr[None, :, 0], q[:, None])
            steps = np.zeros((cells, kr.shape[0], _BLOCK))
            steps[:, :, 1:] = (start_b[:, :, None] * b_growth[:, :, :-1]) * (lift[None, :, 1:] * qq)
            within[:, ran] = start_f[:, :, None] + np.cumsum(steps, axis=2)
            moved = np.sum(np.abs(steps), axis=2)
            # an anchor's absolute error carried through the ratios and the steps (each |increment/b| ≤ k)
            reach = np.max(b_growth, axis=2) * (kr[:, -1] + 1.0)[None]
            block_error[:, ran] = ((BOOST_RELATIVE + 8 * _BLOCK * _UNIT) * (np.abs(start_f) + moved)
                                   + _BLOCK * BOOST_ABSOLUTE * reach + BOOST_ABSOLUTE)
        if entering.any():
            ke, ce, me = k[entering], c[entering], middle[entering]
            exact = within[:, entering]
            exact[:, me] = _binom.cdf_inside(ce[me][None, :], ke[me][None, :], q[:, None])
            within[:, entering] = exact
            block_error[:, entering] = BOOST_RELATIVE + BOOST_ABSOLUTE
        pmf *= valid[None]
        terms = (pmf * within).reshape(cells, -1)
        total = np.sum(terms, axis=1)
        # Σ|pmf·within − P·F| ≤ Σ e_P·(1 + 2 e_F) + Σ pmf·e_F, e_P = pmf·(BOOST_RELATIVE + 6·_BLOCK·u) + 2·ABS·growth
        e_f = np.max(block_error, axis=1)
        pmf_error = ((BOOST_RELATIVE + 6 * _BLOCK * _UNIT) * np.sum(pmf, axis=(1, 2))
                     + 2.0 * BOOST_ABSOLUTE * np.sum(growth * valid[None], axis=(1, 2)))
        error = pmf_error * (1.0 + 2.0 * e_f) + np.sum(np.sum(pmf, axis=2) * block_error, axis=1)
        magnitude = np.sum(np.abs(terms), axis=1)
    if not (np.all(np.isfinite(total)) and np.all(np.isfinite(error)) and np.all(np.isfinite(magnitude))):
        return None
    size = terms.shape[1]
    error = error * (1.0 + 4.0 * size * _UNIT)
    # `tails` sums Boost's values (each within BOOST_RELATIVE) in its own order: count·u of the whole each way
    error += (2.0 * BOOST_RELATIVE + 3.0 * size * _UNIT) * (magnitude + error) + 2.0 * size * BOOST_ABSOLUTE
    left_out = _binom.sf_inside(k_hi, n, pi) if k_hi < n else np.zeros_like(pi)
    if k_lo > k_needed:
        left_out = left_out + _binom.cdf_inside(k_lo - 1, n, pi)
    low = np.maximum(0.0, np.nextafter(total - error, -np.inf))
    high = np.nextafter(total + error, np.inf)
    lower: FloatArray = np.minimum(1.0, (low + left_out) * (1.0 + TAIL_SLACK))
    upper: FloatArray = np.minimum(1.0, (high + left_out) * (1.0 + TAIL_SLACK))
    return lower, upper


def tails_above(t: int, n: int, pi: FloatArray, q: FloatArray, alpha: float) -> tuple[npt.NDArray[np.bool_],
                                                                                    FloatArray | None]:
    """`tails(t, n, pi, q) > alpha` elementwise, the same booleans, from `tails_bounds` where they settle every cell
    (then None), else from `tails` itself (then its values too)."""
    bounds = tails_bounds(t, n, pi, q)
    if bounds is not None:
        lower, upper = bounds
        if np.all((lower > alpha) | (upper <= alpha)):
            return lower > alpha, None
    values = tails(t, n, pi, q)
    return values > alpha, values
