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
  which implies the reported upper limit is ≤ ε (see `invar.stats.trinomial`). A proof first checks the tail at
  one anchor point, which is cheap and monotone in W − B: n is searched on that anchor power (an upper bound,
  equal to the power where every proof at the anchor threshold succeeds), and the exact power is computed at the
  n found and at n − 1 only (see `_ExactPlanner`).
* trinomial, paired-binary-score: exact in the same way; a count succeeds when the proof at the largest grid point
  ≤ ε succeeds, which is exactly when the reported upper limit is ≤ ε (the proof is monotone; see
  `invar.stats.score`). A failure at a discordant count k also settles every outcome at larger k with an extreme
  set at least as large (the proof's domain only grows with k), so most counts need one proof. n is searched on
  the power where a count succeeds when the extreme set's tail at both ends of the nuisance domain is ≤ α (what a
  proof checks first), and the exact power is computed at the n found and at n − 1 only.
* trinomial, betting: the bound depends on the order of the units, so power is simulated: n is searched on runs
  with common random numbers (smooth in n; to 0.5 % of n, below the simulation's own resolution), checked on
  independent runs (n grows by 1 % until the independent estimate reaches the target), and the power reported is a
  third, fresh independent estimate with its standard error, so no selection inflates it. The plans of common
  inputs are read from a generated table of these simulations' results (`invar.stats.betting_plans`), the same
  numbers.
* variance assumption (general [a, b], Hoeffding and Maurer–Pontil only): a lower bound on power from the
  Berry–Esseen inequality for the mean (C = 0.4748, E|X − μ|³ ≤ (b − a)σ²) and, for Maurer–Pontil, a Bernstein
  upper bound on the sample variance that fails with probability β = (1 − power)/20, charged to the power.

The search is a secant on probit(power) against sqrt(n) (nearly linear), kept inside a bracket, so a plan needs a
handful of power evaluations; power is taken as non-decreasing in n, which holds up to the small ripples of
discrete distributions (the reported n reaches the target, n − 1 does not: for the two exact methods both are
exact computations; where the cheap power the search ran on disagrees there, the search runs again on the exact
power alone). Several methods, the two exact evaluations and the betting simulation's blocks of runs are
independent pieces, handed to `invar.parallel.map_calls`: in this process, or one forked process per core when
the caller asks for it (`invar use plan` does); the numbers do not depend on it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import NormalDist
from typing import TypeVar, cast

import numpy as np

from invar.parallel import cores, map_calls
from invar.stats import _binom, bounds, score, trinomial
from invar.stats.bounds import METHODS, VERSIONS, StatisticsError
from invar.stats.rows import PlanRow as PlanRow  # one method's row: the model `use plan --json` prints

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
_CHUNK = 256  # simulated runs per random draw (part of the random stream: changing it changes the runs)
_BLOCK = 64  # runs per vectorised block (fits the caches)

_NORMAL = NormalDist()
T = TypeVar("T")


@dataclass(frozen=True)
class Assumed:
    """What a plan assumes of the paired differences d (candidate loss − reference loss): 0/1 losses with
    P(worse) = p_worse and P(better) = p_better (d ∈ {-1, 0, 1}); or, with both None, d in [a, b] with the given mean
    and variance (Hoeffding and Maurer–Pontil only). Checked when a plan uses it (`StatisticsError`)."""

    p_worse: float | None = None
    p_better: float | None = None
    variance: float | None = None
    mean: float = 0.0
    a: float = -1.0
    b: float = 1.0


@dataclass(frozen=True)
class Search:
    """How far a plan searches and how it simulates: the largest n it tries, and the Monte Carlo runs and seed of the
    betting simulation (the other methods' power is computed, not simulated)."""

    n_max: int = 10_000_000
    reps: int = 2000
    seed: int = 0


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
    lo = int(_binom.ppf(cut / 2, n, p))
    hi = int(_binom.ppf(1.0 - cut / 2, n, p))
    return max(0, lo), min(n, hi)


def _discordance(assumption: _Assumption) -> tuple[float, float]:
    """(π, q): probability a unit is discordant, and of "worse" given discordant."""
    pw, pb = float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0)
    pi = pw + pb
    return pi, (pw / pi if pi > 0.0 else 0.5)


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
    within = _binom.cdf(np.floor((lo + k) / 2.0), k, q)
    return min(1.0, float(np.sum(_binom.pmf(k, n, pi) * within)))


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
    weight = _binom.pmf(k_all[ok], n, pi) * _binom.pmf(w_all[ok], k_all[ok], q)
    return min(1.0, float(np.sum(weight)))


def _count_ranges(ns: np.ndarray, p: float, cut: float = TAIL_CUT) -> tuple[np.ndarray, np.ndarray]:
    """`_count_range` for many n at once (the same numbers: scipy's quantile is elementwise)."""
    if p <= 0.0:
        return np.zeros_like(ns), np.zeros_like(ns)
    if p >= 1.0:
        return ns.copy(), ns.copy()
    lo = _binom.ppf(cut / 2, ns, p).astype(np.int64)
    hi = _binom.ppf(1.0 - cut / 2, ns, p).astype(np.int64)
    return np.maximum(0, lo), np.minimum(ns, hi)


