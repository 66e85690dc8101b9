"""Where Invar's own CPU goes in a training cycle, by category, in the core and in the worker, timed in place.

    .venv/bin/python bench/train_cost_breakdown.py [--config configs/arith-hf.toml] [--cycles 9]
                                                   [--layout shared] [--json OUT]
    .venv/bin/python bench/train_cost_breakdown.py --codec RUN [--json OUT]

One `invar.runner.train.train` of the configuration (`--cycles`, `rollout.layout` as given) in a process of its own,
its workers started through a wrapper that times the same way. Every step of the protocol and of the core's cycle
is wrapped with a timer of the thread that runs it (`time.thread_time`: CPU only, a wait for the worker or for a
CPU costs nothing), exclusive of the wrapped steps it calls, so the categories add up:

- core: `encode` (canonical encoding of a call), `digest` (sha256 of a call's bytes), `record` (the run store's
  call, report and metadata records), `write`/`read` (frames on the pipes; read includes hashing the report as it
  arrives), `decode` (canonical decoding of a report), `report check` (the report's envelope, `Report.from_wire`,
  and the rest of accepting it), `to_wire` (the params structs' maps), `validate` (the results read through their
  structs), `rollout`/`learner report` (`read_rollout`, `read_learner`), `objective` (`loss_terms`,
  `compare_objective`, `gap`), `checkpoint check`, `runner's too` (the prompt choice, the requests, rewards and
  advantages: work the direct runner does as well), and `other` (the cycle's own thread outside all of those);
- worker: `read` (frames, with the call's hash), `decode`, `call check` (`Call.from_wire`), `from_wire`/`to_wire`
  (the params and result structs, which the direct runner's handler runs too), `encode` (the report), `write`,
  `engine` (the method itself: what the direct runner runs), and `server` (the serving loop outside those).

Per cycle the bench also reads each thread's CPU (Linux schedstat) in both processes, by thread name, so the
transport's threads (the core's report readers, the worker's serving threads) show whole. The first cycle pays
one-off costs and is reported apart; the figures are medians of the later cycles. The timers' own cost (two clock
reads per wrapped call, some 2,000 calls a cycle) is in the thread totals, not in the categories.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
# Last, and named: the wrapped workers run this file with -P, which puts no script folder on the path (and
# bench/workers.py must not shadow the package's workers).
sys.path.append(str(REPO / "bench"))

from report import write_json  # noqa: E402

TOTALS: defaultdict[str, float] = defaultdict(float)
COUNTS: defaultdict[str, int] = defaultdict(int)
_LOCAL = threading.local()


def timed(function: Callable[..., Any], category: str) -> Callable[..., Any]:
    """`function` with its thread's CPU time added to `category`, less the time of the timed steps it calls."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        stack: list[float] | None = getattr(_LOCAL, "stack", None)
        if stack is None:
            stack = _LOCAL.stack = []
        stack.append(0.0)
        t0 = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent = time.thread_time() - t0
            inner = stack.pop()
            TOTALS[category] += spent - inner
            COUNTS[category] += 1
            if stack:
                stack[-1] += spent

    return run


def time_gc() -> None:
    """Count the cyclic garbage collector's passes as categories of their own (`gc 0`, `gc 1`, `gc 2`), taken out
    of the step they interrupted."""
    import gc

    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.thread_time())
            return
        spent = time.thread_time() - started.pop()
        TOTALS[f"gc {info['generation']}"] += spent
        COUNTS[f"gc {info['generation']}"] += 1
        stack: list[float] | None = getattr(_LOCAL, "stack", None)
        if stack:
            stack[-1] += spent

    gc.callbacks.append(callback)


def wrap(owner: Any, name: str, category: str) -> None:
    """Time `owner.name` (a module's function, or a class's function, classmethod or staticmethod)."""
    raw = vars(owner).get(name) if isinstance(owner, type) else None
    if isinstance(raw, classmethod):
        setattr(owner, name, classmethod(timed(raw.__func__, category)))
    elif isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(timed(raw.__func__, category)))
    else:
        setattr(owner, name, timed(getattr(owner, name), category))


def threads_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name (threads Python did not start: `native`)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: defaultdict[str, float] = defaultdict(float)
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        name = names.get(int(task), "native")
        out[name.rsplit("-", 1)[0] if name.startswith("Thread-") else name] += ns / 1e9
    return dict(out)


def snapshot() -> dict[str, Any]:
    return {"categories": dict(TOTALS), "counts": dict(COUNTS), "threads": threads_cpu(),
            "process": time.process_time()}


