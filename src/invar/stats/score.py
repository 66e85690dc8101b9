"""The score-ordered exact unconditional test behind the paired-binary-score bound.

Decision: for 0/1 task losses the counts (W, B) of worse and better prompts among n are one trinomial draw and
Δ = p_worse − p_better is the expected loss increase. The upper confidence limit on Δ inverts an exact test of
H0: Δ ≥ Δ0 whose outcomes are ordered by a score statistic, so that the test adapts to the observed discordance the
way the normal approximation does, yet no step is asymptotic:

* ordering: each outcome (w, b) gets S(w, b), Tango's (1998) asymptotic upper limit: the largest Δ with
  (w − b − nΔ)/sqrt(n(2p̃_b + Δ(1 − Δ))) ≥ −z, p̃_b the restricted maximum-likelihood p_better at Δ. S is computed
  by a fixed bisection, so it is a fixed function of (w, b, n, z); within each discordant count k = w + b it is made
  non-decreasing in w by a running maximum (T(w, k) = max over w' ≤ w of S(w', k − w')). An outcome is at least as
  extreme as the observed one when T ≤ T_obs; that set does not depend on Δ0, so the p-value below can only fall as
  Δ0 rises and a proof at one Δ0 proves every larger Δ0 (Buehler's construction);
* nuisance: π = p_worse + p_better is restricted as in Berger and Boos (1994) to π ≤ U_π, the one-sided
  Clopper–Pearson upper (1 − γ) limit from k, γ = δ/100, and γ is added to the p-value;
* supremum: for fixed π the extreme set has probability Σ_k Bin(k; n, π)·P(Bin(k, q) ≤ c_k) with c_k the largest
  w at k in the set, which falls as q = p_worse/π rises, so over H0 it is largest on the boundary Δ = Δ0
  (q = (1 + Δ0/π)/2, clipped to [0, 1]). Along π a branch-and-bound bounds each cell [π1, π2] by
  Σ_k max_{π∈cell} Bin(k; n, π)·P(Bin(k, q_min) ≤ c_k) plus the binomial mass it leaves out, and proves
  "supremum ≤ α = δ − γ" with finitely many tail evaluations; every term is an upper bound (TAIL_SLACK).

The reported upper limit is the smallest point of the grid 2^-(17 + ⌊bit_length(n − 1)/2⌋) of [-1, 1] the proof
reaches (bisection), so P(Δ > upper) ≤ δ for every n ≥ 1 and every true (p_worse, p_better). Not P(Δ ≥ upper): the
limit 1 is a cap proven for no Δ0, and at p_worse = 1 every outcome gives it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from invar.stats import _binom
from invar.stats.trinomial import TAIL_SLACK, clopper_pearson_upper

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

GAMMA_FRACTION = 1.0 / 100.0
"""γ = δ/100 of the error budget goes to the nuisance restriction (γ = δ/50 measured 0.4 % more units)."""
ORDER_MARGIN = 2.0**-29
"""S(w, b) ≤ (w − b + z·sqrt(n))/n + 2^-30 (where its bisection starts); twice that absorbs rounding."""

_TRUNCATION_LOG = 25.0  # the summed range leaves out ~e^-25 of the mass, which is then added back in full
_UNIT = 2.0**-53
_CELL_SDS = 2.0  # the fixed cells are uniform in sqrt(π), each about this many standard deviations of k/n wide
_MEMO_WIDTH = 4  # c-dependent values kept per (cell, count) for this many consecutive thresholds (16 kept more
# values that were never read again: 4 measured 10-15 % faster plans, fewer page faults; the values are the same)
_MAX_OPEN_CELLS = 512  # a proof needing more cells at once is abandoned (safe side: not rejected)
_MIN_CELL = 2.0**-46  # a cell narrower than this is not split; the proof fails (safe side)
_SPLIT = 4
_TANGO_BLOCK = 16384  # outcomes bisected at once by `tango_limits` (temporaries of 128 kB: in cache, no page faults)
_BATCH_CELLS = 256  # cells bounded at once (a few MB of temporaries: no page faults, and they stay in cache)


def order_z(delta: float) -> float:
    """The normal quantile z_{1−δ} the ordering uses, rounded to 2^-20 so that the ordering does not depend on the
    last bits of a platform's log (the ordering only has to be fixed, not exact)."""
    return round(NormalDist().inv_cdf(1.0 - delta) * 2.0**20) / 2.0**20


def tango_limits(worse: npt.ArrayLike, better: npt.ArrayLike, n: int, z: float) -> FloatArray:
    """S(w, b): Tango's asymptotic upper limit for each outcome, by bisection.

    A Δ counts as plausible when w − b − nΔ ≥ −z·sqrt(n(2p̃ + Δ(1 − Δ))), p̃ the larger root of Tango's quadratic
    2n·p² − ((w + b) + (w − b)Δ − 2nΔ)·p − bΔ(1 − Δ) = 0, clipped to the feasible [max(0, −Δ), (1 − Δ)/2]. The
    bisection starts from [(w − b)/n − 2^-20, (w − b + z·sqrt(n))/n + 2^-30] (within [-1, 1]: the variance term is
    at most n, so nothing above is plausible) and halves it until it is narrower than 2^-31; it returns the upper
    end, so S ≤ (w − b + z·sqrt(n))/n + 2^-30 always. Only +, −, ×, / and sqrt (each correctly rounded) are used,
    so S is the same number on every IEEE platform.
    """
    w, b = np.broadcast_arrays(np.asarray(worse, dtype=np.float64), np.asarray(better, dtype=np.float64))
    shape = w.shape
    w, b = w.reshape(-1), b.reshape(-1)  # at least one axis: the loop works in place
    size = float(n)
    lo = np.maximum(-1.0, (w - b) / size - 2.0**-20)
    hi = np.minimum(1.0, (w - b + z * math.sqrt(size)) / size + 2.0**-30)
    lo = np.minimum(lo, hi)
    width = float(np.max(hi - lo)) if w.size else 0.0
    steps = max(1, math.ceil(math.log2(max(width, 2.0**-31)) + 31.0))
    # in blocks of outcomes: each outcome's bisection is its own (elementwise, the same step count for all), and
    # the temporaries of a whole ordering's rows at once (~10^5 values, a few MB each, allocated afresh every step)
    # cost page faults and cache misses that blocks of _TANGO_BLOCK avoid
    for start in range(0, w.size, _TANGO_BLOCK):
        part = slice(start, start + _TANGO_BLOCK)
        _tango_bisect(w[part], b[part], lo[part], hi[part], size, z, steps)
    result: FloatArray = hi.reshape(shape)
    return result


def _tango_bisect(
    w: FloatArray, b: FloatArray, lo: FloatArray, hi: FloatArray, size: float, z: float, steps: int
) -> None:
    """`tango_limits`' bisection of [lo, hi] (in place, `steps` halvings) for outcomes (w, b) among n = size."""
    # The loop evaluates, in this order of operations (the same numbers, fewer array passes):
    #   linear = (w + b) + (w − b)·d − 2n·d;  disc = max(linear² + 8n·b·d·(1 − d), 0)
    #   p = clip((linear + sqrt(disc))/(4n), max(0, −d), (1 − d)/2);  variance = max(n(2p + d(1 − d)), 0)
    #   plausible = (w − b) − n·d ≥ −z·sqrt(variance)
    total, diff, scaled_b = w + b, w - b, 8.0 * size * b
    two_n, four_n, minus_z = 2.0 * size, 4.0 * size, -z
    for _ in range(steps):
        d = lo + hi
        d *= 0.5
        one_minus = 1.0 - d
        linear = diff * d
        linear += total
        linear -= two_n * d
        disc = scaled_b * d
        disc *= one_minus
        disc += linear * linear
        np.maximum(disc, 0.0, out=disc)
        np.sqrt(disc, out=disc)
        disc += linear
        disc /= four_n
        p = np.clip(disc, np.maximum(0.0, -d), one_minus * 0.5, out=disc)
        p *= 2.0
        variance = d * one_minus
        variance += p
        variance *= size
        np.maximum(variance, 0.0, out=variance)
        np.sqrt(variance, out=variance)
        variance *= minus_z
        plausible = diff - size * d >= variance
        np.copyto(lo, d, where=plausible)
        np.copyto(hi, d, where=~plausible)


