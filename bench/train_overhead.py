"""What a training cycle costs through Invar against a direct runner doing the same cycle in one process.

    .venv/bin/python bench/train_overhead.py [--config configs/arith-mlx.toml] [--cycles 3] [--reps 3]
                                             [--model DIR] [--per-cycle N] [--json OUT] [--device cpu|cuda]
                                             [--drivers invar,direct,...] [--baseline SRC]

Both drivers run the same cycles of the same configuration (cycles, model and prompts per cycle overridable):

- **invar**: `invar train CONFIG --run DIR` (core, worker processes, protocol, records, the core's recomputation of
  rewards, advantages and the objective, the checkpoint check, publication). Per cycle: from the record that
  published the cycle before to the one that publishes it (the first cycle: from its start, as the run records its
  phases; start-up excluded). Since 2026-12-06 a cycle's calls start before the cycle before it is published, so its
  recorded phases (generate + learner + publish, the measure before then) no longer add up to it.
- **shared** (with `--drivers ...,shared`): `invar train` with `rollout.layout = "shared"`: the same, but one worker
  process serves both roles, each on its own channel (docs/training.md, "Where the roles run").
- **shared-full** (with `--drivers ...,shared-full`): the shared layout with the run store syncing every record to
  the disk (SQLite `synchronous=FULL`, as the store did before 2026-12-05) instead of only the closing record
  (`invar.records.store.SYNCHRONOUS`): what the records' syncs cost a cycle, measured beside the shipped store.
- **shared-base** (with `--drivers ...,shared-base --baseline SRC`): the shared layout run from another checkout's
  `src` (the tree before a change, e.g. /tmp/base/src), launched through that checkout's copy of this file as
  `shared` is, its workers importing that checkout's core: the tree before and after a change, side by side.
- **direct**: one Python process imports the worker engine classes (`workers.<engine>_worker.Engine`, an inference
  and a learner instance) and runs each cycle's calls with the same params: load the last checkpoint as the policy,
  generate, the core's rewards and advantages (a runner must compute them too), one learner step that saves the
  checkpoint, the checkpoint's digest (the name the next cycle loads it by). No protocol, no records, no
  recomputation, no checkpoint check. Per cycle: from the end of the cycle before (the first: from its start).

The direct runner must publish the same checkpoint digests as Invar, cycle by cycle (same engines, same params): the
benchmark refuses to report otherwise. Repetitions alternate the drivers' order and run back to back; cycle n of
repetition r through each driver is a pair. Reported: the median cycle time of each driver (over every cycle of every
repetition) with min and max, the ratio of the medians, the median per-pair ratio and the ratio of the paired totals
with 95 % bootstrap intervals, the steady cycles' (each repetition's after its first) ratio of totals with its
interval twice (pairs resampled, and whole repetitions resampled, `by_repetition`: the honest one where the machine's
speed drifts between repetitions; `--pool JSON...` runs nothing and pools earlier runs' JSONs the same way), each
phase's median (invar: generate, learner, publish as its run records them;
direct: generate, learner), and the publish phase (Invar's alone) against the cycle. The bench keeps the niceness it
was started with unless `--nice N` adds N to it (a negative N, a higher priority, needs root; before 2026-12-05 the
default was −10, which raised a root bench above whatever else ran) and sets the BLAS/OpenMP thread variables to 1
unless set; every driver inherits both.

`--device cuda` (Hugging Face only) runs both drivers' engines on the GPU. A training configuration has no device
setting (`invar train` starts its workers with their defaults: the CPU), so for cuda the bench runs `invar train`
in a process of its own that gives every worker the launch setting `device = "cuda"` (each worker declares it in
its identity, recorded in the run) and is otherwise the command itself; the direct runner builds both engine
classes with that device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
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
from invar.protocol import Role  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.records.store import DB_NAME  # noqa: E402
from invar.runner import train as tr  # noqa: E402
from invar.runner.engine import ADAPTER_NAME  # noqa: E402

sys.path.append(str(REPO / "bench"))  # last: the direct runner runs with -P; bench/workers.py must not shadow workers
from overhead import TreeCpu, handler, torch_as_the_worker, tree_cpu_s  # noqa: E402
from report import write_json  # noqa: E402

DIRECT_BACKENDS = ("mlx", "hf")
DRIVERS = ("invar", "direct", "split", "shared", "shared-full", "shared-base")
"""split: the direct runner with its learner engine in a second process, Invar's process layout without Invar;
shared: `invar train` with both roles in one worker process (`rollout.layout = "shared"`); shared-full: the same with
every record synced to the disk; shared-base: the shared layout run from another checkout (`--baseline`, the tree
before a change), launched as `shared` is."""
SYNCHRONOUS = {"shared": "NORMAL", "shared-full": "FULL", "shared-base": "NORMAL"}
"""The run store's `synchronous` setting of the drivers that set it (both launched the same way, through this
file, so that only the setting differs between them)."""
DEFAULT_DRIVERS = ("invar", "direct", "split")


def write_config(source: Path, out: Path, cycles: int, model: Path | None, per_cycle: int | None,
                 layout: str | None = None) -> Path:
    """The configuration with its paths made absolute and the overrides applied."""
    data = tomllib.loads(source.read_text())
    if layout is not None:
        data.setdefault("rollout", {})["layout"] = layout
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


def _engine(backend: str, role: str, device: str) -> Any:
    """One worker engine class instance (`role`: inference or learner), set up as the worker's `main` sets it up."""
    if backend == "mlx":
        from invar.workers import mlx_worker

        return mlx_worker.Engine(Role(role))
    torch_as_the_worker()
    from invar.workers import hf_worker

    return hf_worker.Engine(Role(role), device)