def _protocol_steps(side: str) -> None:
    """Time the protocol's steps as `side` (core or worker) runs them."""
    from invar import canonical
    from invar.protocol import frames, payloads
    from invar.protocol.messages import Call, Report

    time_gc()
    wrap(canonical, "encode_parts", "encode")
    wrap(frames, "write_parts", "write")
    wrap(frames, "read_frame", "read")
    wrap(frames, "decode_payload", "decode")
    for cls in (payloads.GenerateParams, payloads.LearnerStepParams, payloads.LoadAdapterParams,
                payloads.GenerateResult, payloads.LearnerStepResult, payloads.LoadAdapterResult):
        wrap(cls, "to_wire", "to_wire")
        wrap(cls, "from_wire", "from_wire" if side == "worker" else "validate")
    if side == "worker":
        wrap(Call, "from_wire", "call check")
    else:
        wrap(Report, "from_wire", "report check")


def install_core() -> None:
    from invar import canonical
    from invar.loop import cycle as cyc
    from invar.records import store as store_mod
    from invar.runner import train as tr
    from invar.transport import client

    _protocol_steps("core")
    wrap(canonical, "sha256_parts", "digest")
    for name in ("record_call", "record_report", "put_meta", "call_seq"):
        wrap(store_mod.RunStore, name, "record")
    wrap(client.WorkerClient, "_accept", "report check")
    wrap(client.WorkerClient, "submit", "submit")
    for name in ("read_rollout",):
        wrap(cyc, name, "rollout")
    wrap(cyc, "read_learner", "learner report")
    for name in ("loss_terms", "check_checkpoint"):
        wrap(tr, name, "objective" if name == "loss_terms" else "checkpoint check")
    for name in ("compare_objective", "gap"):
        wrap(cyc, name, "objective")
    for name in ("cycle_prompts", "rollout_requests", "rewards", "generate_params"):
        wrap(cyc, name, "runner's too")
    wrap(tr, "group_advantages", "runner's too")
    wrap(tr, "learner_step_params", "learner params")


def install_worker(log: str) -> None:
    from invar.protocol import server

    _protocol_steps("worker")
    answer = server.Server._answer

    def answered(self: Any, call: Any, call_digest: str) -> Any:
        method = self.methods.get(call.method)
        if method is not None and not getattr(method, "_timed", False):
            self.methods[call.method] = timed(method, f"engine {call.method}")
            self.methods[call.method]._timed = True
        try:
            return answer(self, call, call_digest)
        finally:
            with open(log, "a") as out:
                out.write(json.dumps({"method": call.method, **snapshot()}) + "\n")

    server.Server._answer = timed(answered, "server")  # type: ignore[method-assign]


def worker_main(log: str, module: str, argv: list[str]) -> int:
    """A worker, its steps timed, each call's totals appended to `log` as a JSON line."""
    import importlib

    install_worker(log)
    mod = importlib.import_module(module)
    sys.modules["__main__"] = mod  # what the worker's identity reads its code from
    sys.argv = [str(mod.__file__), *argv]
    code: int = mod.main(argv)
    return code


def one_run(config: Path, run: Path, log: str) -> dict[str, Any]:
    from invar import engines
    from invar.runner import train as tr

    install_core()
    argv_of = engines.worker_argv

    def wrapped_argv(engine: str, role: Any, args: list[str] | None = None) -> list[str]:
        line = argv_of(engine, role, args)
        at = line.index("-m")
        return [*line[:at], str(Path(__file__).resolve()), "--worker", log, line[at + 1], "--", *line[at + 2:]]

    engines.worker_argv = wrapped_argv
    cycles: list[dict[str, Any]] = []
    cycle = tr._cycle

    def each(*args: Any, **kwargs: Any) -> Any:
        before = snapshot()
        t0 = time.perf_counter()
        try:
            return cycle(*args, **kwargs)
        finally:
            cycles.append({"cycle": args[1], "wall_s": time.perf_counter() - t0, "before": before,
                           "after": snapshot()})

    vars(tr)["_cycle"] = each
    tr.train(config, run)
    return {"cycles": cycles}


