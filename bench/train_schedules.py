"""Training schedules on one configuration: do they publish the same policies, and what does the fixed-order
reduction cost per learner step?

    .venv/bin/python bench/train_schedules.py [--config configs/arith-mlx.toml] [--cycles 5] [--out DIR]
        [--json docs/training/schedules.json]

Trains the configuration once per schedule (`SCHEDULES`: learner micro-batch and reduction, engine batch size),
each for `--cycles` cycles in its own run, then compares every run with the first (`whole`) through
`invar compare histories` and reads each cycle's learner wall time from the records (`invar inspect history`).
The cost of the fixed-order reduction: the first recorded learner step of `whole` is replayed on one learner per
`--cost-engines`, alternating float64-sequence (one backward per sequence, summed in float64 in sequence order)
and the plain step (MLX: one backward over the batch's summed loss; HF: its default, one padded forward and one
backward over the whole batch), `--repeats` times each, so both see the same machine load. The step also scores the
batch (proximal), saves and hashes the checkpoint: the ratio is of the whole step, as a run pays it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
from report import write_json

from invar.compare.histories import compare_histories
from invar.loop.config import resolve
from invar.loop.history import read_history
from invar.protocol import Role
from invar.records import RunStore
from invar.runner.engine import Engine, EngineSpec, engine_session
from invar.runner.train import train

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout this bench belongs to

SCHEDULES: dict[str, dict[str, dict[str, Any]]] = {
    "whole": {},
    "micro16": {"learner": {"micro_batch": 16}},
    "micro4": {"learner": {"micro_batch": 4}},
    "engine1": {"rollout": {"batch_size": 1}},
    "engine32": {"rollout": {"batch_size": 32}},
    "workers2": {"rollout": {"workers": 2}},
    "plain": {"learner": {"reduction": "float32-microbatch"}},
    "control16": {"learner": {"micro_batch": 16, "reduction": "float32-microbatch"}},
    "stale1": {"rollout": {"staleness": 1}},
}
"""Schedule name → configuration sections changed from the base configuration."""


def _toml(data: dict[str, Any]) -> str:
    """The configuration as TOML (scalars, lists and one level of tables, as the training configuration has)."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    for section, values in data.items():
        if isinstance(values, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"


REDUCTIONS: dict[str, dict[str, dict[str, Any] | None]] = {
    "mlx": {"fixed-order": {"micro_batch": None, "reduction": "float64-sequence"},
            "plain": {"micro_batch": None, "reduction": "float32-microbatch"}},
    "hf": {"fixed-order": {"micro_batch": None, "reduction": "float64-sequence"}, "plain": None},
}
"""Per learner engine, the two steps timed side by side: the schedule-invariant one and the plain one (MLX: one
backward over the whole batch's summed loss; HF: its default, one padded forward and one backward)."""


def step_cost(run: Path, model: Path, repeats: int, out: Path, engine: str = "mlx") -> dict[str, Any]:
    """Replay the first recorded `learner_step` of `run` (its params name no engine) on one learner of `engine`,
    alternating the two reductions `repeats` times each, so both see the same machine load; seconds per step of
    each, and the median of the paired ratios."""
    with RunStore.open(run) as store:
        params = next(c.call.params for c in store.calls() if c.call.method == "learner_step")
    times: dict[str, list[float]] = {name: [] for name in REDUCTIONS[engine]}
    with RunStore.create(out / f"replay-{engine}") as store, \
            engine_session(EngineSpec(Engine(engine), model), store, role=Role.LEARNER) as learner:
        for i in range(repeats):
            for name, schedule in REDUCTIONS[engine].items():
                call = {k: v for k, v in params.items() if k != "schedule"}
                if schedule is not None:
                    call["schedule"] = schedule
                call["save_dir"] = str(out / f"replay-{engine}-{name}-{i}")
                t0 = time.perf_counter()
                learner.client.call("learner_step", call)
                times[name].append(time.perf_counter() - t0)
    med = {name: float(np.median(t)) for name, t in times.items()}
    paired = float(np.median(np.array(times["fixed-order"]) / np.array(times["plain"])))
    return {"engine": engine, "samples": len(params["samples"]), "repeats": repeats, "seconds": times,
            "median_s": med, "ratio": med["fixed-order"] / med["plain"], "paired_ratio_median": paired}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "arith-mlx.toml")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="Folder for the runs (default: a temporary one).")
    ap.add_argument("--json", type=Path, default=None, help="Write the results here.")
    ap.add_argument("--only", nargs="*", default=None, help="Run only these schedules (the first is compared with).")
    ap.add_argument("--repeats", type=int, default=8, help="Learner steps timed per reduction (interleaved).")
    ap.add_argument("--cost-engines", nargs="*", default=["mlx", "hf"], choices=["mlx", "hf"],
                    help="Learners whose step cost is measured.")
    args = ap.parse_args()
    base = tomllib.loads(args.config.read_text(encoding="utf-8"))
    base["cycles"] = args.cycles
    for key in ("model",):
        base[key] = str(resolve(args.config.resolve(), base[key]).resolve())
    base["prompts"]["path"] = str(resolve(args.config.resolve(), base["prompts"]["path"]).resolve())
    out = args.out or Path(tempfile.mkdtemp(prefix="invar-schedules-"))
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(SCHEDULES)
    rows: list[dict[str, Any]] = []
    runs: dict[str, Path] = {}
    for name in names:
        data = json.loads(json.dumps(base))
        for section, values in SCHEDULES[name].items():
            data.setdefault(section, {}).update(values)
        data["name"] = f"{base['name']}-{name}"
        config = out / f"{name}.toml"
        config.write_text(_toml(data), encoding="utf-8")
        t0 = time.perf_counter()
        train(config, out / name)
        wall = time.perf_counter() - t0
        runs[name] = out / name
        learner = [c.wall_s["learner"] for c in read_history(out / name).cycles]
        row: dict[str, Any] = {"schedule": name, "changes": SCHEDULES[name], "wall_s": round(wall, 1),
                               "learner_s_median": float(np.median(learner)), "learner_s": learner}
        if name != names[0]:
            cmp = compare_histories(runs[names[0]], out / name)
            row.update(verdict="identical" if cmp.identical else "differ",
                       first_differing_cycle=None if cmp.first_difference is None else cmp.first_difference.cycle,
                       knobs={k: list(v) for k, v in cmp.knobs.items()},
                       first_diff=None if cmp.first_difference is None or cmp.first_difference.diff is None
                       else cmp.first_difference.diff.model_dump())
        rows.append(row)
        print(json.dumps(row), flush=True)
    result: dict[str, Any] = {"config": str(args.config), "cycles": args.cycles, "runs": str(out), "schedules": rows}
    result["step_cost"] = []
    for engine in args.cost_engines if args.repeats > 0 else ():
        cost = step_cost(runs[names[0]], Path(base["model"]), args.repeats, out, engine)
        result["step_cost"].append(cost)
        print(f"fixed-order reduction on {engine}: median learner step {cost['median_s']['fixed-order']:.3f} s vs "
              f"plain {cost['median_s']['plain']:.3f} s over {cost['samples']} samples: ratio {cost['ratio']:.2f} "
              f"(median of paired ratios {cost['paired_ratio_median']:.2f})", flush=True)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
