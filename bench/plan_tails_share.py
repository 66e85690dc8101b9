"""How much of an exact plan's time is SciPy's binomial routines: the floor under any faster code with the same figures.

    .venv/bin/python bench/plan_tails_share.py [--cases score-0.002,exact-0.002,score-vary] [--reps 1]
        [--json docs/performance/plan_tails_share.json]

paired-binary-exact and paired-binary-score compute their exact powers from binomial pmfs and cdfs, and each figure
they print depends on those values to the last bit: the plan's search steps on the powers themselves, so a value
computed another way can move an n. The values come from SciPy's compiled Boost routines
(`scipy.special._ufuncs._binom_pmf`, `_binom_cdf`, `_binom_sf`, `_binom_ppf`, and `betainccinv` for the
Clopper–Pearson limits). Whatever else a plan does could move into compiled code without changing a bit; those calls
could not, short of reimplementing Boost's incomplete beta bit for bit.

Each case runs `planning.required_n` in a fresh process (no forked helpers: one core), every Boost call wrapped and
timed. Reported per case: the n, the plan's wall time in that process, the time inside the Boost calls and their
count, their share, and the least the plan could take with everything else free, on one core and spread over this
machine's cores (the Boost time divided by the cores). Wrapping adds a Python call per ufunc call (a few µs each; the
count is reported) to the plan's time, outside the timed span, so the share is slightly low, never high.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))
from report import compile_sources, header, write_json

from invar import parallel

REPO = Path(__file__).resolve().parents[1]
# name -> (method, p_worse, p_better, ε, δ, power): the slowest plans measured (docs/performance.md, part 2)
CASES: dict[str, tuple[str, float, float, float, float, float]] = {
    "score-0.002": ("paired-binary-score", 0.01, 0.01, 0.002, 0.05, 0.8),
    "exact-0.002": ("paired-binary-exact", 0.01, 0.01, 0.002, 0.05, 0.8),
    "score-vary": ("paired-binary-score", 0.01, 0.01, 0.005, 0.01, 0.9),
    "exact-vary": ("paired-binary-exact", 0.01, 0.01, 0.005, 0.01, 0.9),
    "exact-grid": ("paired-binary-exact", 0.05, 0.05, 0.02, 0.05, 0.8),
}


def one(name: str) -> dict[str, Any]:
    """The case `name` planned in this process, every Boost call timed."""
    from invar.stats import _binom, planning

    spent = [0.0]
    calls = [0]

    def timed(ufunc: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return ufunc(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                calls[0] += 1

        return call

    loaded = _binom._ufuncs()
    if loaded is None:
        raise SystemExit("this SciPy has no Boost binomial ufuncs; nothing to measure")
    wrapped = tuple(timed(u) for u in loaded)
    inverse = timed(_binom._betainccinv())
    # the module reads both through these two functions at every call
    vars(_binom)["_ufuncs"] = lambda: wrapped
    vars(_binom)["_betainccinv"] = lambda: inverse
    method, p_worse, p_better, epsilon, delta, power = CASES[name]
    start = time.perf_counter()
    n = planning.required_n(method, planning.Assumed(p_worse=p_worse, p_better=p_better), epsilon, delta, power)
    wall = time.perf_counter() - start
    return {"case": name, "method": method, "p_worse": p_worse, "p_better": p_better, "epsilon": epsilon,
            "delta": delta, "power": power, "n": n, "plan_s": wall, "boost_s": spent[0], "boost_calls": calls[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="score-0.002,exact-0.002,score-vary",
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--reps", type=int, default=1, help="fresh processes per case (default 1)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a case, in this process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one)))
        return
    names = [name for name in args.cases.split(",") if name]
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    compile_sources(REPO / "src")
    cores = parallel.cores()
    rows: list[dict[str, Any]] = []
    for name in names:
        runs = []
        for rep in range(args.reps):
            print(f"{name}: process {rep + 1} of {args.reps}…", flush=True)
            done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                                  check=True)
            runs.append(json.loads(done.stdout))
        if len({r["n"] for r in runs}) != 1:
            raise SystemExit(f"{name}: the planned n changed between processes: {[r['n'] for r in runs]}")
        plan_s = statistics.median(r["plan_s"] for r in runs)
        boost_s = statistics.median(r["boost_s"] for r in runs)
        row = {**runs[0], "plan_s": plan_s, "boost_s": boost_s, "share": boost_s / plan_s,
               "floor_one_core_s": boost_s, "floor_all_cores_s": boost_s / cores,
               "runs": [{"plan_s": r["plan_s"], "boost_s": r["boost_s"]} for r in runs]}
        rows.append(row)
        print(f"{name}: n = {row['n']:,}; plan {plan_s:.2f} s in one process, {boost_s:.2f} s of it in "
              f"{row['boost_calls']:,} Boost calls ({100 * row['share']:.0f} %): at least {boost_s:.2f} s on one core, "
              f"{boost_s / cores:.2f} s on {cores}, whatever the rest costs")
    write_json(args.json, {**header("plan_tails_share.py"), "cores": cores, "load_before": os.getloadavg(),
                           "rows": rows})


if __name__ == "__main__":
    main()
