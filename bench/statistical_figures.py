"""Reproduce every figure docs/statistics.md reports for the bounds, their plans and sequential admission.

Run from the repository root (one run; about an hour on 2 shared cores, most of it the exact enumeration):

    nice -n 10 .venv/bin/python bench/statistical_figures.py [--quick] [--enumerate 40] [--runs 10000]

Sections: the fixed-n plans of the seed case (n per method, ratio to the z-test's n, plan time), the ratio table
over a grid of assumptions, the betting row's power against independent replications, sequential admission's
stopping n on the goal cases, validity under continuous monitoring, paired-binary-score's validity by exact
enumeration and by simulation, and the measurements behind the corrections (paired-binary-exact's worst case, the
rounding of Hoeffding and Maurer–Pontil on an offset range, betting on a value-sorted order). --quick shrinks every
simulation and enumeration to check the script itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would hide the standard library's
# `statistics` (which invar imports): take the folder off before importing anything else.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from statistics import NormalDist  # noqa: E402

import mpmath as mp  # noqa: E402
import numpy as np  # noqa: E402

from invar.parallel import forked  # noqa: E402
from invar.stats import METHODS, bounds, planning, score, sequential, trinomial  # noqa: E402

DELTA = 0.05
SEED_CASE = (0.01, 0.01, 0.005)


def z_limit(p_worse: float, p_better: float, epsilon: float, delta: float = DELTA, power: float = 0.8) -> int:
    """n of the one-sided z-test with the variance known: the normal limit every ratio is taken against."""
    variance = p_worse + p_better - (p_worse - p_better) ** 2
    z = NormalDist().inv_cdf(1.0 - delta) + NormalDist().inv_cdf(power)
    return int(variance * (z / (epsilon - (p_worse - p_better))) ** 2)


def timed(call: Callable[[], object]) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    value = call()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def section(title: str) -> None:
    print(f"\n## {title}\n", flush=True)


def fixed_n(quick: bool) -> dict[str, int]:
    section("Fixed-n plans, p_worse = p_better = 0.01, eps = 0.005, delta = 0.05, power 0.8")
    limit = z_limit(*SEED_CASE)
    print(f"z-test with known variance: n = {limit:,}; goal for the default: <= 1.05x = {int(1.05 * limit):,}")
    print("| method | version | n | n / z-limit | power | plan wall s | plan cpu s |")
    print("|---|---|---|---|---|---|---|")
    found = {}
    total_wall = total_cpu = 0.0
    for method in METHODS:
        row, wall, cpu = timed(functools.partial(
            planning.plan_row, method, planning.Assumed(*SEED_CASE[:2]), SEED_CASE[2], DELTA,
            search=planning.Search(reps=500 if quick else 2000)))
        assert isinstance(row, planning.PlanRow)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        found[method] = row.n
        print(f"| {method} | {row.version} | {row.n:,} | {row.n / limit:.3f} | {row.power:.4f} | {wall:.1f} | "
              f"{cpu:.1f} |", flush=True)
    print(f"| all methods | | | | | {total_wall:.1f} | {total_cpu:.1f} |")
    return found


GRID = [
    (0.01, 0.01, 0.005),
    (0.002, 0.002, 0.005),
    (0.005, 0.005, 0.005),
    (0.02, 0.02, 0.01),
    (0.02, 0.01, 0.02),
    (0.05, 0.05, 0.02),
    (0.1, 0.1, 0.05),
    (0.05, 0.0, 0.1),
]


def ratio_table(quick: bool) -> None:
    section("n / z-limit over a grid of assumptions (delta = 0.05, power 0.8)")
    grid = GRID[:2] if quick else GRID
    print("| p_worse | p_better | eps | z-limit | " + " | ".join(METHODS) + " |")
    print("|---" * (4 + len(METHODS)) + "|")
    for p_worse, p_better, epsilon in grid:
        limit = z_limit(p_worse, p_better, epsilon)
        cells = []
        for method in METHODS:
            n = planning.required_n(method, planning.Assumed(p_worse, p_better), epsilon, DELTA,
                                    search=planning.Search(reps=500 if quick else 2000))
            cells.append(f"{n / limit:.3f}")
        print(f"| {p_worse:g} | {p_better:g} | {epsilon:g} | {limit:,} | " + " | ".join(cells) + " |", flush=True)


def betting_replications(n: int, quick: bool) -> None:
    section("Betting: the planned n against independent replications")
    assumption = planning._assumption(*SEED_CASE[:2], None, 0.0, -1.0, 1.0)
    runs = 1000 if quick else 4000
    estimates = []
    for replication in range(3 if quick else 5):
        hits = planning._betting_hits(n, assumption, SEED_CASE[2], DELTA, runs, [987_654, replication])
        estimates.append(hits / runs)
    pooled = float(np.mean(estimates))
    error = math.sqrt(pooled * (1 - pooled) / (runs * len(estimates)))
    print(f"n = {n:,}: {len(estimates)} independent estimates of {runs:,} runs each: "
          + ", ".join(f"{e:.4f}" for e in estimates) + f"; pooled {pooled:.4f} (standard error {error:.4f})")


SEQUENTIAL_CASES = {"clearly fine": (0.002, 0.002), "boundary": (0.01, 0.01), "clearly broken": (0.05, 0.01)}


def sequential_figures(fixed: int, quick: bool) -> None:
    runs = 300 if quick else 4000
    section(f"Sequential admission (eps = 0.005, delta = 0.05, looks every 100 units); fixed-n default n = {fixed:,}")
    print(
        "n_max: the smallest multiple of 100 whose simulated P(Admitted) at the boundary case reaches 0.8 "
        f"({runs:,} runs, the same stream for every n_max); each row below: {runs:,} fresh runs."
    )
    print("| method | n_max (boundary power >= 0.8) | case | P(Admitted) | P(Violated) | E[stop n] | +- | "
          "90th pct | E / fixed n |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method in sequential.SEQUENTIAL_METHODS:
        design = sequential.sequential_max_n(method, 0.01, 0.01, 0.005, DELTA, 0.8, 100, runs=runs)
        for name, (p_worse, p_better) in SEQUENTIAL_CASES.items():
            # every row on a fresh stream (the design's own estimate was selected for reaching 0.8)
            plan = sequential.sequential_plan(method, p_worse, p_better, 0.005, DELTA, design.n_max, 100,
                                              runs=runs, seed=11)
            print(f"| {method} | {design.n_max:,} | {name} | {plan.admitted:.3f} | {plan.violated:.3f} | "
                  f"{plan.expected_n:,.0f} | {plan.expected_n_error:.0f} | {plan.p90_n:,} | "
                  f"{plan.expected_n / fixed:.2f} |", flush=True)


MONITORING = {
    "rare event (0.003, 0)": (0.003, 0.0),
    "balanced (0.25, 0.25)": (0.25, 0.25),
    "skewed (0.05, 0.01)": (0.05, 0.01),
    "mean at eps (0.0125, 0.0075)": (0.0125, 0.0075),
    "simplex corner (0.97, 0)": (0.97, 0.0),
}


def monitoring(quick: bool, runs: int) -> None:
    reps, n_max = (500, 400) if quick else (runs, 2000)
    section(f"Validity under continuous monitoring: runs whose sequence ever excludes the true mean "
            f"({reps:,} runs, every unit up to n_max = {n_max:,})")
    print("| method | case | upper misses | lower misses | rate (upper, lower) | standard error at delta |")
    print("|---|---|---|---|---|---|")
    error = math.sqrt(DELTA * (1 - DELTA) / reps)
    for method in sequential.SEQUENTIAL_METHODS:
        scales, weights = sequential._components(method)
        for name, (p_worse, p_better) in MONITORING.items():
            mean = p_worse - p_better
            rng = np.random.default_rng(2024)
            upper = lower = 0
            for start in range(0, reps, 500):
                rows = min(500, reps - start)
                u = rng.random((rows, n_max))
                d = np.where(u < p_worse, 1.0, np.where(u >= 1.0 - p_better, -1.0, 0.0))
                x = (d + 1.0) / 2.0
                bets = (sequential.trinomial_bets(d, DELTA, n_max) if method == "paired-binary-sequence"
                        else sequential.horizon_bets(x, DELTA, n_max))
                m = np.full(rows, (mean + 1.0) / 2.0)
                upper += int(np.sum(sequential.crossed_by(x, bets, m, "upper", DELTA, scales, weights)))
                lower += int(np.sum(sequential.crossed_by(x, bets, m, "lower", DELTA, scales, weights)))
            print(f"| {method} | {name} | {upper} | {lower} | {upper / reps:.4f}, {lower / reps:.4f} | {error:.4f} |",
                  flush=True)


def enumeration(max_n: int) -> None:
    section(f"paired-binary-score: worst-case miss probability by exact enumeration, n = 1..{max_n}")
    print("Every outcome's probability summed exactly; maximised over a 60-step grid of (p_worse, p_better), every "
          "simplex edge and corner (points 1e-12..1e-1 from them) and along the lines just past each reported limit "
          "(a grid, then a bounded search). "
          "By mirror symmetry the lower limit's worst case is the same number. alpha = delta - gamma = 0.0495.")
    print("| n | worst P(upper < Delta) | at (p_worse, p_better) | seconds |")
    print("|---|---|---|---|")
    overall = 0.0
    for n in range(1, max_n + 1):
        start = time.perf_counter()
        worst, where = _worst_miss(n)
        overall = max(overall, worst)
        print(f"| {n} | {worst:.7f} | ({where[0]:.6g}, {where[1]:.3g}) | {time.perf_counter() - start:.0f} |",
              flush=True)
    print(f"\nlargest over n = 1..{max_n}: {overall:.7f} (delta = {DELTA})")


def _worst_miss(n: int) -> tuple[float, tuple[float, float]]:
    pairs = [(w, b) for w in range(n + 1) for b in range(n + 1 - w)]
    upper = np.array([score.upper_limit(w, b, n, DELTA) for w, b in pairs])
    w = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    log_coef = np.array([math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(y + 1) - math.lgamma(n - x - y + 1)
                         for x, y in pairs])
    near = np.concatenate([[0.0], np.logspace(-12, -1, 23)])
    steps = np.linspace(0.0, 1.0, 61)
    thetas = [(pw, pb) for pw in np.unique(np.concatenate([steps, near, 1.0 - near]))
              for pb in np.unique(np.concatenate([steps, near, 1.0 - pw - near, [1.0 - pw]])) if 0.0 <= pb <= 1.0 - pw]
    for limit in np.unique(upper[upper < 1.0]):
        target = limit + 1e-12
        lo, hi = max(0.0, -target), (1.0 - target) / 2.0
        thetas += [(min(1.0, pb + target), pb) for pb in np.unique(np.concatenate([np.linspace(lo, hi, 41),
                                                                                   lo + near, hi - near]))
                   if lo <= pb <= hi]
    theta = np.array(thetas)
    pw_, pb_ = theta[:, :1], theta[:, 1:]
    p0 = np.clip(1.0 - pw_ - pb_, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = (log_coef + np.where(w > 0, w * np.log(pw_), 0.0) + np.where(b > 0, b * np.log(pb_), 0.0)
                 + np.where(n - w - b > 0, (n - w - b) * np.log(p0), 0.0))
    misses = np.sum(np.nan_to_num(np.exp(log_p)) * (upper[None, :] < (pw_ - pb_)), axis=1)
    i = int(np.argmax(misses))
    best = (float(misses[i]), (float(theta[i, 0]), float(theta[i, 1])))
    # The supremum sits just past a limit, in the interior of its line: a grid of 41 points lands up to ~1e-5
    # below it (n = 20: 0.049514 on the grid, 0.049517 at the maximum), so each line is also maximised.
    for limit in np.unique(upper[upper < 1.0]):
        found = _line_maximum(n, limit + 1e-12, upper, w, b, log_coef)
        if found[0] > best[0]:
            best = found
    return best


def _line_maximum(n: int, target: float, upper: np.ndarray, w: np.ndarray, b: np.ndarray,
                  log_coef: np.ndarray) -> tuple[float, tuple[float, float]]:
    """The largest miss probability on the line Δ = target: a 101-point grid, then a bounded scalar search between
    the best point's neighbours."""
    from scipy.optimize import minimize_scalar

    missed = upper < target
    lo, hi = max(0.0, -target), (1.0 - target) / 2.0
    if hi <= lo:
        return 0.0, (0.0, 0.0)

    def miss(pb: float) -> float:
        pw = min(1.0, pb + target)
        p0 = max(0.0, 1.0 - pw - pb)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = (log_coef + np.where(w > 0, w * np.log(pw), 0.0) + np.where(b > 0, b * np.log(pb), 0.0)
                     + np.where(n - w - b > 0, (n - w - b) * np.log(p0), 0.0))
        return float(np.sum(np.nan_to_num(np.exp(log_p))[missed]))

    grid = np.linspace(lo, hi, 101)
    values = [miss(float(pb)) for pb in grid]
    i = int(np.argmax(values))
    found = minimize_scalar(lambda pb: -miss(pb), bounds=(grid[max(0, i - 1)], grid[min(100, i + 1)]),
                            method="bounded", options={"xatol": 1e-12})
    pb = float(found.x) if -found.fun > values[i] else float(grid[i])
    return max(values[i], -float(found.fun)), (min(1.0, pb + target), pb)