def direct_run(config: Path, out: Path) -> dict[str, Any]:
    """The direct runner of bench/train_overhead.py in this process, its engine methods and structs timed as the
    worker's are, a snapshot per cycle."""
    import overhead
    import train_overhead

    _protocol_steps("worker")
    handler = overhead.handler

    def timed_handler(engine: Any, method: str) -> Any:
        return timed(handler(engine, method), f"engine {method}")

    vars(train_overhead)["handler"] = timed_handler
    process = time.process_time
    marks: list[dict[str, Any]] = []

    def mark() -> float:
        marks.append(snapshot())
        return process()

    # A snapshot at each cycle's start and end: the runner reads `tree_cpu_s` exactly there.
    vars(train_overhead)["tree_cpu_s"] = lambda pid: mark()
    got = train_overhead.run_direct(config, out)
    return {"cycle_cpu_s": got["cycle_cpu_s"], "marks": marks}


def _best_ms(run: Callable[[], object], n: int = 20, k: int = 7) -> float:
    best = float("inf")
    for _ in range(k):
        t0 = time.process_time()
        for _ in range(n):
            run()
        best = min(best, (time.process_time() - t0) / n)
    return best * 1e3


def codec_costs(run_dir: Path) -> list[dict[str, Any]]:
    """CPU ms to encode and decode each kind of message a training run recorded (its first learner call and report,
    first generate call and report); the generate report and the learner's call and report in both layouts a worker
    speaks, whichever the run recorded: a map per output or sample (`outputs`, `samples`, `proximal_logprobs`) and
    one array per field for the whole batch (`outputs_batch`, `batch`, `proximal_batch`)."""
    import dataclasses

    from invar import canonical
    from invar.protocol.payloads import GenerateResult, LearnerStepParams, LearnerStepResult
    from invar.records import RunStore

    with RunStore.open(run_dir) as store:
        calls = store.calls()
    out = []
    seen: set[str] = set()
    for record in calls:
        method = record.call.method
        if method not in ("generate", "learner_step") or method in seen or record.report is None:
            continue
        seen.add(method)
        call = record.call.to_wire()
        report = record.report.report.to_wire()
        messages = [("call", call), ("report", report)]
        if method == "generate":
            outputs = GenerateResult.from_wire(report["result"])
            messages = [("call", call)] + [
                (f"report, {what}", {**report, "result": dataclasses.replace(outputs, packed=packed).to_wire()})
                for what, packed in (("a map per output", False), ("one array per field", True))]
        if method == "learner_step":
            step = LearnerStepParams.from_wire(call["params"], reductions=("float64-sequence", "float32-microbatch"))
            result = LearnerStepResult.from_wire(report["result"])
            messages = [
                (f"call, {what}", {**call, "params": dataclasses.replace(step, packed=packed).to_wire()})
                for what, packed in (("a map per sample", False), ("one array per field", True))] + [
                (f"report, {what}", {**report, "result": dataclasses.replace(result, packed=packed).to_wire()})
                for what, packed in (("an array per sample", False), ("one array per field", True))]
        for what, message in messages:
            data = canonical.encode(message)
            out.append({"method": method, "message": what, "bytes": len(data),
                        "encode_ms": _best_ms(functools.partial(canonical.encode_parts, message)),
                        "decode_ms": _best_ms(functools.partial(canonical.decode, data))})
    return out


def _diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in sorted(set(a) | set(b))}