def _surely_below(n: int, z: float, k: npt.ArrayLike, t: float) -> IntArray:
    """For each discordant count k, a w such that every w' < it has S(w', k − w') ≤ t.

    S(w', b') ≤ (w' − b' + z·sqrt(n))/n + 2^-30 by the bisection's start (`tango_limits`); ORDER_MARGIN (twice
    that) and the final −1 absorb rounding.
    """
    bound = (t - ORDER_MARGIN) * n + np.asarray(k, dtype=np.float64) - z * math.sqrt(n)
    start = np.floor(bound / 2.0).astype(np.int64) + 1
    result: IntArray = np.clip(start - 1, 0, None)
    return result


@dataclass
class Ordering:
    """The ordering statistic of one (n, z) with the values of S computed so far, shared by every outcome of n.

    Row k of `table` holds S(w, k − w) for w = base[k], base[k] + 1, … (`filled[k]` of them, NaN after); every w
    below base[k] has S ≤ floor (by the bound on S), so for any t ≥ floor the first w with S > t is stored or lies
    beyond the stored part of the row.
    """

    n: int
    z: float
    floor: float = math.inf
    base: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    filled: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    table: FloatArray = field(default_factory=lambda: np.full((0, 1), np.nan))

    def _rebase(self, floor: float, k_max: int) -> None:
        ks = np.arange(k_max + 1)
        base = np.minimum(_surely_below(self.n, self.z, ks, floor), ks + 1)
        rows = self.base.size
        keep = np.zeros(k_max + 1, dtype=bool)
        keep[:rows] = self.base[: k_max + 1] == base[:rows]
        table = np.full((k_max + 1, self.table.shape[1]), np.nan)
        filled = np.zeros(k_max + 1, dtype=np.int64)
        old = np.flatnonzero(keep)
        table[old] = self.table[old]
        filled[old] = self.filled[old]
        self.floor, self.base, self.filled, self.table = floor, base, filled, table

    def _extend(self, ks: IntArray, width: int | IntArray) -> None:
        """Compute `width` more values of S for each row in ks (one vectorised call; a width per row or one for
        all; the rows distinct)."""
        starts = self.base[ks] + self.filled[ks]
        counts = np.maximum(0, np.minimum(ks + 1, starts + width) - starts)
        if counts.sum() == 0:
            return
        rows = np.repeat(ks, counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        w = np.repeat(starts, counts) + offsets
        values = tango_limits(w, rows - w, self.n, self.z)
        need = int(np.max(self.filled[ks] + counts))
        if need > self.table.shape[1]:
            grown = np.full((self.table.shape[0], max(need, 2 * self.table.shape[1])), np.nan)
            grown[:, : self.table.shape[1]] = self.table
            self.table = grown
        self.table[rows, np.repeat(self.filled[ks], counts) + offsets] = values
        self.filled[ks] += counts

    def prepare(self, t: float, k_max: int) -> None:
        """Make thresholds(t, k_max) answerable: every row k ≤ k_max holds its first S > t, or is complete."""
        k_max = min(k_max, self.n)
        if t < self.floor or k_max >= self.base.size:
            self._rebase(min(t, self.floor), max(k_max, self.base.size - 1))
        block = max(8, int(self.z * math.sqrt(self.n) / 2.0) + 4)
        ks = np.arange(k_max + 1)
        while True:
            found = np.any(self.table[: k_max + 1] > t, axis=1)
            complete = self.base[: k_max + 1] + self.filled[: k_max + 1] >= ks + 1
            need = np.flatnonzero(~found & ~complete)
            if need.size == 0:
                return
            self._extend(need, block)

    def thresholds(self, t: float, k_max: int) -> IntArray:
        """c_k for k = 0..k_max: the largest w with T(w, k) ≤ t (−1 when none), T the running maximum of S."""
        self.prepare(t, k_max)
        above = self.table[: k_max + 1] > t
        first = np.where(np.any(above, axis=1), np.argmax(above, axis=1), self.filled[: k_max + 1])
        c: IntArray = np.minimum(self.base[: k_max + 1] + first - 1, np.arange(k_max + 1))
        return c

    def thresholds_many(self, ts: npt.ArrayLike, k_max: int) -> IntArray:
        """np.stack([thresholds(t, k_max) for t in ts]), the same numbers, from the rows' running maxima: the first
        w with S > t is where the running maximum of the stored part first exceeds t, so its index is the count of
        running maxima ≤ t, or `filled` where none exceeds t (a row with nothing stored: NaN, counted as none)."""
        values = [float(t) for t in np.asarray(ts, dtype=np.float64).reshape(-1)]
        if min(values) < self.floor or min(k_max, self.n) >= self.base.size:
            return np.stack([self.thresholds(t, k_max) for t in values])
        self.prepare(max(values), k_max)  # then every smaller t is answerable too: prepare(t) would do nothing
        peaks = np.fmax.accumulate(self.table[: k_max + 1], axis=1)
        at = np.array(values)
        first = np.empty((at.size, peaks.shape[0]), dtype=np.int64)
        for k in range(peaks.shape[0]):
            first[:, k] = np.searchsorted(peaks[k], at, side="right")
        first = np.minimum(first, self.filled[: k_max + 1][None, :])
        c: IntArray = np.minimum(self.base[: k_max + 1][None, :] + first - 1, np.arange(k_max + 1)[None, :])
        return c

    def cover(self, worse: IntArray, counts: IntArray) -> None:
        """Store S up to each (worse, count) in one vectorised call: what `statistic` would compute row by row
        (tango_limits costs mostly its per-call overhead at a few values a row)."""
        inside = counts < self.base.size
        worse, counts = worse[inside], counts[inside]
        inside = self.base[counts] <= worse
        worse, counts = worse[inside], counts[inside]
        if counts.size == 0:
            return
        rows = np.unique(counts)
        furthest = np.full(rows.size, -1, dtype=np.int64)
        np.maximum.at(furthest, np.searchsorted(rows, counts), worse)
        short = furthest - (self.base[rows] + self.filled[rows]) + 1
        wanted = short > 0
        if wanted.any():
            self._extend(rows[wanted], short[wanted])

    def statistic(self, worse: int, better: int) -> float:
        """T(worse, worse + better): the running maximum of S along w at the observed discordant count."""
        k = worse + better
        if k < self.base.size and self.base[k] <= worse:
            short = worse - int(self.base[k] + self.filled[k]) + 1
            if short > 0:
                self._extend(np.array([k]), short)
            peak = float(np.max(self.table[k, : worse - self.base[k] + 1]))
            if peak >= self.floor:  # every S below base[k] is ≤ floor ≤ peak: the stored part decides
                return peak
        t = float(tango_limits(np.array([worse]), np.array([better]), self.n, self.z)[0])
        while True:
            start = int(_surely_below(self.n, self.z, k, t))
            if start > worse:
                return t
            w = np.arange(start, worse + 1)
            peak = float(np.max(tango_limits(w, k - w, self.n, self.z)))
            if peak <= t:
                return t
            t = peak  # a larger maximum below: rows further down might matter for it, so look again


# --- the extreme set's probability over cells of the nuisance parameter -------------------------------------------


def k_ranges(n: int, lo: FloatArray, hi: FloatArray) -> tuple[IntArray, IntArray]:
    """Per cell, counts [k_lo, k_hi] with k_lo ≤ n·lo and k_hi ≥ n·hi, wide enough that the mass of Bin(n, lo)
    below k_lo and of Bin(n, hi) above k_hi is about e^-25 (Bernstein); that mass is added back in full."""
    spread_lo = np.sqrt(2.0 * _TRUNCATION_LOG * n * lo * (1.0 - lo))
    spread_hi = np.sqrt(2.0 * _TRUNCATION_LOG * n * hi * (1.0 - hi)) + 2.0 * _TRUNCATION_LOG / 3.0
    k_lo = np.maximum(0, np.minimum(np.floor(n * lo), np.floor(n * lo - spread_lo))).astype(np.int64)
    k_hi = np.minimum(n, np.maximum(np.ceil(n * hi), np.ceil(n * hi + spread_hi))).astype(np.int64)
    return k_lo, k_hi


# The proofs' inner loops: every count below is an integer, every k ≥ 0 and every q in [0, 1], so the binomial
# functions go unchecked on the elements inside the support and the rest are set as scipy would set them (the
# checks cost more than the functions; the numbers are `_binom.cdf`'s and `_binom.pmf`'s, bit for bit).


def _cdf(c: IntArray, k: npt.ArrayLike, q: npt.ArrayLike) -> FloatArray:
    """P(Bin(k, q) ≤ c): 0 for c < 0, 1 for c ≥ k."""
    cc, kk, qq = np.broadcast_arrays(np.asarray(c), np.asarray(k), np.asarray(q))
    values: FloatArray = np.where(cc < 0, 0.0, 1.0)
    inner = (cc >= 0) & (cc < kk)
    if np.any(inner):
        values[inner] = _binom.cdf_inside(cc[inner], kk[inner], qq[inner])
    return values


def _pmf(j: npt.ArrayLike, m: npt.ArrayLike, q: npt.ArrayLike) -> FloatArray:
    """Bin(m, q) pmf at j, 0 where j is outside [0, m] (so also for m < 0)."""
    jj, mm, qq = np.broadcast_arrays(np.asarray(j), np.asarray(m), np.asarray(q))
    inside = (jj >= 0) & (jj <= mm)
    values: FloatArray = np.zeros(inside.shape)
    if np.any(inside):
        values[inside] = _binom.pmf_inside(jj[inside], mm[inside], qq[inside])
    return values


@dataclass
class _Cells:
    """Everything about a batch of cells [a1, a2] of the boundary at one Δ0 that does not depend on the extreme set.

    Per cell (rows) and summed count k (columns, masked beyond the cell's range): the first-order bound's pmf
    maxima and q_min; the third-order bound's centre m, radius r, the pmf f and f·s, f·(s² + s') at m (s = f'/f),
    the pmf maxima times the bounds over the cell of the first three derivatives of f divided by f (p1, p2, p3, see
    `_bounds`), and q' and q'' at m with bounds on the first three derivatives of q over the cell. `smooth` marks
    cells narrower than 1.25 standard deviations of k/n on which q(π) is smooth and inside [0, 1] (a1 > 0,
    a2 < 1, and π ≥ −Δ0 when Δ0 < 0).
    """

    a1: FloatArray
    a2: FloatArray
    k: IntArray
    mask: npt.NDArray[np.bool_]
    left: FloatArray
    pmf_max: FloatArray
    q_min: FloatArray
    smooth: npt.NDArray[np.bool_]
    r: FloatArray
    q_m: FloatArray
    q_lo: FloatArray
    q_hi: FloatArray
    f_m: FloatArray
    fs_m: FloatArray
    fss_m: FloatArray
    dq_m: FloatArray
    ddq_m: FloatArray
    p1: FloatArray
    p2: FloatArray
    p3: FloatArray
    dq1: FloatArray
    dq2: FloatArray
    dq3: FloatArray


def _q_of(pi: FloatArray, delta0: float) -> FloatArray:
    """q = p_worse/π on the boundary Δ = Δ0, clipped to [0, 1] (π = 0: 0 for Δ0 < 0, else 1/2)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(pi > 0.0, 0.5 * (1.0 + delta0 / np.where(pi > 0.0, pi, 1.0)), 0.0 if delta0 < 0.0 else 0.5)
    result: FloatArray = np.clip(q, 0.0, 1.0)
    return result


def _down(x: FloatArray) -> FloatArray:
    """x lowered past a few roundings, within [0, 1]."""
    result: FloatArray = np.clip(np.nextafter(x * (1.0 - 4.0 * _UNIT), -np.inf), 0.0, 1.0)
    return result


def _up(x: FloatArray) -> FloatArray:
    """x raised past a few roundings, within [0, 1]."""
    result: FloatArray = np.clip(np.nextafter(x * (1.0 + 4.0 * _UNIT), np.inf), 0.0, 1.0)
    return result


def _safe(a1: FloatArray, a2: FloatArray, smooth: npt.NDArray[np.bool_]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The third-order bound's cell ends (as columns; 0.25 and 0.75 on the rows it does not use, to keep them
    finite) and its centre m."""
    safe_lo = np.where(smooth, a1, 0.25)[:, None]
    safe_hi = np.where(smooth, a2, 0.75)[:, None]
    return safe_lo, safe_hi, 0.5 * (safe_lo + safe_hi)


_Parts = dict[str, npt.NDArray[Any]]  # `_Cells` fields by name


def _count_parts(n: int, a1: FloatArray, a2: FloatArray, smooth: npt.NDArray[np.bool_]) -> _Parts:
    """The fields of `_Cells` that do not depend on Δ0 given the cells and their `smooth` marks: the counts, the
    mass left out and the per-count pmf values and their derivative bounds."""
    k_lo, k_hi = k_ranges(n, a1, a2)
    width = int(np.max(k_hi - k_lo)) + 1
    raw = k_lo[:, None] + np.arange(width)[None, :]
    mask = raw <= k_hi[:, None]
    k = np.minimum(raw, k_hi[:, None])
    kf = k.astype(np.float64)
    nf = float(n)
    lo, hi = a1[:, None], a2[:, None]
    left = _binom.sf(k_hi, n, a2) + np.where(k_lo > 0, _binom.cdf(np.maximum(k_lo - 1, 0), n, a1), 0.0)
    pmf_max = np.where(mask, _binom.pmf_inside(k, n, np.clip(kf / nf, lo, hi)), 0.0)  # 0 ≤ k ≤ n: k_ranges
    safe_lo, safe_hi, m = _safe(a1, a2, smooth)
    d1 = np.maximum(np.abs(kf - nf * safe_lo), np.abs(kf - nf * safe_hi)) / np.minimum(
        safe_lo * (1.0 - safe_lo), safe_hi * (1.0 - safe_hi)
    )
    f_m = np.where(mask, _binom.pmf_inside(k, n, m), 0.0)
    s_m = (kf - nf * m) / (m * (1.0 - m))
    ds_m = -kf / (m * m) - (nf - kf) / ((1.0 - m) * (1.0 - m))
    e2 = kf / (safe_lo * safe_lo) + (nf - kf) / ((1.0 - safe_hi) * (1.0 - safe_hi))
    e3 = 2.0 * kf / safe_lo**3 + 2.0 * (nf - kf) / (1.0 - safe_hi) ** 3
    return {
        "k": k, "mask": mask, "left": left, "pmf_max": pmf_max, "f_m": f_m, "fs_m": f_m * s_m,
        "fss_m": f_m * (s_m * s_m + ds_m), "p1": 3.0 * pmf_max * d1, "p2": 3.0 * pmf_max * (d1 * d1 + e2),
        "p3": pmf_max * (d1 * d1 * d1 + 3.0 * d1 * e2 + e3),
    }


_K = TypeVar("_K")


def _slots(known: dict[_K, int], keys: Iterable[_K], size: int) -> tuple[IntArray, list[int]]:
    """Each key's slot in `known`, a new key given the next slot: (the slots, the positions of the keys that were
    new, in order)."""
    slots = np.empty(size, dtype=np.int64)
    new: list[int] = []
    for i, key in enumerate(keys):
        slot = known.get(key)
        if slot is None:
            slot = known[key] = len(known)
            new.append(i)
        slots[i] = slot
    return slots, new


_KEPT_PARTS = ("k", "pmf_max", "f_m", "fs_m", "fss_m", "p1", "p2", "p3")  # per count, kept unpadded


@dataclass
class CellParts:
    """`_count_parts` of the cells one outcome's proofs have met, kept by (a1, a2, smooth).

    An outcome's limit takes several proofs at different Δ0, and their cells are mostly the same fixed cells and
    splits (measured: three in four cells of a simulation's limits recur within one limit), yet these parts are
    most of a cell's cost (two pmf evaluations per count). Each cell's counts are kept unpadded, one after another;
    a batch reads them back padded as `_count_parts` pads them (the last count repeated, the masked values the
    zeros it gives), so the cells, and every bound, are the same numbers as a fresh computation's."""

    n: int
    slots: dict[tuple[float, float, bool], int] = field(default_factory=dict)
    start: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    length: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    left: FloatArray = field(default_factory=lambda: np.zeros(0))
    flat: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict)
    used: int = 0

    def get(self, a1: FloatArray, a2: FloatArray, smooth: npt.NDArray[np.bool_]) -> _Parts:
        slots, new = _slots(self.slots, zip(a1.tolist(), a2.tolist(), smooth.tolist(), strict=True), a1.size)
        if new:
            self._add(_count_parts(self.n, a1[new], a2[new], smooth[new]))
        start, length = self.start[slots], self.length[slots]
        if np.min(length) < 1:  # no counts at all (a1 > a2): not kept in this layout, computed as they are
            return _count_parts(self.n, a1, a2, smooth)
        width = int(np.max(length))
        columns = np.arange(width)[None, :]
        mask = columns < length[:, None]
        at = start[:, None] + np.minimum(columns, length[:, None] - 1)
        got: _Parts = {"mask": mask, "left": self.left[slots], "k": self.flat["k"][at]}
        for name in _KEPT_PARTS[1:]:
            value = self.flat[name][at]
            # `_count_parts`' padding: zero times the last count's factor (a signed zero for f·s and f·(s² + s'))
            got[name] = np.where(mask, value, 0.0 * value if name in ("fs_m", "fss_m") else 0.0)
        return got

    def _add(self, parts: _Parts) -> None:
        length = np.sum(parts["mask"], axis=1)
        count = int(length.sum())
        if self.used + count > (self.flat["k"].size if self.flat else 0):
            capacity = max(self.used + count, 2 * self.used, 1024)
            for name in _KEPT_PARTS:
                grown = np.empty(capacity, dtype=parts[name].dtype)
                if self.used:
                    grown[: self.used] = self.flat[name][: self.used]
                self.flat[name] = grown
        for name in _KEPT_PARTS:
            self.flat[name][self.used : self.used + count] = parts[name][parts["mask"]]  # row by row, a prefix each
        self.start = np.concatenate([self.start, self.used + np.cumsum(length) - length])
        self.length = np.concatenate([self.length, length])
        self.left = np.concatenate([self.left, parts["left"]])
        self.used += count