def _serve_learner(conn: Any, backend: str, device: str) -> None:
    """The split runner's second process: a learner engine answering (method, params) sent over a pipe."""
    learner = _engine(backend, "learner", device)
    while True:
        method, params = conn.recv()
        if method is None:
            return
        conn.send(handler(learner, method)(params))


@contextlib.contextmanager
def _learner(backend: str, device: str, split: bool) -> Iterator[Callable[[str, dict[str, Any]], Any]]:
    """Call the learner engine's methods: in this process, or (split) in a second process over a pipe, pickled."""
    if not split:
        learner = _engine(backend, "learner", device)
        yield lambda method, params: handler(learner, method)(params)
        return
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve_learner, args=(theirs, backend, device), daemon=True)
    proc.start()

    def call(method: str, params: dict[str, Any]) -> Any:
        ours.send((method, params))
        return ours.recv()

    try:
        yield call
    finally:
        ours.send((None, None))
        proc.join(30)


def launch_train_workers_on(device: str) -> None:
    """From now on in this process, `invar train` starts every worker with the launch setting `device`."""
    import dataclasses

    from invar.runner import engine as engine_mod
    from invar.runner import train as train_mod

    spec = engine_mod.EngineSpec

    def on_device(*args: Any, **kwargs: Any) -> Any:
        made = spec(*args, **kwargs)
        return dataclasses.replace(made, settings={**made.settings, "device": device})

    vars(train_mod)["EngineSpec"] = on_device  # the name train's own code calls


def invar_train_on(device: str, synchronous: str, argv: list[str]) -> int:
    """`invar train` with every worker launched on `device` (a training configuration has no such setting) and the
    run store committing each record with SQLite's `synchronous` setting `synchronous` ("-": the store's own)."""
    from invar.cli.app import main as cli_main
    from invar.records import store as store_mod

    if device != "cpu":
        launch_train_workers_on(device)
    if synchronous != "-":
        store_mod.SYNCHRONOUS = synchronous
    sys.argv = ["invar", *argv]
    cli_main()
    return 0


