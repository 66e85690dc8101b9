"""Where a training cycle waits on the core, read off the run's own records, for two trees alternated.

    .venv/bin/python bench/train_critical_path.py [--config configs/arith-hf.toml] [--cycles 12] [--runs 8]
        [--layout shared] [--baseline OLD] [--json OUT]

Each run is `invar train` of the configuration (its paths made absolute, `cycles` and `rollout.layout` set) in a
fresh folder, as a process of its own with PYTHONPATH at a tree's `src`; with `--baseline OLD` (a checkout, e.g. an
export of the commit before a change) the runs alternate between OLD and this tree, the order flipped every pair, so
a drift of the machine's speed touches both alike. From each run's records (every record is timestamped when it is
written: a call just before it is sent, a report once it is read back, a publication when the core has checked the
cycle) it takes, per cycle after the first, medians over the run:

- `learner_report_to_next_call_ms`: from the learner's report to the next call the core sends (the next cycle's
  first call): the core's own work between the update and the next rollouts, during which the engines wait;
- `generate_report_to_learner_call_ms`: from the rollouts' report to the learner call (reading the rollouts,
  rewards, advantages, the call): the same, between the rollouts and the update;
- `period_ms`: from one publication record to the next, the cycle as a long run repeats it.

The two waits are the core's share of a cycle's critical path, exact to the records' clock, free of the engines'
run-to-run noise that the period carries (bench/train_overhead.py pairs the period against a direct runner).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from invar.records import RunStore  # noqa: E402

sys.path.append(str(REPO / "bench"))  # last: bench/workers.py must not shadow the workers package
from report import header, write_json  # noqa: E402
from train_overhead import publications, write_config  # noqa: E402

KEYS = ("learner_report_to_next_call_ms", "generate_report_to_learner_call_ms", "period_ms")


def waits(run: Path) -> dict[str, float]:
    """The medians of `KEYS` over a finished run's cycles after the first (the first carries the start-up)."""
    with RunStore.open(run) as store:
        calls = store.calls()
    # (seq, at_ns, kind, method) of every call, report and publication, in the records' order
    events = sorted([(c.seq, c.at_ns, "call", c.call.method) for c in calls]
                    + [(c.report.seq, c.report.at_ns, "report", c.call.method) for c in calls if c.report is not None]
                    + [(seq, at_ns, "meta", "") for seq, at_ns in publications(run).values()])
    after_learner: list[float] = []
    after_generate: list[float] = []
    for i, (_, at, kind, method) in enumerate(events):
        if kind != "report" or method not in ("learner_step", "generate"):
            continue
        wanted = None if method == "learner_step" else "learner_step"  # after the update: the next call, any
        sent = next((a for _, a, k, m in events[i + 1:] if k == "call" and wanted in (None, m)), None)
        if sent is not None:
            (after_learner if method == "learner_step" else after_generate).append((sent - at) / 1e6)
    published = [at for _, at, kind, _ in events if kind == "meta"]
    periods = [(b - a) / 1e6 for a, b in itertools.pairwise(published)]
    if len(periods) < 2:
        raise SystemExit(f"bench/train_critical_path.py: {run} published {len(published)} cycles; give --cycles 3 "
                         "or more")
    return dict(zip(KEYS, (statistics.median(after_learner[1:]), statistics.median(after_generate[1:]),
                           statistics.median(periods[1:])), strict=True))


def run_once(config: Path, tree: Path, folder: Path) -> dict[str, float]:
    """One `invar train` of `config` with `tree`'s `src`, and its waits."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, "1")  # as bench/train_overhead.py runs its drivers
    done = subprocess.run([sys.executable, "-m", "invar.cli", "train", str(config), "--run", str(folder)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench/train_critical_path.py: invar train ({tree}) failed: {done.stderr.strip()[-2000:]}")
    return waits(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "arith-hf.toml")
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--runs", type=int, default=8, help="runs per tree")
    parser.add_argument("--layout", choices=("shared", "split"), default="shared")
    parser.add_argument("--baseline", type=Path, help="another checkout, run alternately with this tree")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    trees = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="invar-critical-") as tmp:
        config = write_config(args.config, Path(tmp) / "train.toml", args.cycles, None, None, args.layout)
        for i in range(args.runs):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for name in order:
                got = run_once(config, trees[name], Path(tmp) / f"run-{name}-{i}")
                results[name].append(got)
                print(f"run {i + 1}/{args.runs} {name}: " + ", ".join(f"{k} {got[k]:.2f}" for k in KEYS), flush=True)
    doc: dict[str, Any] = {**header("train_critical_path.py", argv), "config": str(args.config),
                           "cycles": args.cycles, "layout": args.layout, "cpus": os.cpu_count(),
                           "load_at_end": os.getloadavg(), "trees": {k: str(v) for k, v in trees.items()},
                           "runs": results}
    for name, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in KEYS}
        doc[name] = medians
        print(f"{name}: medians over runs: " + ", ".join(f"{k} {medians[k]:.2f}" for k in KEYS))
    if "baseline" in results:
        diffs = [a["period_ms"] - b["period_ms"] for a, b in zip(results["this"], results["baseline"], strict=True)]
        doc["period_this_less_baseline_ms"] = {"per_pair": diffs, "median": statistics.median(diffs),
                                               "pairs_faster": sum(d < 0 for d in diffs)}
        print(f"period, this less baseline: median {statistics.median(diffs):+.2f} ms over {len(diffs)} pairs, "
              f"{sum(d < 0 for d in diffs)} faster")
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