def summarize(core: dict[str, Any], worker_lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cycle: the core's categories and threads over the cycle, the worker's over the calls the cycle made."""
    per_cycle = []
    calls = iter(worker_lines)
    last = next(calls)  # load_model of the first role served: before any cycle
    pending = list(calls)
    for c in core["cycles"]:
        cats = _diff(c["before"]["categories"], c["after"]["categories"])
        threads = _diff(c["before"]["threads"], c["after"]["threads"])
        # The worker's lines of this cycle: load_adapter (from cycle 1), generate, learner_step.
        mine = []
        while pending:
            line = pending.pop(0)
            mine.append(line)
            if line["method"] == "learner_step":
                break
        start = last
        for line in mine:
            if line["method"] in ("load_model",):
                start = line
        end = mine[-1] if mine else last
        last = end
        core_process = c["after"]["process"] - c["before"]["process"]
        worker = _diff(start["categories"], end["categories"])
        worker_process = end["process"] - start["process"]
        cats["unattributed"] = core_process - sum(cats.values())
        worker["unattributed"] = worker_process - sum(worker.values())
        per_cycle.append({"cycle": c["cycle"], "wall_s": c["wall_s"],
                          "core": cats, "core_threads": threads, "core_process": core_process,
                          "worker": worker, "worker_threads": _diff(start["threads"], end["threads"]),
                          "worker_process": worker_process,
                          "worker_methods": [line["method"] for line in mine]})
    return {"cycles": per_cycle}


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for r in rows for k in r})
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--worker"]:
        log, module, _, *rest = args_in[1:]
        return worker_main(log, module, rest)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "arith-hf.toml")
    parser.add_argument("--cycles", type=int, default=9)
    parser.add_argument("--layout", choices=["shared", "split"], default="shared")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", nargs=3, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--direct-one", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--codec", type=Path, default=None, metavar="RUN",
                        help="instead: time encoding and decoding the messages a training run (RUN) recorded")
    args = parser.parse_args(args_in)
    if args.one is not None:
        config, run, log = args.one
        print(json.dumps(one_run(Path(config), Path(run), log)))
        return 0
    if args.codec is not None:
        rows = codec_costs(args.codec)
        for row in rows:
            print(f"{row['method']:13s} {row['message']:30s} {row['bytes']:7d} B  encode {row['encode_ms']:6.3f} ms  "
                  f"decode {row['decode_ms']:6.3f} ms")
        write_json(args.json, {"run": str(args.codec), "load": os.getloadavg(), "messages": rows})
        return 0
    if args.direct_one is not None:
        print(json.dumps(direct_run(Path(args.direct_one[0]), Path(args.direct_one[1]))))
        return 0
    from train_overhead import write_config

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="invar-cost-breakdown-") as tmp:
        config = write_config(args.config, Path(tmp) / "config.toml", args.cycles, None, None, layout=args.layout)
        worker_log = Path(tmp) / "worker.jsonl"
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", str(config),
                               str(Path(tmp) / "run"), str(worker_log)], capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            raise SystemExit(f"bench/train_cost_breakdown.py: the run failed: {proc.stderr.strip()[-3000:]}")
        core = json.loads(proc.stdout.strip().splitlines()[-1])
        lines = [json.loads(x) for x in worker_log.read_text().splitlines()]
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--direct-one", str(config),
                               str(Path(tmp) / "direct")], capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            raise SystemExit(f"bench/train_cost_breakdown.py: the direct runner failed: {proc.stderr.strip()[-3000:]}")
        direct = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.layout != "shared":
        raise SystemExit("bench/train_cost_breakdown.py: only the shared layout's worker lines are summed per cycle")
    got = summarize(core, lines)
    marks = direct["marks"]
    got["direct_cycles"] = []
    for n in range(len(marks) // 2):
        a, b = marks[2 * n], marks[2 * n + 1]
        cats = _diff(a["categories"], b["categories"])
        cats["unattributed"] = b["process"] - a["process"] - sum(cats.values())
        got["direct_cycles"].append({"cycle": n, "direct": cats, "direct_process": b["process"] - a["process"]})
    later = [c for c in got["cycles"] if c["cycle"] > 0]
    result = {"config": str(args.config), "cycles": args.cycles, "layout": args.layout,
              "load_at_start": load_at_start, "load_at_end": os.getloadavg(), **got,
              "median_later": {key: medians([c[key] for c in later])
                               for key in ("core", "core_threads", "worker", "worker_threads")}
              | {"core_process": statistics.median(c["core_process"] for c in later),
                 "worker_process": statistics.median(c["worker_process"] for c in later),
                 "direct": medians([c["direct"] for c in got["direct_cycles"][1:]]),
                 "direct_process": statistics.median(c["direct_process"] for c in got["direct_cycles"][1:])}}
    med = result["median_later"]
    for side in ("core", "worker"):
        print(f"{side}: process {med[side + '_process'] * 1e3:.1f} ms a cycle (median of {len(later)})")
        for k, v in sorted(med[side].items(), key=lambda kv: -kv[1]):
            print(f"  {k:18s} {v * 1e3:7.2f} ms")
        for k, v in sorted(med[side + "_threads"].items(), key=lambda kv: -kv[1]):
            print(f"  thread {k:18s} {v * 1e3:7.2f} ms")
    print(f"direct runner: process {med['direct_process'] * 1e3:.1f} ms a cycle")
    for k, v in sorted(med["direct"].items(), key=lambda kv: -kv[1]):
        print(f"  {k:18s} {v * 1e3:7.2f} ms")
    print(f"invar (core + worker) less direct: "
          f"{(med['core_process'] + med['worker_process'] - med['direct_process']) * 1e3:.1f} ms a cycle")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.path.append(str(REPO / "bench"))
    sys.exit(main())