def run_direct(config: Path, out: Path, device: str = "cpu", split: bool = False) -> dict[str, Any]:
    """Every cycle of the configuration in this process (as `invar train` runs it, without Invar); `split`: with the
    learner engine in a second process (a pipe and pickle, nothing of Invar's)."""
    p = tr.plan(config)  # once: it hashes the model folder
    with _learner(p.config.backend, device, split) as learner:
        return _direct_cycles(p, out, device, learner)


def _direct_cycles(p: tr.Plan, out: Path, device: str, learner: Callable[[str, dict[str, Any]], Any]) \
        -> dict[str, Any]:
    cfg = p.config
    out.mkdir(parents=True)
    inference = _engine(cfg.backend, "inference", device)
    load = {"model_dir": str(p.model), "model_digest": p.model_digest, "dtype": cfg.dtype, "quantization": "none",
            "adapter": None}
    handler(inference, "load_model")(load)
    generate = handler(inference, "generate")
    learner("load_model", load)
    with_reference = cfg.objective.kl_coef > 0
    digests: list[str] = []
    seconds: list[float] = []
    phases: list[dict[str, float]] = []
    policy: Path | None = None
    cpu: list[float] = []
    c_end = t_end = None
    for n in range(cfg.cycles):
        c0, t0 = tree_cpu_s(os.getpid()), time.perf_counter()
        if t_end is None or c_end is None:  # the first cycle: from its start; a later one: from the last one's end
            c_end, t_end = c0, t0
        if policy is not None:
            handler(inference, "load_adapter")({"name": ADAPTER_NAME, "path": str(policy), "digest": digests[-1]})
        prompts = cyc.cycle_prompts(p.prompts, cfg.prompts.per_cycle, cfg.seed, n)
        requests = cyc.rollout_requests(prompts, cfg.rollout.group_size, cfg.seed, n, cfg.rollout.temperature,
                                        cfg.rollout.max_tokens, p.vocab)
        gen = generate(cyc.generate_params(requests, cfg.rollout.batch_size,
                                           None if policy is None else ADAPTER_NAME,
                                           "base" if with_reference else None))
        samples = cyc.read_rollout(gen, requests, cycle=n, model_digest=p.model_digest,
                                   policy_digest=digests[-1] if digests else None, reference=with_reference,
                                   vocab_size=p.vocab.size)
        units = [u for u in prompts for _ in range(cfg.rollout.group_size)]
        adv = group_advantages(cyc.rewards(samples, units, p.scorer, p.vocab), cfg.rollout.group_size,
                               cfg.advantage.normalization, cfg.advantage.eps)
        save = out / f"cycle-{n:06d}"
        t1 = time.perf_counter()
        learner("learner_step", tr.learner_step_params(p, samples, adv.values, save).to_wire())
        t2 = time.perf_counter()
        digests.append(canonical.tree_digest(str(save)))  # the checkpoint the next cycle loads, named
        policy = save
        c, t = tree_cpu_s(os.getpid()), time.perf_counter()
        cpu.append(c - c_end)
        seconds.append(t - t_end)
        c_end, t_end = c, t
        phases.append({"generate": t1 - t0, "learner": t2 - t1})
    return {"cycle_s": seconds, "cycle_cpu_s": cpu, "phases_s": phases, "digests": digests}