def _cells(n: int, a1: FloatArray, a2: FloatArray, delta0: float, parts: CellParts | None = None) -> _Cells:
    scale = np.sqrt(np.maximum(a2 * (1.0 - a2), a1 * (1.0 - a1)) / n)
    smooth = (a1 > 0.0) & (a2 < 1.0) & (a2 - a1 < 1.25 * scale)
    if delta0 < 0.0:
        smooth &= a1 >= -delta0
    counts = _count_parts(n, a1, a2, smooth) if parts is None else parts.get(a1, a2, smooth)
    # the smallest boundary q in the cell, rounded down (a smaller q only enlarges the tail)
    q_min = _down(_q_of(a2 if delta0 > 0.0 else a1, delta0))
    safe_lo, safe_hi, m = _safe(a1, a2, smooth)
    r = np.where(safe_hi > safe_lo, np.nextafter(np.maximum(m - safe_lo, safe_hi - m), np.inf), 0.0)
    q_a, q_b = 0.5 * (1.0 + delta0 / safe_lo), 0.5 * (1.0 + delta0 / safe_hi)
    return _Cells(
        a1=a1, a2=a2, q_min=q_min, smooth=smooth, r=r[:, 0],
        q_m=np.clip(0.5 * (1.0 + delta0 / m), 0.0, 1.0), q_lo=_down(np.minimum(q_a, q_b)),
        q_hi=_up(np.maximum(q_a, q_b)), dq_m=-delta0 / (2.0 * m * m), ddq_m=delta0 / (m * m * m),
        dq1=abs(delta0) / (2.0 * safe_lo * safe_lo), dq2=abs(delta0) / safe_lo**3, dq3=3.0 * abs(delta0) / safe_lo**4,
        **counts,
    )


