"""Where a training cycle's time goes in the core, per layout: CPU per cycle of the core and of its workers, and a
cProfile of the core's cycle thread.

    .venv/bin/python bench/train_cycle_profile.py [--config configs/arith-hf.toml] [--cycles 9]
                                                  [--runs split:NORMAL,shared:NORMAL,shared:FULL] [--json OUT]

Each run is `invar.runner.train.train` in a fresh process of its own, the core in that process: the layout
(`rollout.layout`) and the run store's `synchronous` setting (`invar.records.store.SYNCHRONOUS`; NORMAL is the
store's own, FULL syncs every record) as named. Per cycle: wall time, the core's CPU (every thread of the core
process: the cycle's thread and the threads that read the workers' reports and record them) and the workers' CPU
(the process tree less the core), read at the cycle's start and end, and the wall time the run store took to commit
the cycle's records (`RunStore._append`, every thread). The first cycle pays one-off costs (lazy imports, the
engines' first calls) and is reported apart. Odd cycles are profiled and even ones (from 2) are timed, since the
profiler's own cost is about as large as the core's work. The profile covers the cycle's thread in its CPU time
(cProfile follows the thread that enables it, so the report readers' recording is in the CPU figure, not in the
profile; waiting on a worker counts nothing). Wall times depend on the machine's load; the CPU figures much less.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
sys.path.append(str(REPO / "bench"))

from overhead import tree_cpu_s  # noqa: E402
from report import write_json  # noqa: E402
from train_overhead import write_config  # noqa: E402

TOP = 25
"""Functions listed per run, by the time spent in them and in what they call."""


def one_run(config: Path, run: Path, synchronous: str) -> dict[str, Any]:
    """`train` in this process with the store's `synchronous` setting; per-cycle CPU and the later cycles' profile."""
    from invar.records import store as store_mod
    from invar.runner import train as train_mod

    store_mod.SYNCHRONOUS = synchronous
    profile = cProfile.Profile(time.thread_time)  # CPU time of the cycle's thread: waits on workers cost 0
    cycles: list[dict[str, float]] = []
    cycle = train_mod._cycle
    append = store_mod.RunStore._append
    committing = [0.0]

    def timed_append(self: Any, *args: Any, **kwargs: Any) -> str:
        t0 = time.perf_counter()
        try:
            return append(self, *args, **kwargs)
        finally:
            committing[0] += time.perf_counter() - t0

    def timed(*args: Any, **kwargs: Any) -> Any:
        n = args[1]
        profiled = n % 2 == 1
        me, tree, t0, c0 = time.process_time(), tree_cpu_s(os.getpid()), time.perf_counter(), committing[0]
        if profiled:
            profile.enable()
        try:
            return cycle(*args, **kwargs)
        finally:
            if profiled:
                profile.disable()
            core = time.process_time() - me
            cycles.append({"cycle": n, "profiled": profiled, "wall_s": time.perf_counter() - t0, "core_cpu_s": core,
                           "workers_cpu_s": tree_cpu_s(os.getpid()) - tree - core,
                           "records_wall_s": committing[0] - c0})

    vars(train_mod)["_cycle"] = timed  # the name `_run_cycles` calls
    setattr(store_mod.RunStore, "_append", timed_append)  # noqa: B010 (a method replaced for this process)
    train_mod.train(config, run)
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("cumulative").print_stats(TOP)
    own = io.StringIO()
    pstats.Stats(profile, stream=own).sort_stats("tottime").print_stats(TOP)
    return {"cycles": cycles, "profile_cumulative": out.getvalue(), "profile_own": own.getvalue()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "arith-hf.toml")
    parser.add_argument("--cycles", type=int, default=9)
    parser.add_argument("--runs", default="split:NORMAL,shared:NORMAL,shared:FULL",
                        help="comma-separated LAYOUT:SYNCHRONOUS, each run in a process of its own")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        config, run, synchronous = args.one
        print(json.dumps(one_run(Path(config), Path(run), synchronous)))
        return 0
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    result: dict[str, Any] = {"config": str(args.config), "cycles": args.cycles, "load_at_start": os.getloadavg(),
                              "runs": {}}
    with tempfile.TemporaryDirectory(prefix="invar-cycle-profile-") as tmp:
        for spec in args.runs.split(","):
            layout, synchronous = spec.split(":")
            config = write_config(args.config, Path(tmp) / f"{layout}.toml", args.cycles, None, None, layout=layout)
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", str(config),
                                   str(Path(tmp) / f"run-{layout}-{synchronous}"), synchronous],
                                  capture_output=True, text=True, cwd=REPO)
            if proc.returncode != 0:
                raise SystemExit(f"bench/train_cycle_profile.py: {spec} failed: {proc.stderr.strip()[-2000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            later = [c for c in got["cycles"] if c["cycle"] > 0 and not c["profiled"]]
            keys = ("wall_s", "core_cpu_s", "workers_cpu_s", "records_wall_s")
            summary = {k: sorted(c[k] for c in later)[len(later) // 2] for k in keys}
            got["median_after_first"] = summary
            result["runs"][spec] = got
            print(f"{spec}: first cycle {got['cycles'][0]}; median of {len(later)} later cycles not profiled: "
                  + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in summary.items()), flush=True)
    result["load_at_end"] = os.getloadavg()
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