def run_invar(config: Path, run: Path, device: str = "cpu", synchronous: str | None = None,
              tree: Path = REPO) -> dict[str, Any]:
    """`invar train` in its own process (`synchronous`: the run store's setting, None for the store's own, launched
    as the command itself); its process tree's CPU time is sampled every 20 ms while it runs. `tree`: the checkout
    whose `src` it runs (through that checkout's copy of this file, which puts its `src` first on the path; the
    workers import the core the command imports)."""
    samples: list[tuple[int, float]] = []
    log = run.with_name(run.name + ".log")
    command = [str(config), "--run", str(run), "--json"]
    launch = ([sys.executable, "-m", "invar.cli", "train"] if device == "cpu" and synchronous is None else
              [sys.executable, str(tree / "bench" / Path(__file__).name), "--invar-train-on", device,
               synchronous or "-", "train"])
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([*launch, *command], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        meter = TreeCpu(proc.pid)
        while proc.poll() is None:
            samples.append((time.time_ns(), meter()))
            time.sleep(0.02)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench/train_overhead.py: invar train failed: {log.read_text().strip()[-2000:]}")
    with RunStore.open(run) as store:
        meta = store.meta()
    keys = sorted(k for k in meta if k.startswith("cycle-"))
    cycles = [meta[k] for k in keys]
    # A cycle ends when its record is written (the record's time); the CPU the whole tree (core and workers) ran
    # in its window is read off the samples, interpolated.
    ends = {key: at_ns for key, (_, at_ns) in publications(run).items()}
    at = np.array([t for t, _ in samples], dtype=np.float64)
    used = np.array([c for _, c in samples])
    # A cycle lasts from the previous cycle's publication record to its own (the first, from its start as the run
    # records it): the next cycle's calls start before a cycle is published, so its phases no longer add up to it.
    finished = [float(ends[key]) for key in keys]
    starts = [finished[0] - sum(cycles[0]["wall_s"].values()) * 1e9, *finished[:-1]]
    cpu = [float(np.interp(end, at, used) - np.interp(start, at, used))
           for start, end in zip(starts, finished, strict=True)]
    # The core's time outside its calls: the cycle less each call's round trip as the core recorded it (the call's
    # record written before it is sent, the report's when it was read back), for the calls made within the cycle.
    with RunStore.open(run) as store:
        trips = [(c.at_ns, c.report.at_ns) for c in store.calls() if c.report is not None]
    outside = []
    for start, end in zip(starts, finished, strict=True):
        outside.append((end - start - _covered(trips, start, end)) / 1e9)
    return {"cycle_s": [(end - start) / 1e9 for start, end in zip(starts, finished, strict=True)], "cycle_cpu_s": cpu,
            "phases_s": [c["wall_s"] for c in cycles], "digests": [c["checkpoint"]["digest"] for c in cycles],
            "core_outside_calls_s": outside, "wall_s": wall}


def publications(run: Path) -> dict[str, tuple[int, int]]:
    """Each cycle's publication record in a run: `cycle-NNNNNN` → (its seq, the time the core wrote it, ns)."""
    db = sqlite3.connect(f"file:{run / DB_NAME}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT seq, body, at_ns FROM log WHERE kind = 'meta'").fetchall()
    finally:
        db.close()
    found = {}
    for seq, body, at_ns in rows:
        key = next(iter(canonical.decode(body)))
        if key.startswith("cycle-"):
            found[key] = (seq, at_ns)
    return found


def _covered(spans: list[tuple[int, int]], start: float, end: float) -> float:
    """How much of [start, end] lies in at least one of `spans` (calls under way at once count once: a cycle's
    load and generate calls are sent together)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in spans if b > start and a < end)
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def direct_subprocess(config: Path, out: Path, device: str = "cpu", split: bool = False) -> dict[str, Any]:
    """The direct runner (`split`: its learner in a second process) in a process of its own, watched as `run_invar`
    watches `invar train`: its process tree's CPU sampled every 20 ms (the samples are not needed here; taking them
    costs every driver the same)."""
    log = out.with_name(out.name + ".log")
    t0 = time.perf_counter()
    with open(log, "w") as err, tempfile.TemporaryFile("w+") as got:
        command = [sys.executable, "-P", str(Path(__file__).resolve()), "--direct", str(config), "--out", str(out),
                   "--device", device, *(["--split"] if split else [])]
        proc = subprocess.Popen(command, stdout=got, stderr=err, text=True,
                                cwd=REPO, env=worker_env())
        meter = TreeCpu(proc.pid)
        while proc.poll() is None:
            meter()
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        got.seek(0)
        stdout = got.read()
    if proc.returncode != 0:
        raise SystemExit(f"bench/train_overhead.py: the direct runner failed: {log.read_text().strip()[-2000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def steady(runs: list[dict[str, Any]], key: str = "cycle_s") -> np.ndarray:
    """Every repetition's cycles after its first (which carries the start-up): the cycles a long run repeats."""
    return np.array([s for r in runs for s in r[key][1:]])