_KINDS = 4  # the extreme-set-dependent values: F(q_min), F(q_m), k·Bin(c; k−1, q_m), its maximum over q in the cell


def _values_at(cells: _Cells, rows: IntArray, cols: IntArray, ck: IntArray, kind: int) -> FloatArray:
    """One extreme-set-dependent value at the given (row, column) elements of `cells` with thresholds ck (1-D)."""
    k = cells.k[rows, cols]
    kf = k.astype(np.float64)
    inner = (ck >= 0) & (ck < kf)
    if kind == 0:
        return _cdf(ck, k, cells.q_min[rows])
    if kind == 1:
        return _cdf(ck, k, cells.q_m[rows, 0])
    if kind == 2:
        result: FloatArray = np.where(inner, kf * _pmf(ck, kf - 1.0, cells.q_m[rows, 0]), 0.0)
        return result
    mode = np.clip(ck / np.maximum(kf - 1.0, 1.0), cells.q_lo[rows, 0], cells.q_hi[rows, 0])
    result = np.where(inner, kf * _pmf(ck, kf - 1.0, mode), 0.0) * (1.0 + 1e-12)
    return result


class _ValueSource(Protocol):
    def __call__(self, rows: IntArray, ck: IntArray, kinds: tuple[int, ...]) -> list[FloatArray]: ...


def _direct(cells: _Cells) -> _ValueSource:
    """Values computed afresh, only where a count is summed."""

    def values(rows: IntArray, ck: IntArray, kinds: tuple[int, ...]) -> list[FloatArray]:
        r, cols = np.nonzero(cells.mask[rows])
        out = []
        for kind in kinds:
            full = np.zeros(ck.shape)
            full[r, cols] = _values_at(cells, rows[r], cols, ck[r, cols], kind)
            out.append(full)
        return out

    return values


def _row_sum(x: FloatArray) -> FloatArray:
    """Row sums added left to right (np.cumsum): trailing zeros of a padded row then change nothing, so a cell's
    bound is the same number whichever batch it is computed in; the error is at most (count)·u relative."""
    total: FloatArray = np.cumsum(x, axis=1)[:, -1]
    return total