COVERAGE = {"rare event": (300, 0.003, 0.0), "balanced": (60, 0.25, 0.25), "worse never": (100, 0.0, 0.3),
            "asymmetric": (200, 0.05, 0.02), "simplex corner": (40, 0.96, 0.0), "all tied": (50, 0.0, 0.0)}


def coverage(quick: bool, runs: int) -> None:
    reps = 1000 if quick else runs
    section(f"paired-binary-score: simulated miss rates ({reps:,} runs per case)")
    print("| case | n | p_worse | p_better | upper misses | lower misses |")
    print("|---|---|---|---|---|---|")
    for name, (n, p_worse, p_better) in COVERAGE.items():
        draws = np.random.default_rng(13).multinomial(n, [p_worse, p_better, 1 - p_worse - p_better], size=reps)
        outcomes, frequency = np.unique(draws[:, :2], axis=0, return_counts=True)
        up = low = 0
        for (w, b), count in zip(outcomes.tolist(), frequency.tolist(), strict=True):
            result = bounds.paired_binary_score(w, b, n, DELTA)
            up += count * (result.upper < p_worse - p_better)
            low += count * (result.lower > p_worse - p_better)
        print(f"| {name} | {n} | {p_worse} | {p_better} | {up / reps:.4f} | {low / reps:.4f} |", flush=True)