def paired(invar: np.ndarray, direct: np.ndarray, resamples: int = 4000) -> dict[str, Any]:
    """Per-pair ratios with 95 % percentile-bootstrap intervals (pairs resampled whole)."""
    ratios = invar / direct
    idx = np.random.default_rng(0).integers(0, len(ratios), size=(resamples, len(ratios)))
    med = np.median(ratios[idx], axis=1)
    total = invar[idx].sum(axis=1) / direct[idx].sum(axis=1)
    return {"pairs": len(ratios), "median_ratio": float(np.median(ratios)),
            "median_ratio_ci95": [float(np.percentile(med, 2.5)), float(np.percentile(med, 97.5))],
            "total_ratio": float(invar.sum() / direct.sum()),
            "total_ratio_ci95": [float(np.percentile(total, 2.5)), float(np.percentile(total, 97.5))],
            "mean_diff_s": float((invar - direct).mean()), "ratios": ratios.tolist()}


def _by_whole_repetitions(runs: list[tuple[np.ndarray, np.ndarray]], resamples: int = 4000) -> dict[str, Any]:
    """The ratio of totals over runs given as (numerator, denominator) steady-cycle sums per repetition, with a 95 %
    percentile-bootstrap interval that resamples whole repetitions within each run (runs are strata)."""
    rng = np.random.default_rng(0)
    num_total, den_total = np.zeros(resamples), np.zeros(resamples)
    for a, b in runs:
        idx = rng.integers(0, len(a), size=(resamples, len(a)))
        num_total += a[idx].sum(axis=1)
        den_total += b[idx].sum(axis=1)
    total = num_total / den_total
    return {"repetitions": sum(len(a) for a, _ in runs),
            "total_ratio": float(sum(a.sum() for a, _ in runs) / sum(b.sum() for _, b in runs)),
            "total_ratio_ci95": [float(np.percentile(total, 2.5)), float(np.percentile(total, 97.5))]}


def by_repetition(num: list[dict[str, Any]], den: list[dict[str, Any]], resamples: int = 4000) -> dict[str, Any]:
    """The steady cycles' ratio of totals with a 95 % percentile-bootstrap interval that resamples whole repetitions:
    a repetition's cycles run back to back, so they share the machine's state of those seconds (its speed drifts by
    tens of percent over minutes here), and resampling them as independent pairs understates the interval."""
    a = np.array([sum(r["cycle_s"][1:]) for r in num])
    b = np.array([sum(r["cycle_s"][1:]) for r in den])
    return {**_by_whole_repetitions([(a, b)], resamples), "ratios": (a / b).tolist()}