def _bounds(cells: _Cells, ck: IntArray, alpha: float, values: _ValueSource) -> FloatArray:
    """Each cell's bound: the third-order bound where it applies, the first-order one where that is > α (or does not
    apply); the smaller of the two.

    First order: (Σ_k max_{π∈cell} Bin(k; n, π)·P(Bin(k, q_min) ≤ c_k) + mass left out)·(1 + TAIL_SLACK).
    Third order, for the summed part G(π) = Σ_k f_k(π)·F_k(q(π)) on [m − r, m + r]:
    G ≤ G(m) + |G'(m)|·r + |G''(m)|·r²/2 + M3·r³/6 (+ the mass left out), G' and G'' at m computed exactly and
    M3 ≥ sup |G'''| bounded term by term: (fF)''' = f'''F + 3f''F' + 3f'F'' + fF''' with F' = F_q q',
    F'' = F_qq q'² + F_q q'', F''' = F_qqq q'³ + 3F_qq q'q'' + F_q q'''; on the cell f ≤ max pmf,
    |f'|/f ≤ d1, |f''|/f ≤ d1² + e2, |f'''|/f ≤ d1³ + 3d1e2 + e3; F_q = −k·Bin(c; k − 1, q) =: −g,
    F_qq = −g·h, F_qqq = −g·(h² − c/q² − (k − 1 − c)/(1 − q)²) with h = c/q − (k − 1 − c)/(1 − q) (monotone in q),
    g ≤ its maximum over the cell's q-range, F ≤ F(q_m) + g_max·(q_m − q_lo). A point cell (r = 0) is its tail.
    """
    rows_all = np.arange(cells.a1.size)
    result = np.full(cells.a1.size, np.inf)
    point = np.flatnonzero(cells.smooth & (cells.r == 0.0))  # a cell of width zero: just the tail there
    if point.size:
        (big_f,) = values(point, ck[point], (1,))
        value = _row_sum(np.where(cells.mask[point], cells.f_m[point] * big_f, 0.0))
        result[point] = np.nextafter((value + cells.left[point]) * (1.0 + TAIL_SLACK), np.inf)
    third = np.flatnonzero(cells.smooth & (cells.r > 0.0))
    if third.size:
        c3 = ck[third]
        big_f, g_m, g_max = values(third, c3, (1, 2, 3))
        mask = cells.mask[third]
        kf = cells.k[third].astype(np.float64)
        f, fs, fss = cells.f_m[third], cells.fs_m[third], cells.fss_m[third]
        q_m, q_lo, q_hi = cells.q_m[third], cells.q_lo[third], cells.q_hi[third]
        dq, ddq = cells.dq_m[third], cells.ddq_m[third]
        below, above = c3.astype(np.float64), kf - 1.0 - c3
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            h_m = np.where(g_m > 0.0, below / q_m - above / (1.0 - q_m), 0.0)
            f_g = f * g_m
            first_terms = fs * big_f - f_g * dq
            second_terms = fss * big_f - 2.0 * fs * g_m * dq - f_g * (h_m * dq * dq + ddq)
            value = _row_sum(np.where(mask, f * big_f, 0.0))
            slope = np.abs(_row_sum(np.where(mask, first_terms, 0.0)))
            slope += 1e-10 * _row_sum(np.where(mask, np.abs(first_terms), 0.0))
            bend = np.abs(_row_sum(np.where(mask, second_terms, 0.0)))
            bend += 1e-10 * _row_sum(np.where(mask, np.abs(second_terms), 0.0))
            inner = g_max > 0.0
            h_lo, h_hi = below / q_lo - above / (1.0 - q_lo), below / q_hi - above / (1.0 - q_hi)
            h_max = np.where(inner, np.maximum(np.abs(h_lo), np.abs(h_hi)), 0.0)
            gq_max = g_max * h_max
            spread = h_max * h_max + below / (q_lo * q_lo) + above / ((1.0 - q_hi) * (1.0 - q_hi))
            gqq_max = np.where(inner, g_max * spread, 0.0)
            f_cap = np.minimum(1.0, big_f * (1.0 + 1e-12) + g_max * (q_m - q_lo))
            dq1, dq2, dq3 = cells.dq1[third], cells.dq2[third], cells.dq3[third]
            terms = (
                cells.p3[third] * f_cap
                + cells.p2[third] * (g_max * dq1)
                + cells.p1[third] * (gq_max * (dq1 * dq1) + g_max * dq2)
                + cells.pmf_max[third] * (gqq_max * (dq1 * dq1 * dq1) + gq_max * (3.0 * dq1 * dq2) + g_max * dq3)
            )
            m3 = _row_sum(np.where(mask, terms, 0.0)) * (1.0 + 1e-10)
            r = cells.r[third]
            inside = value * (1.0 + TAIL_SLACK) + slope * r + 0.5 * bend * r * r + m3 * r * r * r / 6.0
            bound = np.nextafter(inside + cells.left[third] * (1.0 + TAIL_SLACK), np.inf)
        result[third] = np.where(np.isfinite(bound), bound, np.inf)  # NaN or infinity proves nothing
    first = rows_all[~(result <= alpha)]
    if first.size:
        (big_f,) = values(first, ck[first], (0,))
        total = _row_sum(np.where(cells.mask[first], cells.pmf_max[first] * big_f, 0.0))
        bound = np.minimum(1.0, (total + cells.left[first]) * (1.0 + TAIL_SLACK))
        result[first] = np.minimum(result[first], bound)
    return result


_FRESH = -(2**62)
_PER_COUNT = frozenset({"k", "mask", "pmf_max", "f_m", "fs_m", "fss_m", "p1", "p2", "p3"})  # fields with a count axis