def corrections() -> None:
    section("Measurements behind the corrections")
    for n in (8, 25):
        u = trinomial.upper_limit(n - 1, 0, n, DELTA)
        print(f"paired-binary-exact/1, n = {n}: at p_better = 0, p_worse just above upper(n-1, 0) = {u:.6f}, "
              f"the miss probability tends to 1 - upper^n = {1 - u**n:.6f} (delta - gamma = {DELTA * 49 / 50:.3f})")
    mp.mp.dps = 120
    a, width = -250.0, 1e-3
    rng = np.random.default_rng(0)
    d = np.clip(a + width * rng.beta(0.5, 1.0, size=2000), a, a + width)
    exact_mean = mp.fsum(mp.mpf(float(x)) for x in d) / d.size
    half = (mp.mpf(a + width) - mp.mpf(a)) * mp.sqrt(mp.log(1 / mp.mpf(DELTA)) / (2 * d.size))
    got = bounds.hoeffding(d, a, a + width, DELTA)
    gap = (mp.mpf(got.upper) - (exact_mean + half)) / mp.mpf(width)
    print(f"hoeffding on [-250, -250 + 1e-3], n = 2000: upper exceeds the exact value by {mp.nstr(gap, 3)} (b - a) "
          f"(the old claim: 1e-12 (b - a)); max(|a|, |b|)/(b - a) = {250 / width:.3g}")
    ordered = np.sort(np.concatenate([np.ones(60), -np.ones(60), np.zeros(280)]))[::-1]
    sorted_bound = bounds.betting(ordered, -1.0, 1.0, DELTA)
    print(f"betting on 400 units sorted by value (60 worse first): lower {sorted_bound.lower:.4f} > upper "
          f"{sorted_bound.upper:.4f} with mean {sorted_bound.estimate:.4f}; warning: {sorted_bound.warnings[0]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small simulations and enumeration, to check the script")
    parser.add_argument("--enumerate", type=int, default=40, help="exact enumeration for n = 1..N (default 40)")
    parser.add_argument("--runs", type=int, default=10_000, help="simulated runs per validity case")
    parser.add_argument("--skip", action="append", default=[], help="skip a section: fixed, grid, betting, "
                        "sequential, monitoring, enumeration, coverage, corrections")
    args = parser.parse_args()
    start = time.perf_counter()
    found: dict[str, int] = {}
    if "fixed" not in args.skip:
        found = fixed_n(args.quick)
    if "grid" not in args.skip:
        ratio_table(args.quick)
    if "betting" not in args.skip and "betting" in found:
        betting_replications(found["betting"], args.quick)
    if "sequential" not in args.skip:
        sequential_figures(found.get(bounds.DEFAULT_BINARY_METHOD, 5101), args.quick)
    if "monitoring" not in args.skip:
        monitoring(args.quick, args.runs)
    if "coverage" not in args.skip:
        coverage(args.quick, args.runs)
    if "corrections" not in args.skip:
        corrections()
    if "enumeration" not in args.skip:
        enumeration(6 if args.quick else args.enumerate)
    print(f"\ntotal {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    with forked():  # as `invar use plan` plans: the pieces on every core
        main()
