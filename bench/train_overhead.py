"""What a training cycle costs through Invar against a direct runner doing the same cycle in one process.

    .venv/bin/python bench/train_overhead.py [--config configs/arith-mlx.toml] [--cycles 3] [--reps 3]
                                             [--model DIR] [--per-cycle N] [--json OUT]

Both drivers run the same cycles of the same configuration (cycles, model and prompts per cycle overridable):

- **invar**: `invar train CONFIG --run DIR` (core, worker processes, protocol, records, the core's recomputation of
  rewards, advantages and the objective, the checkpoint check, publication). Per cycle: the wall time the run
  records for it (generate + learner + publish, start-up excluded).
- **direct**: one Python process imports the worker engine classes (`workers.<engine>_worker.Engine`, an inference
  and a learner instance) and runs each cycle's calls with the same params: load the last checkpoint as the policy,
  generate, the core's rewards and advantages (a runner must compute them too), one learner step that saves the
  checkpoint. No protocol, no records, no recomputation, no checkpoint check.

The direct runner must publish the same checkpoint digests as Invar, cycle by cycle (same engines, same params): the
benchmark refuses to report otherwise. Repetitions alternate the drivers; reported: the median cycle time of each
(over every cycle of every repetition), min and max, and the ratio invar/direct.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import worker_env  # noqa: E402
from invar.loop import cycle as cyc  # noqa: E402
from invar.loop.advantages import group_advantages  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.runner import train as tr  # noqa: E402

DIRECT_BACKENDS = ("mlx", "hf")


def write_config(source: Path, out: Path, cycles: int, model: Path | None, per_cycle: int | None) -> Path:
    """The configuration with its paths made absolute and the overrides applied."""
    data = tomllib.loads(source.read_text())
    data["cycles"] = cycles
    data["model"] = str(model.resolve() if model is not None else (source.parent / data["model"]).resolve())
    data["prompts"]["path"] = str((source.parent / data["prompts"]["path"]).resolve())
    if per_cycle is not None:
        data["prompts"]["per_cycle"] = per_cycle
    lines = []
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {json.dumps(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
    out.write_text("\n".join(lines) + "\n")
    return out


def _engines(backend: str) -> tuple[Any, Any]:
    if backend == "mlx":
        from workers import mlx_worker

        return mlx_worker.Engine(mlx_worker.Role.INFERENCE), mlx_worker.Engine(mlx_worker.Role.LEARNER)
    import torch

    from workers import hf_worker

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    return hf_worker.Engine(hf_worker.Role.INFERENCE, "cpu"), hf_worker.Engine(hf_worker.Role.LEARNER, "cpu")


def run_direct(config: Path, out: Path) -> dict[str, Any]:
    """Every cycle of the configuration in this process (as `invar train` runs it, without Invar)."""
    p = tr.plan(config)
    cfg = p.config
    out.mkdir(parents=True)
    inference, learner = _engines(cfg.backend)
    load = {"model_dir": str(p.model), "model_digest": p.model_digest, "dtype": cfg.dtype, "quantization": "none",
            "adapter": None}
    inference.load_model(load)
    learner.load_model(load)
    with_reference = cfg.objective.kl_coef > 0
    digests: list[str] = []
    seconds: list[float] = []
    policy: Path | None = None
    for n in range(cfg.cycles):
        t0 = time.perf_counter()
        if policy is not None:
            inference.load_adapter({"name": tr.ADAPTER_NAME, "path": str(policy), "digest": digests[-1]})
        prompts = cyc.cycle_prompts(p.prompts, cfg.prompts.per_cycle, cfg.seed, n)
        requests = cyc.rollout_requests(prompts, cfg.rollout.group_size, cfg.seed, n, cfg.rollout.temperature,
                                        cfg.rollout.max_tokens)
        gen = inference.generate(cyc.generate_params(requests, cfg.rollout.batch_size,
                                                     None if policy is None else tr.ADAPTER_NAME,
                                                     "base" if with_reference else None))
        samples = cyc.read_rollout(gen, requests, cycle=n, model_digest=p.model_digest,
                                   policy_digest=digests[-1] if digests else None, reference=with_reference,
                                   vocab_size=p.vocab.size)
        adv = group_advantages(cyc.rewards(samples, p.vocab), cfg.rollout.group_size, cfg.advantage.normalization,
                               cfg.advantage.eps)
        save = out / f"cycle-{n:06d}"
        learner.learner_step(tr.learner_step_params(p, samples, adv.values, save))
        seconds.append(time.perf_counter() - t0)
        digests.append(canonical.tree_digest(str(save)))
        policy = save
    return {"cycle_s": seconds, "digests": digests}


def run_invar(config: Path, run: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "invar.cli", "train", str(config), "--run", str(run), "--json"],
                         capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"bench/train_overhead.py: invar train failed: {out.stderr.strip()}")
    with RunStore.open(run) as store:
        meta = store.meta()
    cycles = [meta[k] for k in sorted(meta) if k.startswith("cycle-")]
    return {"cycle_s": [sum(c["wall_s"].values()) for c in cycles],
            "digests": [c["checkpoint"]["digest"] for c in cycles], "wall_s": wall}


def direct_subprocess(config: Path, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", str(Path(__file__).resolve()), "--direct", str(config),
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, env=worker_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench/train_overhead.py: the direct runner failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "arith-mlx.toml")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="another model folder (e.g. bench/overhead.py's)")
    parser.add_argument("--per-cycle", type=int, default=None, help="prompts per cycle (default: the config's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--direct", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.direct is not None:
        print(json.dumps(run_direct(args.direct, args.out)))
        return 0
    with tempfile.TemporaryDirectory(prefix="invar-train-overhead-") as tmp:
        folder = Path(tmp)
        config = write_config(args.config, folder / "config.toml", args.cycles, args.model, args.per_cycle)
        backend = tomllib.loads(config.read_text())["backend"]
        if backend not in DIRECT_BACKENDS:
            parser.error(f"the direct runner drives {', '.join(DIRECT_BACKENDS)}; the config's backend is {backend}")
        runs: dict[str, list[dict[str, Any]]] = {"invar": [], "direct": []}
        for rep in range(args.reps):
            for driver in (["invar", "direct"] if rep % 2 == 0 else ["direct", "invar"]):
                where = folder / f"{driver}-{rep}"
                got = run_invar(config, where) if driver == "invar" else direct_subprocess(config, where)
                runs[driver].append(got)
                print(f"rep {rep + 1}/{args.reps} {driver}: cycles " +
                      ", ".join(f"{s:.2f}" for s in got["cycle_s"]) + f" s (process {got['wall_s']:.1f} s)",
                      flush=True)
        digests = {json.dumps(r["digests"]) for rs in runs.values() for r in rs}
        if len(digests) != 1:
            raise SystemExit("bench/train_overhead.py: invar and the direct runner published different checkpoints")
    result: dict[str, Any] = {"config": str(args.config), "backend": backend, "cycles": args.cycles,
                              "reps": args.reps, "model": str(args.model or "config's"),
                              "per_cycle": args.per_cycle, "same_checkpoints": True, "cpus": os.cpu_count()}
    for driver, rs in runs.items():
        xs = [s for r in rs for s in r["cycle_s"]]
        result[driver] = {"median_cycle_s": float(np.median(xs)), "min_cycle_s": min(xs), "max_cycle_s": max(xs),
                          "process_wall_s": [r["wall_s"] for r in rs]}
    result["invar_over_direct"] = result["invar"]["median_cycle_s"] / result["direct"]["median_cycle_s"]
    print(f"median cycle: invar {result['invar']['median_cycle_s']:.3f} s, direct "
          f"{result['direct']['median_cycle_s']:.3f} s, invar/direct {result['invar_over_direct']:.4f}; "
          "checkpoints identical")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