@dataclass
class Bounder:
    """Cell bounds at one (n, Δ0). With `remember`, every cell's extreme-set-independent parts are kept, and for a
    cell asked about more than once, per (cell, count) the dependent values for a window of _MEMO_WIDTH thresholds:
    a plan asks about many outcomes at the same n and Δ0, whose extreme sets differ by a few thresholds per count.
    Kept values are the very numbers a fresh computation gives, so the bounds do not depend on the history."""

    n: int
    delta0: float
    remember: bool = True
    keys: dict[tuple[float, float], int] = field(default_factory=dict)
    store: _Cells | None = None
    seen: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # requests per slot
    memo_row: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # −1: not kept
    memo: FloatArray = field(default_factory=lambda: np.zeros((_KINDS, 0, 1, _MEMO_WIDTH)))
    memo_c0: IntArray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.int64))
    memo_used: int = 0
    known: dict[tuple[int, float, bytes], float] = field(default_factory=dict)  # cell bounds computed, by
    # (slot, α, the thresholds at the cell's counts)
    parts: CellParts | None = None  # without `remember`: Δ0-independent parts kept across Δ0 (`Test.bounder`)

    def _ensure(self, a1: FloatArray, a2: FloatArray) -> IntArray:
        slots, new = _slots(self.keys, zip(a1.tolist(), a2.tolist(), strict=True), a1.size)
        if new:
            idx = np.array(new)
            self._append(_cells(self.n, a1[idx], a2[idx], self.delta0))
        return slots

    def _append(self, cells: _Cells) -> None:
        """Add cells to the store, growing its rows (and count axis) geometrically (amortised constant cost)."""
        used = len(self.keys) - cells.a1.size
        rows = used + cells.a1.size
        if self.store is None or rows > self.store.a1.size or cells.k.shape[1] > self.store.k.shape[1]:
            old_rows = 0 if self.store is None else self.store.a1.size
            old_width = 0 if self.store is None else self.store.k.shape[1]
            capacity = max(rows, 2 * old_rows, 16)
            wide = old_width if cells.k.shape[1] <= old_width else max(cells.k.shape[1], old_width + old_width // 4)
            # zeros at the new width, the kept rows written in (`_put`), without padded copies first
            grown = _Cells(**{
                name: np.zeros((capacity, wide) if name in _PER_COUNT else (capacity, *value.shape[1:]),
                               dtype=value.dtype)
                for name, value in ((name, getattr(cells, name)) for name in _Cells.__dataclass_fields__)
            })
            if self.store is not None and used:
                _put(grown, 0, _Cells(**{name: getattr(self.store, name)[:used]
                                         for name in _Cells.__dataclass_fields__}))
            self.store = grown
            seen = np.zeros(capacity, dtype=np.int64)
            seen[:used] = self.seen[:used]
            memo_row = np.full(capacity, -1, dtype=np.int64)
            memo_row[:used] = self.memo_row[:used]
            self.seen, self.memo_row = seen, memo_row
            if self.memo_used and wide > self.memo.shape[2]:
                self._grow_memo(self.memo.shape[1], wide)
        _put(self.store, used, cells)

    def _grow_memo(self, rows: int, width: int) -> None:
        # Not filled: a window's values are set to NaN ("not computed") when `_source` places it, so only the
        # windows a plan uses are ever written (filling the whole memo with NaN took a fifth of a plan's proofs,
        # most of it page faults). An unplaced window (memo_c0 _FRESH) is never read as a value.
        memo = np.empty((_KINDS, rows, width, _MEMO_WIDTH))
        c0 = np.full((rows, width), _FRESH, dtype=np.int64)
        memo[:, : self.memo_used, : self.memo.shape[2]] = self.memo[:, : self.memo_used]
        c0[: self.memo_used, : self.memo_c0.shape[1]] = self.memo_c0[: self.memo_used]
        self.memo, self.memo_c0 = memo, c0

    def _keep(self, slots: IntArray) -> None:
        """Give memo rows to slots asked about more than once, in this batch or before (a cell asked once, like
        the top cell of one outcome's domain, is computed afresh and not kept)."""
        assert self.store is not None
        unique, times = np.unique(slots, return_counts=True)
        self.seen[unique] += times
        wanted = unique[(self.seen[unique] >= 2) & (self.memo_row[unique] < 0)]
        if wanted.size == 0:
            return
        need = self.memo_used + wanted.size
        if need > self.memo.shape[1] or self.memo.shape[2] < self.store.k.shape[1]:
            self._grow_memo(max(need, 2 * self.memo.shape[1], 256), self.store.k.shape[1])
        self.memo_row[wanted] = np.arange(self.memo_used, need)
        self.memo_used = need

    def bounds(
        self, c: IntArray, a1: FloatArray, a2: FloatArray, alpha: float, owner: IntArray | None = None
    ) -> FloatArray:
        """Upper bounds on the extreme set's probability over the boundary points with π in each [a1, a2].

        c: the thresholds c_k of one extreme set (1-D), or of several (2-D, one row each, padded) with `owner`
        naming the row of each cell."""
        if a1.size == 0:
            return np.zeros(0)
        if a1.size > _BATCH_CELLS:
            # in slices, each cell's bound the same number (see `_row_sum`): the temporaries of thousands of cells
            # at once are tens of MB each, and allocating them afresh (page faults) cost as much as the arithmetic
            return np.concatenate([
                self.bounds(c, a1[i : i + _BATCH_CELLS], a2[i : i + _BATCH_CELLS], alpha,
                            None if owner is None else owner[i : i + _BATCH_CELLS])
                for i in range(0, a1.size, _BATCH_CELLS)
            ])
        if not self.remember:
            cells = _cells(self.n, a1, a2, self.delta0, self.parts)
            return _bounds(cells, _thresholds(c, cells.k, owner), alpha, _direct(cells))
        slots = self._ensure(a1, a2)
        self._keep(slots)
        assert self.store is not None
        # A cell's bound is a function of the cell, α and the thresholds at the counts it sums (`_bounds`: the same
        # number in any batch), so one asked about again with the same thresholds is read, not computed: a third
        # of a plan's cell bounds are such repeats (the same cell, an outcome whose extreme set there is the same).
        summed = np.sum(self.store.mask[slots], axis=1)  # each cell's counts are a prefix of its row
        ck = _thresholds(c, self.store.k[slots, : int(np.max(summed))], owner)
        result = np.empty(a1.size)
        todo: dict[tuple[int, float, bytes], list[int]] = {}
        for i, (slot, used) in enumerate(zip(slots.tolist(), summed.tolist(), strict=True)):
            key = (slot, alpha, ck[i, :used].tobytes())
            known = self.known.get(key)
            if known is None:
                todo.setdefault(key, []).append(i)
            else:
                result[i] = known
        if todo:
            rows = np.array([where[0] for where in todo.values()])
            cells = _rows_used(self.store, slots[rows])
            fresh = _bounds(cells, ck[rows, : cells.k.shape[1]], alpha, self._source(self.memo_row[slots[rows]], cells))
            for (key, where), value in zip(todo.items(), fresh.tolist(), strict=True):
                self.known[key] = value
                result[where] = value
        return result

    def _source(self, places: IntArray, cells: _Cells) -> _ValueSource:
        fresh_source = _direct(cells)

        def values(rows: IntArray, ck: IntArray, kinds: tuple[int, ...]) -> list[FloatArray]:
            kept = places[rows] >= 0
            if not kept.any():
                return fresh_source(rows, ck, kinds)
            every = bool(kept.all())
            out = [] if every else [np.zeros(ck.shape) for _ in kinds]
            if not every:
                for i, value in enumerate(fresh_source(rows[~kept], ck[~kept], kinds)):
                    out[i][~kept] = value
            r_kept = rows if every else rows[kept]
            ck_kept = ck if every else ck[kept]
            s = places[r_kept]
            used = ck.shape[1]  # the batch may be narrower than the memo
            c0 = self.memo_c0[s, :used]
            if np.any(c0 == _FRESH):
                # one window per (cell, count), placed by the first row that meets it (a cell may recur in a batch)
                unique, first = np.unique(s, return_index=True)
                known = self.memo_c0[unique, :used]
                fresh = known == _FRESH
                self.memo_c0[unique, :used] = np.where(fresh, ck_kept[first] - _MEMO_WIDTH // 2, known)
                rr, cc = np.nonzero(fresh)
                self.memo[:, unique[rr], cc] = np.nan  # the new windows: nothing computed yet
                c0 = self.memo_c0[s, :used]
            col = ck_kept - c0
            inside = (col >= 0) & (col < _MEMO_WIDTH)
            position = s[:, None] * self.memo.shape[2] + np.arange(used)[None, :]
            np.clip(col, 0, _MEMO_WIDTH - 1, out=col)
            flat = position * _MEMO_WIDTH + col
            mask = cells.mask[r_kept]
            # A summed count outside its window is computed and not kept; one inside reads the memo (NaN: not yet
            # computed, then computed once and kept). What is read where a count is not summed is never used (the
            # memo is not filled beforehand: it may be anything there).
            kept_here = mask & inside
            loose_rows, loose_cols = np.nonzero(mask & ~inside)
            distinct = np.unique(s).size == s.size  # each (cell, count, threshold) at one place of the batch
            for i, kind in enumerate(kinds):
                table = self.memo[kind].reshape(-1)
                got = table[flat]
                stored = np.isnan(got)
                stored &= kept_here
                if stored.any():
                    # each (cell, count, threshold) once, however many outcomes share it; stored, then read back
                    if distinct:
                        spots = flat[stored]
                        rr, cc = np.nonzero(stored)
                    else:
                        spots, first = np.unique(flat[stored], return_index=True)
                        rr, cc = np.nonzero(stored)
                        rr, cc = rr[first], cc[first]
                    table[spots] = _values_at(cells, r_kept[rr], cc, ck_kept[rr, cc], kind)
                    got[stored] = table[flat[stored]]
                if loose_rows.size:
                    got[loose_rows, loose_cols] = _values_at(
                        cells, r_kept[loose_rows], loose_cols, ck_kept[loose_rows, loose_cols], kind
                    )
                result = np.where(mask, got, 0.0)
                if every:
                    out.append(result)
                else:
                    out[i][kept] = result
            return out

        return values


def _thresholds(c: IntArray, k: IntArray, owner: IntArray | None) -> IntArray:
    """c_k for each cell's counts k (M, W): from one threshold vector, or from the rows of several by owner."""
    if c.ndim == 1:
        return c[k]
    assert owner is not None
    result: IntArray = c[owner[:, None], k]
    return result


def _put(into: _Cells, start: int, cells: _Cells) -> None:
    """Write `cells` into the rows of `into` from `start`, in place, their count axis padded to `into`'s width as the
    store keeps it: the last count repeated, the mask and every other per-count value zero (masked out)."""
    rows = slice(start, start + cells.a1.size)
    width = cells.k.shape[1]
    for name in _Cells.__dataclass_fields__:
        value, target = getattr(cells, name), getattr(into, name)
        if name in _PER_COUNT:
            target[rows, :width] = value
            target[rows, width:] = value[:, -1:] if name == "k" else 0
        else:
            target[rows] = value


def _rows_used(cells: _Cells, rows: IntArray) -> _Cells:
    """The cells at `rows`, with only the count columns those rows use (each row's counts are a prefix): the store is
    as wide as its widest cell, and copying whole rows to drop most of their columns cost a third of a plan's proofs."""
    mask = cells.mask[rows]
    width = int(np.max(np.sum(mask, axis=1)))
    fields = {}
    for name in _Cells.__dataclass_fields__:
        value = getattr(cells, name)
        fields[name] = value[rows, :width] if name in _PER_COUNT else value[rows]
    fields["mask"] = mask[:, :width]
    return _Cells(**fields)


# --- the test and its inversion --------------------------------------------------------------------------------------


def edges(n: int) -> FloatArray:
    """The fixed cell edges of the nuisance axis for n units: uniform in sqrt(π) over [0, 1], each cell about one
    standard deviation of k/n wide (2·sqrt(n) cells)."""
    cells = max(4, math.ceil(2.0 * math.sqrt(n) / _CELL_SDS))
    e: FloatArray = (np.arange(cells + 1) / cells) ** 2
    e[-1] = 1.0
    return e


@dataclass
class Test:
    """The test of one observed outcome at one level: its extreme set (thresholds c_k), U_π and α."""

    n: int
    c: IntArray
    pi_upper: float
    alpha: float
    bounders: dict[float, Bounder] = field(default_factory=dict)
    parts: CellParts | None = None  # the cells' Δ0-independent parts, shared by this outcome's proofs

    def bounder(self, delta0: float) -> Bounder:
        """The cell bounds at Δ0: fresh computation (of the Δ0-dependent parts, see `CellParts`) unless a plan
        supplied a remembering one."""
        if delta0 not in self.bounders:
            if self.parts is None:
                self.parts = CellParts(self.n)
            self.bounders[delta0] = Bounder(self.n, delta0, remember=False, parts=self.parts)
        return self.bounders[delta0]

    def domain(self, delta0: float) -> tuple[float, float]:
        """π range of H0(Δ0) ∩ {π ≤ U_π}: π ≥ Δ0 is needed for Δ ≥ Δ0 > 0; empty when lo > hi."""
        return max(0.0, delta0), self.pi_upper

    def proves(self, delta0: float) -> bool:
        """Whether H0: Δ ≥ Δ0 is rejected at level α + γ, proven (see `prove_many`)."""
        return bool(prove_many(self.bounder(delta0), self.c[None, :], np.array([self.pi_upper]), self.alpha)[0])


def fixed_cells(n: int, lo: float, hi: float) -> tuple[FloatArray, FloatArray]:
    """The fixed cells of `edges(n)` meeting [lo, hi] (unclipped)."""
    e = edges(n)
    first = max(0, int(np.searchsorted(e, lo, side="right")) - 1)
    last = min(e.size - 1, int(np.searchsorted(e, hi, side="left")))
    last = max(last, first + 1)
    return e[first:last].copy(), e[first + 1 : last + 1].copy()


def prove_many(bounder: Bounder, c: IntArray, uppers: FloatArray, alpha: float) -> npt.NDArray[np.bool_]:
    """For extreme sets c (rows of thresholds) with nuisance limits `uppers`, whether each test provably rejects
    H0: Δ ≥ Δ0 (Δ0 = bounder.delta0) at level α + γ: a branch-and-bound bounds every cell of the domain
    [max(0, Δ0), U_π] by α.

    The cells are the fixed cells of `edges(n)` and their four-way splits, always split before clipping to the
    domain: a larger Δ0, a smaller U_π or a smaller extreme set only lowers every bound on the same cells, so the
    answer is monotone in all three (up to rounding ties). A point above α refutes (the middle and the upper end of
    each outcome's worst open cell are tried at every level); more than 512 open cells or
    one narrower than 2^-46 abandon the proof (the safe answer). The outcomes are decided together, each exactly
    as it would be alone (every cell's bound is the same number in any batch).
    """
    n, delta0 = bounder.n, bounder.delta0
    lo = max(0.0, delta0)
    count = uppers.size
    result = lo > uppers  # an empty domain: H0 ∩ {π ≤ U_π} holds no point
    live = np.flatnonzero(~result)
    if live.size == 0:
        return result
    owners, u1s, u2s = [], [], []
    for q in live.tolist():
        u1, u2 = fixed_cells(n, lo, float(uppers[q]))
        u1s.append(u1)
        u2s.append(u2)
        owners.append(np.full(u1.size, q))
    cell_owner = np.concatenate(owners)
    u1, u2 = np.concatenate(u1s), np.concatenate(u2s)
    undecided = np.zeros(count, dtype=bool)
    undecided[live] = True
    # the top of the domain first, where the supremum usually is: a tail above α there ends the proof at once
    tops = uppers[live]
    undecided[live[bounder.bounds(c, tops, tops, alpha, live) > alpha]] = False
    keep = undecided[cell_owner]
    cell_owner, u1, u2 = cell_owner[keep], u1[keep], u2[keep]
    bounds = bounder.bounds(c, np.maximum(u1, lo), np.minimum(u2, uppers[cell_owner]), alpha, cell_owner)
    while undecided.any():
        bounds = np.where(np.isnan(bounds), np.inf, bounds)  # a NaN bound proves nothing
        open_ = ~(bounds <= alpha)
        open_count = np.bincount(cell_owner[open_], minlength=count)
        proven = undecided & (open_count == 0)
        result[proven] = True
        undecided &= ~proven
        cell_owner, u1, u2, bounds = cell_owner[open_], u1[open_], u2[open_], bounds[open_]
        keep = undecided[cell_owner]
        cell_owner, u1, u2, bounds = cell_owner[keep], u1[keep], u2[keep], bounds[keep]
        if not undecided.any():
            break
        a1, a2 = np.maximum(u1, lo), np.minimum(u2, uppers[cell_owner])
        narrow = np.zeros(count, dtype=bool)
        np.logical_or.at(narrow, cell_owner, a2 - a1 <= _MIN_CELL)
        abandon = undecided & ((np.bincount(cell_owner, minlength=count) > _MAX_OPEN_CELLS) | narrow)
        undecided &= ~abandon
        # refute early when the supremum is not near a fixed point: each outcome's worst cell's upper end
        order = np.lexsort((-bounds, cell_owner))  # by owner, worst first (stable: the first of equals)
        heads = order[np.r_[True, cell_owner[order][1:] != cell_owner[order][:-1]]]
        heads = heads[undecided[cell_owner[heads]]]
        if heads.size:
            # the worst cell's middle and upper end: a refutation ends a proof that cells can never close
            at = np.concatenate([0.5 * (a1[heads] + a2[heads]), a2[heads]])
            whose = np.concatenate([cell_owner[heads], cell_owner[heads]])
            refute = whose[bounder.bounds(c, at, at, alpha, whose) > alpha]
            undecided[refute] = False
        keep = undecided[cell_owner]
        cell_owner, u1, u2 = cell_owner[keep], u1[keep], u2[keep]
        if cell_owner.size == 0:
            break
        width = u2 - u1
        child1 = np.concatenate([u1 + width * (j / _SPLIT) for j in range(_SPLIT)])
        child2 = np.concatenate([u1 + width * ((j + 1) / _SPLIT) if j + 1 < _SPLIT else u2 for j in range(_SPLIT)])
        child_owner = np.tile(cell_owner, _SPLIT)
        part = np.repeat(np.arange(_SPLIT), cell_owner.size)
        index = np.tile(np.arange(cell_owner.size), _SPLIT)
        arrange = np.lexsort((index, part, child_owner))  # per outcome: as a lone branch-and-bound orders them
        u1, u2, cell_owner = child1[arrange], child2[arrange], child_owner[arrange]
        meets = (u2 >= lo) & (u1 <= uppers[cell_owner])  # children wholly outside the domain hold none of it
        u1, u2, cell_owner = u1[meets], u2[meets], cell_owner[meets]
        bounds = bounder.bounds(c, np.maximum(u1, lo), np.minimum(u2, uppers[cell_owner]), alpha, cell_owner)
    return result


def grid_bits(n: int) -> int:
    """Limits lie on the grid 2^-bits of [-1, 1], bits = 17 + ⌊bit_length(n − 1)/2⌋ (about 1e-5/sqrt(n)): far below
    anything a decision can notice, yet coarse enough that a proof at a grid point keeps a margin a few cells show."""
    return 17 + (max(1, n) - 1).bit_length() // 2


def grid_point(j: int, bits: int) -> float:
    """The j-th point −1 + j·2^-bits of the limit grid (exact)."""
    return -1.0 + j * 2.0**-bits


def grid_floor(x: float, bits: int) -> int:
    """The index of the largest grid point ≤ x (x in [-1, 1])."""
    top = 2 << bits
    j = math.floor((x + 1.0) * 2.0**bits)
    while j > 0 and grid_point(j, bits) > x:
        j -= 1
    return max(0, min(top, j))


def make_test(worse: int, better: int, n: int, delta: float, ordering: Ordering | None = None) -> Test:
    """The test of one observed outcome (worse, better) among n at level δ."""
    gamma = GAMMA_FRACTION * delta
    pi_upper = clopper_pearson_upper(worse + better, n, gamma)
    order = ordering if ordering is not None else Ordering(n, order_z(delta))
    t_obs = order.statistic(worse, better)
    _, k_hi = k_ranges(n, np.array([pi_upper]), np.array([pi_upper]))
    return Test(n, order.thresholds(t_obs, int(k_hi[0])), pi_upper, delta - gamma)


def _estimate(test: Test, bits: int) -> int:
    """A grid index near the limit: where the largest tail over 65 points of the nuisance range (uniform in
    sqrt(π)) and its lower end falls to α. Only a starting point for the search on the proof itself; it proves
    nothing."""
    n, top = test.n, 2 << bits
    grid = test.pi_upper * (np.arange(65) / 64.0) ** 2
    k = np.arange(min(n, test.c.size - 1) + 1)
    ck = test.c[k][None, :]
    grid_pmf = _binom.pmf(k[None, :], n, grid[:, None])

    def exceeds(j: int) -> bool:
        delta0 = grid_point(j, bits)
        lo = max(0.0, delta0)
        if lo > test.pi_upper:
            return False
        inside = grid >= lo
        points = np.concatenate([[lo], grid[inside]])  # the domain's lower end too: the supremum may sit there
        pmf = np.concatenate([_binom.pmf(k[None, :], n, lo), grid_pmf[inside]])
        tails = np.sum(pmf * _cdf(ck, k[None, :], _q_of(points, delta0)[:, None]), axis=1)
        return bool(np.max(tails) > test.alpha)

    lo, hi = -1, top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if exceeds(mid):
            lo = mid
        else:
            hi = mid
    return hi


def upper_limit(worse: int, better: int, n: int, delta: float, ordering: Ordering | None = None) -> float:
    """One-sided (1 − δ) upper confidence limit on p_worse − p_better: the smallest grid point the test proves.

    From an estimate of where the supremum falls to α, a galloping search on the proof itself brackets the first
    proven grid point (up from the estimate when it is not proven, down when it is), then bisection finds it: the
    result is min{g : proves(g)} whenever the proof is monotone in Δ0 (it is, up to rounding ties), and a proven
    point always (1 when nothing below it is proven).
    """
    if ordering is None:
        return _upper_limit_kept(worse, better, n, delta)
    return _upper_limit(worse, better, n, delta, ordering)


@functools.lru_cache(maxsize=1 << 14)
def _upper_limit_kept(worse: int, better: int, n: int, delta: float) -> float:
    """`upper_limit` with the default ordering, kept per outcome: a bound's lower limit is the upper limit of the
    mirrored outcome, so a set of outcomes closed under mirroring (a simulation, an enumeration, a plan) asks for
    each one twice. A limit is a pure function of its arguments, so a kept one is the number a fresh proof gives."""
    return _upper_limit(worse, better, n, delta, None)


def _upper_limit(worse: int, better: int, n: int, delta: float, ordering: Ordering | None) -> float:
    test = make_test(worse, better, n, delta, ordering)
    bits = grid_bits(n)
    top = 2 << bits  # the index of 1.0

    def proven(j: int) -> bool:
        return j >= top or test.proves(grid_point(j, bits))

    start = min(top, _estimate(test, bits))
    step = 1
    if proven(start):
        hi, lo = start, start - 1
        while lo >= 0 and proven(lo):
            hi, lo = lo, max(-1, start - 2 * step)
            step *= 2
    else:
        lo, hi = start, start + 1
        while not proven(hi):
            lo, hi = hi, min(top, start + 2 * step)
            step *= 2
    while hi - lo > 1:  # lo is not proven (or is −1), hi is
        mid = (lo + hi) // 2
        if proven(mid):
            hi = mid
        else:
            lo = mid
    return grid_point(hi, bits)


def admits(
    worse: int, better: int, n: int, delta: float, epsilon: float, ordering: Ordering | None = None,
    bounder: Bounder | None = None,
) -> bool:
    """Whether `upper_limit(worse, better, n, delta) ≤ ε`, decided by one proof at the largest grid point ≤ ε
    (equivalent whenever the proof is monotone in Δ0, which the tests check on the outcomes they plan).

    `bounder` (for that n and grid point) lets a plan share cell computations across outcomes.
    """
    if epsilon >= 1.0:
        return True
    if epsilon < -1.0:
        return False
    bits = grid_bits(n)
    delta0 = grid_point(grid_floor(epsilon, bits), bits)
    test = make_test(worse, better, n, delta, ordering)
    if bounder is not None:
        test.bounders[delta0] = bounder
    return test.proves(delta0)