def pooled(files: list[Path], num: str = "shared", den: str = "direct", resamples: int = 4000) -> dict[str, Any]:
    """`by_repetition` over several runs' JSONs together, resampling whole repetitions within each run (runs on
    different days are strata)."""
    runs = []
    for f in files:
        d = json.loads(f.read_text())
        reps, cycles = int(d["reps"]), int(d["cycles"])
        runs.append((np.array(d[num]["cycle_s"]).reshape(reps, cycles)[:, 1:].sum(axis=1),
                     np.array(d[den]["cycle_s"]).reshape(reps, cycles)[:, 1:].sum(axis=1)))
    return {"runs": [str(f) for f in files], **_by_whole_repetitions(runs, resamples),
            "per_run": [float(a.sum() / b.sum()) for a, b in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "arith-mlx.toml")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="another model folder (e.g. bench/overhead.py's)")
    parser.add_argument("--per-cycle", type=int, default=None, help="prompts per cycle (default: the config's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both drivers' engines run (cuda: Hugging Face only)")
    parser.add_argument("--direct", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--invar-train-on", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--split", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--drivers", default=",".join(DEFAULT_DRIVERS),
                        help="comma-separated, invar and direct first, of: " + ", ".join(DRIVERS))
    parser.add_argument("--baseline", type=Path, default=None,
                        help="with the shared-base driver: the src folder of the checkout it runs (e.g. /tmp/base/src)")
    parser.add_argument("--nice", type=int, default=0,
                        help="added to the niceness of the bench and its drivers (a negative value needs root)")
    parser.add_argument("--pool", type=Path, nargs="+", default=None, metavar="JSON",
                        help="run nothing: the shared/direct steady ratio over these runs' JSONs together, resampled "
                             "by whole repetition within each run")
    if argv is None and len(sys.argv) > 3 and sys.argv[1] == "--invar-train-on":
        return invar_train_on(sys.argv[2], sys.argv[3], sys.argv[4:])  # before parsing: the rest is invar's
    args = parser.parse_args(argv)
    if args.pool is not None:
        got = pooled(args.pool)
        print(f"shared/direct over {len(args.pool)} runs, {got['repetitions']} repetitions: {got['total_ratio']:.4f} "
              f"({got['total_ratio_ci95'][0]:.4f}-{got['total_ratio_ci95'][1]:.4f}); per run "
              + ", ".join(f"{r:.4f}" for r in got["per_run"]))
        write_json(args.json, got)
        return 0
    drivers = args.drivers.split(",")
    if drivers[:2] != ["invar", "direct"] or not set(drivers) <= set(DRIVERS) or len(set(drivers)) != len(drivers):
        parser.error(f"--drivers {args.drivers}: give invar,direct, optionally followed by split, shared, "
                     "shared-full and shared-base")
    if ("shared-base" in drivers) != (args.baseline is not None):
        parser.error("the shared-base driver and --baseline SRC go together")
    base_tree = REPO if args.baseline is None else args.baseline.resolve().parent
    if args.direct is not None:
        print(json.dumps(run_direct(args.direct, args.out, args.device, args.split)))
        return 0
    # Both drivers' processes inherit these: the same priority and the same threads, so neither is favoured.
    if args.nice:
        with contextlib.suppress(PermissionError):
            os.nice(args.nice)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="invar-train-overhead-") as tmp:
        folder = Path(tmp)
        config = write_config(args.config, folder / "config.toml", args.cycles, args.model, args.per_cycle)
        shared = write_config(args.config, folder / "config-shared.toml", args.cycles, args.model, args.per_cycle,
                              layout="shared")
        configs = {"invar": config, "shared": shared, "shared-full": shared, "shared-base": shared}
        backend = tomllib.loads(config.read_text())["backend"]
        if backend not in DIRECT_BACKENDS:
            parser.error(f"the direct runner drives {', '.join(DIRECT_BACKENDS)}; the config's backend is {backend}")
        if args.device == "cuda" and backend != "hf":
            parser.error(f"--device cuda runs Hugging Face only; the config's backend is {backend}")
        runs: dict[str, list[dict[str, Any]]] = {d: [] for d in drivers}
        for rep in range(args.reps):
            # Each repetition runs every driver once, in an order rotated (and with two, alternated) rep by rep.
            order = drivers[rep % len(drivers):] + drivers[:rep % len(drivers)]
            for driver in order:
                where = folder / f"{driver}-{rep}"
                got = (run_invar(configs[driver], where, args.device, SYNCHRONOUS.get(driver),
                                 base_tree if driver == "shared-base" else REPO) if driver in configs else
                       direct_subprocess(config, where, args.device, split=driver == "split"))
                runs[driver].append(got)
                print(f"rep {rep + 1}/{args.reps} {driver}: cycles " +
                      ", ".join(f"{s:.2f}" for s in got["cycle_s"]) + " s, CPU " +
                      ", ".join(f"{s:.2f}" for s in got["cycle_cpu_s"]) + f" s (process {got['wall_s']:.1f} s)",
                      flush=True)
        digests = {json.dumps(r["digests"]) for rs in runs.values() for r in rs}
        if len(digests) != 1:
            raise SystemExit("bench/train_overhead.py: invar and the direct runner published different checkpoints")
    result: dict[str, Any] = {"device": args.device, "config": str(args.config), "backend": backend,
                              "cycles": args.cycles,
                              "reps": args.reps, "model": str(args.model or "config's"),
                              "per_cycle": args.per_cycle, "same_checkpoints": True, "cpus": os.cpu_count(),
                              "niceness": os.nice(0), "load_at_start": load_at_start, "load_at_end": os.getloadavg(),
                              **({"baseline": str(args.baseline)} if args.baseline is not None else {})}
    for driver, rs in runs.items():
        xs = [s for r in rs for s in r["cycle_s"]]
        phases = {k: [ph[k] for r in rs for ph in r["phases_s"]] for k in rs[0]["phases_s"][0]}
        result[driver] = {"median_cycle_s": float(np.median(xs)), "min_cycle_s": min(xs), "max_cycle_s": max(xs),
                          "cycle_s": [r["cycle_s"] for r in rs], "cycle_cpu_s": [r["cycle_cpu_s"] for r in rs],
                          "median_phase_s": {k: float(np.median(v)) for k, v in phases.items()},
                          "process_wall_s": [r["wall_s"] for r in rs]}
    result["invar_over_direct"] = result["invar"]["median_cycle_s"] / result["direct"]["median_cycle_s"]
    # Pairs: cycle n of repetition r through each driver (the two ran back to back, in alternating order).
    inv = np.array([s for r in runs["invar"] for s in r["cycle_s"]])
    dir_ = np.array([s for r in runs["direct"] for s in r["cycle_s"]])
    result["paired"] = paired(inv, dir_)
    # The same pairs in CPU time (every process of each driver): far steadier than wall time under other load.
    result["paired_cpu"] = paired(np.array([s for r in runs["invar"] for s in r["cycle_cpu_s"]]),
                                  np.array([s for r in runs["direct"] for s in r["cycle_cpu_s"]]))
    # Invar's own steps, timed inside its cycle: the publish phase is all Invar's (the direct runner has none).
    publish = [ph["publish"] for r in runs["invar"] for ph in r["phases_s"]]
    result["publish_s"] = {"median": float(np.median(publish)), "min": min(publish), "max": max(publish),
                           "share_of_invar_cycle": float(np.median(np.array(publish) / inv))}
    # With the split runner: how much of invar/direct is the process layout (split/direct: two engine processes
    # taking turns, no Invar) and how much is Invar's own (invar/split: the same layout, with Invar).
    # With the shared layout: what one worker process for both roles costs against the direct runner
    # (shared/direct), and what it saves against two (shared/invar).
    pairs: dict[str, tuple[str, str]] = {}
    if "split" in runs:
        pairs |= {"invar_over_split": ("invar", "split"), "split_over_direct": ("split", "direct")}
    if "shared" in runs:
        pairs |= {"shared_over_direct": ("shared", "direct"), "shared_over_invar": ("shared", "invar")}
    # With shared-base: the shared layout of the tree before a change, against the direct runner and the tree after.
    if "shared-base" in runs:
        pairs |= {"shared_base_over_direct": ("shared-base", "direct")}
        if "shared" in runs:
            pairs |= {"shared_over_shared_base": ("shared", "shared-base")}
    # With shared-full: what syncing every record costs (shared-full/shared) and where that layout stood.
    if "shared-full" in runs:
        pairs |= {"shared_full_over_direct": ("shared-full", "direct")}
        if "shared" in runs:
            pairs |= {"shared_full_over_shared": ("shared-full", "shared")}
    for name, (num, den) in pairs.items():
        result["paired_" + name] = paired(np.array([s for r in runs[num] for s in r["cycle_s"]]),
                                          np.array([s for r in runs[den] for s in r["cycle_s"]]))
        result["paired_cpu_" + name] = paired(np.array([s for r in runs[num] for s in r["cycle_cpu_s"]]),
                                              np.array([s for r in runs[den] for s in r["cycle_cpu_s"]]))
        if args.cycles >= 3:
            # The second cycle of each repetition: the one a long run repeats (the first carries the start-up, the
            # last the shared process's exit, which can take CPU out of its window).
            result["paired_cpu_second_" + name] = paired(np.array([r["cycle_cpu_s"][1] for r in runs[num]]),
                                                         np.array([r["cycle_cpu_s"][1] for r in runs[den]]))
        q = result["paired_" + name]
        line = (f"{num}/{den}: total ratio {q['total_ratio']:.4f} ({q['total_ratio_ci95'][0]:.4f}-"
                f"{q['total_ratio_ci95'][1]:.4f}), CPU {result['paired_cpu_' + name]['total_ratio']:.4f}")
        if args.cycles >= 2:
            q = result["paired_steady_" + name] = paired(steady(runs[num]), steady(runs[den]))
            r = result["steady_by_repetition_" + name] = by_repetition(runs[num], runs[den])
            line += (f"; steady cycles ({q['pairs']} pairs) {q['total_ratio']:.4f} ({q['total_ratio_ci95'][0]:.4f}-"
                     f"{q['total_ratio_ci95'][1]:.4f}; by whole repetition {r['total_ratio_ci95'][0]:.4f}-"
                     f"{r['total_ratio_ci95'][1]:.4f}), {q['mean_diff_s'] * 1e3:+.1f} ms a cycle")
        print(f"{line}; phases {num} {result[num]['median_phase_s']}")
    outside = [s for r in runs["invar"] for s in r["core_outside_calls_s"]]
    result["core_outside_calls_s"] = {"median": float(np.median(outside)), "min": min(outside), "max": max(outside),
                                      "share_of_invar_cycle": float(np.median(np.array(outside) / inv))}
    for name in ("shared", "shared-full", "shared-base"):
        if name in runs:
            out_shared = [s for r in runs[name] for s in r["core_outside_calls_s"]]
            result[name]["core_outside_calls_s"] = {"median": float(np.median(out_shared)), "min": min(out_shared),
                                                    "max": max(out_shared)}
    print(f"invar's core outside its calls: median {np.median(outside) * 1e3:.1f} ms a cycle "
          f"({min(outside) * 1e3:.1f}-{max(outside) * 1e3:.1f})")
    p = result["paired"]
    print(f"median cycle: invar {result['invar']['median_cycle_s']:.3f} s, direct "
          f"{result['direct']['median_cycle_s']:.3f} s, invar/direct {result['invar_over_direct']:.4f}; "
          f"paired ({p['pairs']} cycles): median ratio {p['median_ratio']:.4f} "
          f"({p['median_ratio_ci95'][0]:.4f}-{p['median_ratio_ci95'][1]:.4f}), total ratio {p['total_ratio']:.4f} "
          f"({p['total_ratio_ci95'][0]:.4f}-{p['total_ratio_ci95'][1]:.4f}); CPU time: total ratio "
          f"{result['paired_cpu']['total_ratio']:.4f} ({result['paired_cpu']['total_ratio_ci95'][0]:.4f}-"
          f"{result['paired_cpu']['total_ratio_ci95'][1]:.4f}); publish phase "
          f"{result['publish_s']['median']:.3f} s; phases invar {result['invar']['median_phase_s']}, direct "
          f"{result['direct']['median_phase_s']}; checkpoints identical")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