def _clopper_pearson_uppers(ks: np.ndarray, n: int, gamma: float) -> list[float]:
    """`trinomial.clopper_pearson_upper(k, n, gamma)` for many k at once: the same numbers (scipy's quantile is
    elementwise; the same enlargement after it)."""
    limits = _binom.beta_isf(gamma, ks + 1, np.maximum(n - ks, 1)).tolist()
    return [
        1.0 if k >= n else min(1.0, math.nextafter(float(limit) * (1.0 + 1e-12), math.inf))
        for k, limit in zip(ks.tolist(), limits, strict=True)
    ]


@dataclass
class _ExactPlanner:
    """Exact power of paired-binary-exact, and its plan in two exact evaluations where possible.

    Per discordant count k the successes are w ≤ w*_k (the test's p-value grows with W − B). A proof fails at
    once ("refuted") when the tail at the anchor point exceeds α (`trinomial.proof_status` checks it first), and
    that tail is one binomial sum, monotone in w: its threshold a_k ≥ w*_k costs about two tail evaluations per
    count, where a proof costs many. The anchor power (w ≤ a_k) is therefore an upper bound on the power, equal
    to it wherever every proof at a_k succeeds (all counts, at the n of a plan). The plan searches n on the
    anchor power, then evaluates the exact power at the n found and at n − 1 (proofs from a_k downwards only);
    if the two do not bracket the target, it searches again on the exact power alone.
    """

    assumption: _Assumption
    epsilon: float
    delta: float
    anchors: dict[int, dict[int, int]] = field(default_factory=dict)  # per n: a_k per count
    exact: dict[int, float] = field(default_factory=dict)  # the n whose exact power was computed
    counts: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]] = field(default_factory=dict)

    def _counts(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
        """Per n: the counts k in range, each one's worse counts in range, and U_π at k."""
        if n not in self.counts:
            self.counts[n] = self._count_table(n)
        return self.counts[n]

    def _count_table(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
        pi, q = _discordance(self.assumption)
        k_lo, k_hi = _count_range(n, pi)
        ks = np.arange(k_lo, k_hi + 1)
        w_lo, w_hi = _count_ranges(ks, q)
        gamma = trinomial.GAMMA_FRACTION * self.delta
        return ks, w_lo, w_hi, _clopper_pearson_uppers(ks, n, gamma)

    def _sum(self, n: int, ks: np.ndarray, w_lo: np.ndarray, w_hi: np.ndarray, top: list[int]) -> float:
        """Σ P(D = k)·P(W ≤ top_k | k) over the counts and worse counts in range (added in increasing k)."""
        pi, q = _discordance(self.assumption)
        # every pmf in two vectorised calls (scipy's pmf is elementwise: the numbers of one call per k)
        bounds_w = zip(w_lo.tolist(), w_hi.tolist(), top, strict=True)
        summed = [(i, lo, min(hi, last)) for i, (lo, hi, last) in enumerate(bounds_w) if min(hi, last) >= lo]
        if not summed:
            return 0.0
        lengths = np.array([end - lo + 1 for _, lo, end in summed])
        w = np.concatenate([np.arange(lo, end + 1) for _, lo, end in summed])
        of_k = np.repeat(ks[[i for i, _, _ in summed]], lengths)
        inner = _binom.pmf(w, of_k, q)
        outer = _binom.pmf(ks, n, pi).tolist()
        total, at = 0.0, 0
        for (i, _, _), length in zip(summed, lengths.tolist(), strict=True):
            total += float(outer[i]) * float(np.sum(inner[at : at + length].copy()))
            at += length
        return min(1.0, total)

    def _anchor_thresholds(self, n: int) -> list[int]:
        """a_k per count: the largest w in range whose anchor tail is ≤ α (w_lo − 1 when none). With thresholds
        of a nearby n, each count's guess and the next w are tried first, all counts with the same W − B in one
        tail evaluation; the rest gallop from the previous count's threshold."""
        ks, w_lo, w_hi, uppers = self._counts(n)
        alpha = self.delta - trinomial.GAMMA_FRACTION * self.delta
        delta0 = self.epsilon - DECISION_MARGIN
        near = self.anchors[min(self.anchors, key=lambda m: abs(m - n))] if self.anchors else {}
        known: dict[tuple[int, int], bool] = {}  # (k, w) -> anchor tail ≤ α
        if near and delta0 > -1.0:
            probes = [
                (k, w)
                for k, lo, hi in zip(ks.tolist(), w_lo.tolist(), w_hi.tolist(), strict=True)
                for w in (near.get(k, (lo + hi) // 2), near.get(k, (lo + hi) // 2) + 1)
                if lo <= w <= hi
            ]
            upper_of = dict(zip(ks.tolist(), uppers, strict=True))
            known = _anchor_passes(probes, n, delta0, alpha, upper_of)
        result: list[int] = []
        for k, lo, hi, upper in zip(ks.tolist(), w_lo.tolist(), w_hi.tolist(), uppers, strict=True):

            def passes(w: int, k: int = k, upper: float = upper) -> bool:
                if (k, w) in known:
                    return known[(k, w)]
                return delta0 > -1.0 and not trinomial.anchor_above(delta0, 2 * w - k, n, upper, alpha)

            if k in near:
                guess = near[k]
            elif result:
                guess = result[-1] + (k % 2)  # t = 2w − k stays put: w grows by half a unit per count
            else:
                guess = (lo + hi) // 2
            result.append(_threshold(passes, lo - 1, hi + 1, min(hi, max(lo, guess))))
        self.anchors[n] = dict(zip(ks.tolist(), result, strict=True))
        return result

    def anchor_power(self, n: int) -> float:
        ks, w_lo, w_hi, _ = self._counts(n)
        return self._sum(n, ks, w_lo, w_hi, self._anchor_thresholds(n))

    def power(self, n: int) -> float:
        """The exact power: per count, proofs from a_k downwards until one succeeds. A refutation at W − B = t (a
        point of H0 with a tail above α) refutes every t' ≥ t at every later count without another proof."""
        if n in self.exact:
            return self.exact[n]
        ks, w_lo, w_hi, uppers = self._counts(n)
        anchors = self.anchors.get(n) or dict(zip(ks.tolist(), self._anchor_thresholds(n), strict=True))
        gamma = trinomial.GAMMA_FRACTION * self.delta
        alpha = self.delta - gamma
        delta0 = self.epsilon - DECISION_MARGIN
        refuted = math.inf  # the smallest W − B refuted so far
        top: list[int] = []
        first = [(2 * min(hi, max(lo, anchors[k])) - k, upper)
                 for k, lo, hi, upper in zip(ks.tolist(), w_lo.tolist(), w_hi.tolist(), uppers, strict=True)]
        known = _proof_statuses(delta0, n, alpha, first)
        for k, lo, hi, upper in zip(ks.tolist(), w_lo.tolist(), w_hi.tolist(), uppers, strict=True):

            def proven(w: int, k: int = k, upper: float = upper) -> bool:
                nonlocal refuted
                t = 2 * w - k
                if t >= refuted:
                    return False
                status = known.get((t, upper)) or trinomial.proof_status(delta0, t, n, upper, alpha, fast=True)
                if status == "refuted":
                    refuted = t
                return status == "proven"

            # a_k + 1 is refuted by its anchor tail; asked all the same, so the result never rests on a_k
            w = min(hi, max(lo, anchors[k]))
            if proven(w):
                while w < hi and proven(w + 1):
                    w += 1
            else:
                w -= 1
                while w >= lo and not proven(w):
                    w -= 1
            top.append(w)
        self.exact[n] = self._sum(n, ks, w_lo, w_hi, top)
        return self.exact[n]

    def below(self, n: int, target: float) -> bool:
        """Whether the exact power at n is below the target, shown without its proofs (False: not shown).

        `power` scans each count from w = a_k (clipped to the range) and climbs only through proven w + 1; a proof
        at a_k + 1 is refuted at once when its anchor tail exceeds α (`trinomial.proof_status` checks that first,
        with this very number). Where that holds for every count, the exact power is at most the sum up to a_k,
        so a sum below the target (with room for the last bits of the summation) settles it: one tail per count
        instead of one proof or more."""
        ks, w_lo, w_hi, uppers = self._counts(n)
        anchors = self.anchors.get(n) or dict(zip(ks.tolist(), self._anchor_thresholds(n), strict=True))
        alpha = self.delta - trinomial.GAMMA_FRACTION * self.delta
        delta0 = self.epsilon - DECISION_MARGIN
        tops = []
        for k, lo, hi, upper in zip(ks.tolist(), w_lo.tolist(), w_hi.tolist(), uppers, strict=True):
            top = min(hi, max(lo, anchors[k]))
            if top < hi and delta0 > -1.0 and not trinomial.anchor_above(delta0, 2 * (top + 1) - k, n, upper, alpha):
                return False  # a proof above a_k might succeed: only the proofs can tell
            tops.append(top)
        return self._sum(n, ks, w_lo, w_hi, tops) < target - 1e-12

    def plan(self, target: float, n_min: int, n_max: int, start: int) -> tuple[int, float]:
        n, _ = _search(_twice(self.anchor_power), target, n_min, n_max, start)
        if _verified(self.power, self.exact, n, n_min, target, self.below):
            return n, self.exact[n]
        return _search(_twice(self.power), target, n_min, n_max, start)


def _verified(
    power: Callable[[int], float], exact: dict[int, float], n: int, n_min: int, target: float,
    below: Callable[[int, float], bool] | None = None,
) -> bool:
    """Whether the exact power reaches the target at n and not at n − 1 (both computed, in parallel; kept in
    `exact`). `below(m, target)`, where given, may show that the exact power at n − 1 is below the target without
    computing it (an upper bound below the target); then only n's is computed."""
    shown_below = n > n_min and n - 1 not in exact and below is not None and below(n - 1, target)
    wanted = [m for m in (n, n - 1) if m >= n_min and m not in exact and not (m == n - 1 and shown_below)]
    exact.update(zip(wanted, map_calls([partial(power, m) for m in wanted]), strict=True))
    return exact[n] >= target and (n == n_min or shown_below or exact[n - 1] < target)


def _proof_statuses(
    delta0: float, n: int, alpha: float, cases: list[tuple[int, float]]
) -> dict[tuple[int, float], str]:
    """`trinomial.proof_status` of each (W − B, U_π) at n, the cases split over the cores (`map_calls`): the proofs
    the exact power's scan makes first, one per count, computed ahead of it (each status is a pure function of its
    arguments, so the scan reads the very statuses it would compute; a case its shortcuts skip costs time only)."""
    unique = list(dict.fromkeys(cases))
    shares = [unique[i :: cores()] for i in range(min(len(unique), cores()))]
    results = map_calls([partial(_statuses_of, delta0, n, alpha, share) for share in shares])
    return {case: status for share, got in zip(shares, results, strict=True)
            for case, status in zip(share, got, strict=True)}


def _statuses_of(delta0: float, n: int, alpha: float, cases: list[tuple[int, float]]) -> list[str]:
    return [trinomial.proof_status(delta0, t, n, upper, alpha, fast=True) for t, upper in cases]


def _anchor_passes(
    probes: list[tuple[int, int]], n: int, delta0: float, alpha: float, upper_of: dict[int, float]
) -> dict[tuple[int, int], bool]:
    """Whether the anchor tail (as `trinomial.anchor_tail`) of each (k, w) is ≤ α, the probes with the same
    W − B in one tail evaluation. A steer for the search only: the sum's range spans the batch, so the last bits
    may differ from a lone evaluation, and every count's result is settled by proofs."""
    by_t: dict[int, list[tuple[int, int]]] = {}
    for k, w in probes:
        by_t.setdefault(2 * w - k, []).append((k, w))
    result: dict[tuple[int, int], bool] = {}
    for t, group in by_t.items():
        points, zero = [], []
        for k, w in group:
            upper = upper_of[k]
            lo, hi = trinomial._segment(delta0, upper)
            if hi >= lo:
                points.append(((k, w), max(lo, min((upper - delta0) * 0.5, (1.0 - delta0) * 0.5)), False))
            elif delta0 < 0.0:
                points.append(((k, w), min(-delta0, upper), True))
            else:
                zero.append((k, w))
        for key in zero:
            result[key] = True
        if points:
            at = np.array([p for _, p, edge in points if not edge])
            pi, q = trinomial._point_params(at, delta0) if at.size else (np.zeros(0), np.zeros(0))
            edge_pi = np.array([p for _, p, edge in points if edge])
            pi = np.concatenate([pi, edge_pi])
            q = np.concatenate([q, np.zeros(edge_pi.size)])
            keys = [key for key, _, edge in points if not edge] + [key for key, _, edge in points if edge]
            above, _ = trinomial.tails_above(t, n, pi, q, alpha)
            for key, exceeds in zip(keys, above.tolist(), strict=True):
                result[key] = not exceeds
    return result


def _threshold(passes: Callable[[int], bool], lo: int, hi: int, guess: int) -> int:
    """The largest w in (lo, hi) with passes(w), lo when none, for a property that holds up to a threshold; lo and
    hi are known ends (lo passes or is below the range, hi fails or is above it). Gallops from guess, then bisects."""
    step = 1
    if passes(guess):
        lo = guess
        while hi - lo > 1:
            probe = min(hi - 1, lo + step)
            if not passes(probe):
                hi = probe
                break
            lo, step = probe, 2 * step
    else:
        hi = guess
        while hi - lo > 1:
            probe = max(lo + 1, hi - step)
            if passes(probe):
                lo = probe
                break
            hi, step = probe, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo


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
    exact: dict[int, float] = field(default_factory=dict)  # the n whose exact power was computed

    def top_power(self, n: int) -> float:
        """The power when an outcome succeeds as soon as the extreme set's tail at both ends of the nuisance domain
        (U_π, where a proof looks first, and max(0, Δ0), all discordant units worse) is ≤ α, which a proof needs:
        close to the power, equal to it wherever the supremum sits at an end. A steer for the search only."""
        return self.power(n, top_only=True)

    def plan(self, target: float, n_min: int, n_max: int, start: int) -> tuple[int, float]:
        """Search n on `top_power`, then compute the exact power at the n found and at n − 1; if the two do not
        bracket the target, search again on the exact power alone."""
        n, _ = _search(_twice(self.top_power), target, n_min, n_max, start)
        if _verified(self.power, self.exact, n, n_min, target):
            return n, self.exact[n]
        return _search(_twice(self.power), target, n_min, n_max, start)

    def power(self, n: int, top_only: bool = False) -> float:
        if not top_only and n in self.exact:
            return self.exact[n]
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
        uppers = np.array(_clopper_pearson_uppers(np.array(ks), n, gamma))
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
            # the values of S these candidates need, in two vectorised calls rather than one or more per candidate
            # (the same values: S is a fixed function, stored once computed)
            ordering.cover(np.array(chosen, dtype=np.int64), np.array(pending, dtype=np.int64))
            regions = np.array([statistic(w, k) for w, k in zip(chosen, pending, strict=True)])
            matrix = ordering.thresholds_many(regions, reach)
            at = np.array([uppers[k - k_lo] for k in pending])
            if top_only:
                bottom = np.minimum(at, max(0.0, delta0))
                ends = np.concatenate([at, bottom])
                tail = bounder.bounds(np.concatenate([matrix, matrix]), ends, ends, alpha, np.arange(ends.size))
                proven = (tail[: at.size] <= alpha) & (tail[at.size :] <= alpha)
                proven |= max(0.0, delta0) > at
            else:
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
        counted = [k for k in ks if lo[k] >= 0]
        if counted:  # vectorised (elementwise: the numbers of one call per k), added in increasing k
            outer = _binom.pmf(counted, n, pi).tolist()
            inner = _binom.cdf([lo[k] for k in counted], counted, q).tolist()
            for mass, within in zip(outer, inner, strict=True):
                total += float(mass) * float(within)
        if not top_only:
            self.exact[n] = min(1.0, total)
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

    The runs are simulated in float32: a plan needs the frequency, not the last bits of each capital. Blocks of
    runs are simulated in parallel processes where there are cores (the same runs and count in any case)."""
    starts = list(range(0, reps, _CHUNK))
    shares = [starts[i :: cores()] for i in range(min(len(starts), cores()))]
    calls = [partial(_betting_share, n, assumption, epsilon, delta, reps, stream, share) for share in shares]
    return sum(map_calls(calls))


def _betting_share(
    n: int, assumption: _Assumption, epsilon: float, delta: float, reps: int, stream: list[int], starts: list[int]
) -> int:
    """`_betting_hits` for the blocks of runs that begin at `starts`."""
    pw, pb = float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0)
    m_star = np.float32((epsilon + 1.0) / 2.0 - DECISION_MARGIN)  # ε on the rescaled [0, 1] axis, minus the margin
    log_threshold = -math.log(delta)
    cap = np.float32(bounds.BET_CAP / (1.0 - float(m_star)))
    scale = np.float32(2.0 * log_threshold / n)
    divisor = np.arange(2, n + 2, dtype=np.float32)  # the mean and variance estimates count one prior unit
    losses = np.array([0.0, 0.5, 1.0], dtype=np.float32)  # better, tied, worse on the rescaled [0, 1] axis
    hits = 0
    for start in starts:
        rows = min(_CHUNK, reps - start)
        # Common random numbers within a stream: run r of every n starts with the same units.
        u = np.random.default_rng([*stream, start]).random((n, rows), dtype=np.float32)
        # each unit's outcome as one byte (2: u < p_worse, worse; 1: u < 1 − p_better, tied; 0: better), so that
        # the transposes below move a quarter of the memory
        worse = (u < pw).view(np.uint8)
        outcome = worse + ((u < 1.0 - pb).view(np.uint8) | worse)
        del u
        for block in range(0, rows, _BLOCK):
            # one run per row, contiguous: the running sums then stream through memory (same numbers in any layout)
            runs = _transposed(outcome[:, block : block + _BLOCK])
            hits += _betting_block(runs, losses, divisor, m_star, cap, scale, log_threshold)
    return hits


def _transposed(a: np.ndarray, piece: int = 4096) -> np.ndarray:
    """np.ascontiguousarray(a.T), copied `piece` rows of `a` at a time: a whole-array copy reads the source down its
    columns, so for a long run every destination row streams the whole source from memory again; a piece stays in
    the caches while every destination row takes its part (the same bytes)."""
    result = np.empty(a.shape[::-1], dtype=a.dtype)
    for start in range(0, a.shape[0], piece):
        result[:, start : start + piece] = a[start : start + piece].T
    return result


def _betting_block(runs: np.ndarray, losses: np.ndarray, divisor: np.ndarray, m_star: np.float32, cap: np.float32,
                   scale: np.float32, log_threshold: float) -> int:
    """How many of these runs (one per row of outcomes) reach the threshold.

    The units go in segments, and a run leaves as soon as it has reached the threshold (most runs that reach it do
    so in the first half), so later segments carry only the runs still undecided. Each running sum continues from
    the value carried over as its first element: numpy's accumulate adds in order, so every run's sums, bets and
    capital are bit for bit those of one pass over all n units."""
    rows, n = runs.shape
    carried_x = np.zeros(rows, dtype=np.float32)  # Σ x so far
    carried_sq = np.zeros(rows, dtype=np.float32)  # Σ (x − mu)² so far
    carried_var = np.full(rows, np.float32(0.25), dtype=np.float32)  # the variance estimate the next bet uses
    carried_log = np.zeros(rows, dtype=np.float32)  # the log-capital so far
    live = np.arange(rows)
    hits = 0
    step = max(64, -(-n // 8))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        x = losses[runs[live, lo:hi]]
        # Each running sum: the carried value added to the first term, then accumulated in place (the sums of a
        # cumsum over [carried, terms], bit for bit, without the concatenated copy and a second array)
        mu = x.copy()
        mu[:, 0] += carried_x
        np.cumsum(mu, axis=1, dtype=np.float32, out=mu)
        carried_x = mu[:, -1].copy()
        mu += np.float32(0.5)
        mu /= divisor[lo:hi]
        mu -= x
        np.square(mu, out=mu)  # (x − mu)²
        mu[:, 0] += carried_sq
        var = np.cumsum(mu, axis=1, dtype=np.float32, out=mu)
        carried_sq = var[:, -1].copy()
        var += np.float32(0.25)
        var /= divisor[lo:hi]
        lam = np.empty_like(var)  # the bet before unit i uses the variance estimate after unit i − 1
        lam[:, 0] = carried_var
        lam[:, 1:] = var[:, :-1]
        carried_var = var[:, -1].copy()
        np.divide(scale, lam, out=lam)
        np.sqrt(lam, out=lam)
        np.minimum(lam, cap, out=lam)
        x -= m_star
        lam *= x
        np.negative(lam, out=lam)
        np.log1p(lam, out=lam)  # log(1 − λ(x − m))
        lam[:, 0] += carried_log
        capital = np.cumsum(lam, axis=1, dtype=np.float32, out=lam)
        reached = np.max(capital, axis=1) >= log_threshold
        hits += int(np.sum(reached))
        keep = ~reached
        live, carried_x, carried_sq = live[keep], carried_x[keep], carried_sq[keep]
        carried_var, carried_log = carried_var[keep], capital[keep, -1].copy()
        if live.size == 0:
            break
    return hits


@dataclass(frozen=True)
class _BettingPlan:
    n: int
    power: float
    standard_error: float
    runs: int


def betting_key(p_worse: float, p_better: float, epsilon: float, delta: float, target: float, n_max: int, reps: int,
                seed: int) -> str:
    """A betting plan's inputs as one string: every float as its `repr` (every bit)."""
    return " ".join([repr(float(p_worse)), repr(float(p_better)), repr(float(epsilon)), repr(float(delta)),
                     repr(float(target)), str(int(n_max)), str(int(reps)), str(int(seed))])


def table_digest(plans: Mapping[str, Sequence[object]]) -> str:
    """The sha256 of the table's plans in canonical JSON: the table is used only where it matches."""
    text = json.dumps(plans, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _betting_table() -> dict[str, tuple[int, float, int]]:
    """The betting plans already simulated (`invar.stats.betting_plans`, which `scripts/betting_table.py` generates):
    each plan's inputs as its key, its n, power and runs as `_betting_plan` found them. A plan is a pure function of
    its inputs (seeded runs), so a plan read here is the simulation's to the bit; inputs not in it are simulated.
    Empty where the table's digest does not match its plans (then every plan is simulated, the same numbers, slower;
    `tests/stats/test_betting_table.py` holds it matching)."""
    from invar.stats import betting_plans  # only a betting plan reads it

    if table_digest(betting_plans.PLANS) != betting_plans.DIGEST:
        return {}
    return dict(betting_plans.PLANS)


def simulation_digest() -> str:
    """The sha256 of the source of everything a betting plan's numbers depend on (the search, the simulation, their
    constants): the table records it, and a test holds it equal to the code's, so a change to the simulation cannot
    leave the table behind."""
    import inspect  # only the table's writer and its test ask

    parts = [inspect.getsource(f) for f in (_betting_plan, _betting_hits, _betting_share, _betting_block, _search,
                                              _probit, _normal_guess, bounds.check_count)]
    parts.append(repr((START_FACTORS["betting"], _CHUNK, _BLOCK, DECISION_MARGIN, CHECK_RUNS_FACTOR, bounds.BET_CAP,
                       np.__version__.split(".")[0])))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _betting_planned(
    assumption: _Assumption, epsilon: float, delta: float, target: float, n_max: int, reps: int, seed: int
) -> _BettingPlan:
    """`_betting_plan` from 1 unit up: read from the table where its inputs are there, simulated otherwise."""
    key = betting_key(float(assumption.p_worse or 0.0), float(assumption.p_better or 0.0), epsilon, delta, target,
                      n_max, reps, seed)
    known = _betting_table().get(key)
    if known is None:
        return _betting_plan(assumption, epsilon, delta, target, 1, n_max, reps, seed)
    n, power, runs = known
    return _BettingPlan(n, power, _standard_error(power, runs), runs)


def _standard_error(power: float, runs: int) -> float:
    return math.sqrt(max(power * (1.0 - power), 1.0 / runs) / runs)


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
    return _BettingPlan(n, power, _standard_error(power, runs), runs)


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


REACH_FACTOR = 2
"""A plan is refused at once when the z-test's n exceeds this many times n_max (`_within_reach`)."""


def _within_reach(assumption: _Assumption, epsilon: float, delta: float, power: float, n_max: int) -> None:
    """Refuse, before any search, a plan whose n lies far beyond n_max: the one-sided z-test with the variance known
    (`_normal_guess`) is the most powerful test of the assumed mean against ε in the normal limit, so no method's n
    lies much below its n; where that n exceeds REACH_FACTOR · n_max every search would walk to n_max (minutes near
    ε, the search growing as gap^-2) and fail. One line with the n it would need instead."""
    needed = _normal_guess(assumption, epsilon, delta, power)
    if needed > REACH_FACTOR * n_max:
        raise StatisticsError(
            f"the target power needs about {needed:,} units (the normal approximation, below which no method "
            f"admits much sooner), beyond the {n_max:,} a plan searches; the assumed increase {assumption.mean:g} "
            f"lies too close to epsilon {epsilon:g}: relax epsilon or delta, lower the power, or plan for a smaller "
            "increase"
        )


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
            _twice(_ExactPlanner(assumption, epsilon, delta).power),
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
    method: str, assumed: Assumed, epsilon: float, delta: float, power: float
) -> tuple[_Assumption, float, float, float]:
    if method not in METHODS:
        raise StatisticsError(f"unknown bound method {method!r}; choose one of {', '.join(METHODS)}")
    assumption = _assumption(assumed.p_worse, assumed.p_better, assumed.variance, assumed.mean, assumed.a, assumed.b)
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
    method: str, assumed: Assumed, epsilon: float, delta: float, power: float = 0.8, *, search: Search = Search()
) -> int:
    """Smallest n at which `method`'s upper bound is ≤ ε with probability ≥ power under the `assumed` differences
    (`search` bounds n and drives the betting simulation)."""
    return plan_row(method, assumed, epsilon, delta, power, search=search).n


def plan_row(
    method: str, assumed: Assumed, epsilon: float, delta: float, power: float = 0.8, *, search: Search = Search()
) -> PlanRow:
    """`required_n` with the power reached and how it was computed."""
    assumption, eps, dlt, target = _validated(method, assumed, epsilon, delta, power)
    n_cap = bounds.check_count("n_max", search.n_max, 2)
    runs = bounds.check_count("reps", search.reps, 1)
    seed = search.seed
    _within_reach(assumption, eps, dlt, target, n_cap)
    if method == "betting":
        if not assumption.trinomial:
            raise StatisticsError(
                "betting needs a distribution, not only a variance; state p_worse and p_better for 0/1 losses"
            )
        plan = _betting_planned(assumption, eps, dlt, target, n_cap, runs, int(seed))
        basis = (
            f"Monte Carlo: n searched on {runs} runs with common random numbers (seed {int(seed)}) and checked on "
            f"{plan.runs} independent runs; power estimated on {plan.runs} fresh runs, standard error "
            f"{plan.standard_error:.4f}"
        )
        return PlanRow(method=method, version=VERSIONS[method], n=plan.n, power=plan.power, power_target=target,
                       epsilon=eps, delta=dlt, assumption=assumption.words(), basis=basis)
    power_of, n_min, basis = _power_function(method, assumption, eps, dlt, target, runs, int(seed))
    factor = START_FACTORS[method] if assumption.trinomial else 1.0
    start = round(factor * _normal_guess(assumption, eps, dlt, target))
    if method == "paired-binary-exact" and assumption.trinomial:
        n, achieved = _ExactPlanner(assumption, eps, dlt).plan(target, n_min, n_cap, start)
    elif method == "paired-binary-score" and assumption.trinomial:
        n, achieved = _ScorePlanner(assumption, eps, dlt).plan(target, n_min, n_cap, start)
    else:
        n, achieved = _search(power_of, target, n_min, n_cap, start)
    return PlanRow(method=method, version=VERSIONS[method], n=n, power=achieved, power_target=target, epsilon=eps,
                   delta=dlt, assumption=assumption.words(), basis=basis)


def power_at(
    method: str, n: int, assumed: Assumed, epsilon: float, delta: float, *, power: float = 0.8,
    search: Search = Search(),
) -> float:
    """Probability that `method`'s upper bound on n units is ≤ ε under the assumption (as `required_n` computes
    it: exact, simulated, or a conservative lower bound; `power` only sets β of the variance-based bound)."""
    assumption, eps, dlt, target = _validated(method, assumed, epsilon, delta, power)
    units = bounds.check_count("n", n, 1)
    power_of, n_min, _ = _power_function(
        method, assumption, eps, dlt, target, bounds.check_count("reps", search.reps, 1), search.seed
    )
    if units < n_min:
        raise StatisticsError(f"{method} needs at least {n_min} units; got n={units}")
    return power_of(units)[0]


def planned_methods(assumed: Assumed, methods: Sequence[str] | None = None) -> tuple[str, ...]:
    """The methods `plan_table` plans: those asked, or every one that applies (a variance assumption plans Hoeffding
    and Maurer–Pontil)."""
    if methods is not None:
        return tuple(methods)
    return METHODS if assumed.variance is None else ("hoeffding", "maurer-pontil")


def plan_table(
    assumed: Assumed, epsilon: float, delta: float, power: float = 0.8, *, methods: Sequence[str] | None = None,
    search: Search = Search(), done: Callable[[PlanRow], None] | None = None,
) -> list[PlanRow]:
    """Every method's required n (`planned_methods`).

    The methods are independent pieces (`invar.parallel.map_calls`, the costliest first: inside
    `invar.parallel.forked()` one process per core plans them); the rows are the same numbers either way, in the
    order asked. `done(row)` is called as each method's row is ready (to show progress: a plan whose assumed
    increase lies close to ε searches far)."""
    rows, _ = _plan_rows(assumed, epsilon, delta, power, methods, search, done, None)
    return rows


def plan_table_beside(
    assumed: Assumed, epsilon: float, delta: float, power: float, beside: Callable[[], T], *,
    methods: Sequence[str] | None = None, search: Search = Search(), done: Callable[[PlanRow], None] | None = None,
) -> tuple[list[PlanRow], T]:
    """`plan_table`, and one more independent call computed beside the methods, last, by whichever process is free
    first (the contract's own power, which `use plan` would otherwise compute after the table)."""
    rows, got = _plan_rows(assumed, epsilon, delta, power, methods, search, done, beside)
    return rows, cast(T, got)


def _plan_rows(
    assumed: Assumed, epsilon: float, delta: float, power: float, methods: Sequence[str] | None, search: Search,
    done: Callable[[PlanRow], None] | None, beside: Callable[[], object] | None,
) -> tuple[list[PlanRow], object]:
    methods = planned_methods(assumed, methods)
    if assumed.variance is None and len(methods) + (beside is not None) > 1:
        # every method's plan of 0/1 losses sums binomials: imported once, before the methods fork (unless the
        # inputs plan nothing: each method then refuses them in its own words, with nothing to import)
        with contextlib.suppress(StatisticsError):
            normal_n(assumed, epsilon, delta, power, search=search)
            _binom.load()
    plan = partial(_plan_one, assumed, epsilon, delta, power, search)
    costliest = sorted(methods, key=lambda m: -_COST.get(m, 0.0))
    calls: list[Callable[[], object]] = [partial(plan, method) for method in costliest]
    if beside is not None:
        calls.append(beside)

    def ready(i: int, row: object) -> None:
        if done is not None and i < len(costliest):
            done(cast(PlanRow, row))

    results = map_calls(calls, None if done is None else ready)
    rows = dict(zip(costliest, (cast(PlanRow, r) for r in results[: len(costliest)]), strict=True))
    return [rows[method] for method in methods], results[-1] if beside is not None else None


def normal_n(assumed: Assumed, epsilon: float, delta: float, power: float, *, search: Search = Search()) -> int:
    """The n of a one-sided z-test with the variance known (`_normal_guess`): about the smallest n any method plans;
    `StatisticsError` where the inputs plan nothing, being invalid or beyond the reach of `search` (`_within_reach`:
    every method refuses them at once)."""
    assumption, eps, dlt, target = _validated("hoeffding", assumed, epsilon, delta, power)
    _within_reach(assumption, eps, dlt, target, bounds.check_count("n_max", search.n_max, 2))
    return _normal_guess(assumption, eps, dlt, target)


_COST = {"betting": 3.0, "paired-binary-score": 2.0, "paired-binary-exact": 2.0, "maurer-pontil": 0.2}
"""Relative planning time per method (only the order of submission depends on it)."""


def _plan_one(assumed: Assumed, epsilon: float, delta: float, power: float, search: Search, method: str) -> PlanRow:
    return plan_row(method, assumed, epsilon, delta, power, search=search)


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


@dataclass(frozen=True)
class PowerCurve:
    """One method's power against n under the stated assumption (as `power_at` computes it), for `use plan --plot`."""

    method: str
    n: tuple[int, ...]
    power: tuple[float, ...]
    required_n: int
    """The planned n (the row's)."""


def power_curve_points(row: PlanRow, n_min: int = 1, extra: Sequence[int] = (), points: int = 12) -> list[int]:
    """The n at which a method's curve is drawn: geometric from an eighth to 2.5 times its planned n, the planned n
    itself and `extra` (the contract's n) where it falls in that span (past it the power is far above the target,
    and the exact methods' cost grows with n); at least `n_min` (the method's smallest n)."""
    lo, hi = max(n_min, row.n // 8, 1), max(n_min + 1, int(row.n * 2.5))
    grid = {round(float(x)) for x in np.geomspace(lo, hi, points)} | {row.n} | {int(e) for e in extra
                                                                               if n_min <= e <= hi}
    return sorted(n for n in grid if n >= n_min)


def power_curves(
    rows: Sequence[PlanRow], assumed: Assumed, *, extra: Sequence[int] = (), points: int = 12,
    search: Search = Search(),
) -> list[PowerCurve]:
    """Each row's method's power at `power_curve_points` (every (method, n) an independent piece for `map_calls`)."""
    pieces: list[tuple[str, int]] = []
    for r in rows:
        n_min = 2 if r.method == "maurer-pontil" else 1
        pieces += [(r.method, n) for n in power_curve_points(r, n_min, extra, points)]

    def one(method: str, n: int, target: float, eps: float, dlt: float) -> float:
        return power_at(method, n, assumed, eps, dlt, power=target, search=search)

    first = {r.method: r for r in rows}
    values = map_calls([partial(one, m, n, first[m].power_target, first[m].epsilon, first[m].delta)
                        for m, n in pieces])
    curves = []
    for r in rows:
        got = [(n, v) for (m, n), v in zip(pieces, values, strict=True) if m == r.method]
        curves.append(PowerCurve(r.method, tuple(n for n, _ in got), tuple(v for _, v in got), r.n))
    return curves
