"""What a forked worker's start costs: CPU from the fork to its first answered generate, per engine, on the shipped
model, as the test suite's fork servers start them.

    .venv/bin/python bench/forked_start.py [--engines hf,mlx,vllm] [--reps 2] [--pairs 2] [--before OTHER/src]
        [--json FILE]

For each engine a fork server (`invar.transport.forkserver`) is started with the environment scripts/test_lanes.py
gives it, and `--reps` workers are forked from it one after another, each: `start_worker` (the handshake),
`load_model` of the shipped model in float32, one greedy generate of 4 tokens, `close`. A forked worker is the
server's child, not this process's, so its CPU (user + system, its own and its waited-for children's) is read from
`/proc/PID/stat` after the handshake, after the load and after the generate; the server's own once it serves (its
imports, paid once per suite). The core's side is this process's CPU over the same steps.

`--before OTHER/src` (another checkout's `src`, e.g. the starting commit's worktree): each pair runs both trees, each
in a fresh process whose `invar` (and so whose fork server and workers) is that tree's, the order alternating (this
tree first on even pairs). Reported per tree and engine: every worker's figures, the median worker CPU, and with
`--before` the median of the per-pair differences of the workers' median CPU. CPU time, since wall time on a shared
machine moves with the load; the load average is kept beside each run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and of the children it waited for (`/proc/PID/stat` fields 14 to 17)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(engine: str, reps: int, folder: Path) -> dict[str, Any]:
    """One tree's run (in a process whose `invar` is that tree's): a fork server of `engine`, `reps` forked starts."""
    from invar import canonical, engines
    from invar.engines import DEFAULT_MODEL, start_worker
    from invar.tasks import ModelTokenizer
    from invar.transport import forkserver

    module = engines.ENGINES[engine]
    folder.mkdir(parents=True)
    log = folder.with_suffix(".log")
    with log.open("wb") as out:
        server = forkserver.start(folder, module, engines.worker_env(None, engine), out)
    try:
        while not forkserver.socket_path(folder, module).exists():
            if server.poll() is not None:
                raise SystemExit(f"forked_start: the {engine} fork server ended: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        server_cpu = _cpu_s(server.pid)
        os.environ[forkserver.ENV] = str(folder)
        params = {"model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
                  "dtype": "float32", "quantization": "none", "adapter": None}
        ids = ModelTokenizer.from_model_dir(DEFAULT_MODEL).prompt_ids(prompt="1+1=")
        request = {"request_id": "start", "prompt": "1+1=", "prompt_ids": ids, "seed": 0, "temperature": 0.0,
                   "top_p": 1.0, "max_tokens": 4}
        workers = []
        for _ in range(reps):
            core, started = _own_cpu_s(), time.monotonic()
            client = start_worker(engine)
            pid = client.identity.pid  # the forked child itself
            handshake = _cpu_s(pid)
            client.call("load_model", params)
            loaded = _cpu_s(pid)
            client.call("generate", {"requests": [request]})
            answered = _cpu_s(pid)
            workers.append({"handshake_cpu_s": handshake, "load_model_cpu_s": round(loaded - handshake, 2),
                            "generate_cpu_s": round(answered - loaded, 2), "worker_cpu_s": answered,
                            "core_cpu_s": round(_own_cpu_s() - core, 3),
                            "wall_s": round(time.monotonic() - started, 2), "load_average": os.getloadavg()[0]})
            client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    forked = [line for line in log.read_text().splitlines() if "workers forked" in line]
    return {"engine": engine, "server_cpu_s": server_cpu, "workers": workers, "server": forked[-1:]}


def digest(engine: str, patch: str | None) -> str:
    import hashlib

    import numpy as np

    from invar import canonical
    from invar.engines import DEFAULT_MODEL, start_worker
    from invar.patches import patch_digest
    from invar.tasks import ModelTokenizer

    os.environ.pop("INVAR_FORKSERVER", None)
    tok = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype}{x.shape}".encode())
            h.update(x.tobytes())
        elif isinstance(x, dict):
            for k in sorted(x):
                h.update(k.encode())
                walk(x[k])
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(json.dumps(x).encode())

    prompts = [f"{a}+{b}=" for a in range(7) for b in range(3)]
    reqs = [{"request_id": f"r{i}", "prompt": p, "prompt_ids": tok.prompt_ids(prompt=p), "seed": i,
             "temperature": [1.0, 0.0, 0.7][i % 3], "top_p": 1.0, "max_tokens": 6} for i, p in enumerate(prompts)]
    args = ["--patch", f"{patch}={patch_digest(patch)}"] if patch else []
    with start_worker(engine, args=args) as w:
        w.call("load_model", {"model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
                              "dtype": "float32", "quantization": "none", "adapter": None})
        generated = w.call("generate", {"requests": reqs})
        walk(generated)
        walk(w.call("generate", {"requests": reqs[:1]}))
        items = [{"item_id": r["request_id"], "prompt_ids": r["prompt_ids"],
                  "response_tokens": np.asarray(out["tokens"], dtype=np.int32), "temperature": r["temperature"] or 1.0,
                  "vocab_steps": [0]} for r, out in zip(reqs, generated["outputs"], strict=True)]
        walk(w.call("score", {"items": items}))
    return h.hexdigest()


def _run_tree(src: Path, engine: str, reps: int, scratch: Path, tag: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("INVAR_FORKSERVER", None)
    done = subprocess.run([sys.executable, __file__, "--inner", engine, "--reps", str(reps),
                           "--folder", str(scratch / tag)], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"forked_start: the {tag} run failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/forked_start.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,mlx,vllm")
    parser.add_argument("--reps", type=int, default=2, help="workers forked per run")
    parser.add_argument("--pairs", type=int, default=2, help="runs of each tree, alternating")
    parser.add_argument("--before", type=Path, default=None, help="another checkout's src/ to compare with")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--digest", default=None, metavar="ENGINE", help="print the output digest of a fresh worker")
    parser.add_argument("--patch", default=None, help="with --digest: the worker runs this patch")
    parser.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.digest:
        print(args.digest, args.patch or "no patch", digest(args.digest, args.patch))
        return 0
    if args.inner:
        print(json.dumps(measure(args.inner, args.reps, args.folder)))
        return 0
    if args.reps < 1 or args.pairs < 1:
        parser.error("--reps and --pairs must be at least 1")
    trees = {"this": REPO / "src", **({"before": args.before} if args.before else {})}
    report: dict[str, Any] = {"reps": args.reps, "pairs": args.pairs, "trees": {k: str(v) for k, v in trees.items()},
                              "engines": {}}
    with tempfile.TemporaryDirectory(prefix="invar-forked-start-") as tmp:
        for engine in [e for e in args.engines.split(",") if e]:
            runs: dict[str, list[dict[str, Any]]] = {tag: [] for tag in trees}
            for pair in range(args.pairs):
                order = list(trees) if pair % 2 == 0 else list(reversed(trees))
                for tag in order:
                    run = _run_tree(trees[tag], engine, args.reps, Path(tmp), f"{engine}-{tag}-{pair}")
                    runs[tag].append(run)
                    cpu = [w["worker_cpu_s"] for w in run["workers"]]
                    print(f"{engine} pair {pair} {tag}: server {run['server_cpu_s']:.2f} CPU-s, workers {cpu} CPU-s "
                          f"(load {run['workers'][-1]['load_average']:.1f})", flush=True)
            summary: dict[str, Any] = {"runs": runs}
            for tag in trees:
                summary[f"{tag}_median_worker_cpu_s"] = statistics.median(
                    w["worker_cpu_s"] for run in runs[tag] for w in run["workers"])
            if "before" in trees:
                summary["median_saving_per_start_cpu_s"] = statistics.median(
                    statistics.median(w["worker_cpu_s"] for w in b["workers"])
                    - statistics.median(w["worker_cpu_s"] for w in t["workers"])
                    for b, t in zip(runs["before"], runs["this"], strict=True))
            report["engines"][engine] = summary
            print(json.dumps({k: v for k, v in summary.items() if k != "runs"}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
