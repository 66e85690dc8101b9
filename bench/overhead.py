"""What running through Invar costs: the same generate calls driven by Invar, by a direct runner, and natively.

    .venv/bin/python bench/overhead.py [--engines hf,mlx,vllm] [--sizes tiny,large] [--reps 5]
                                       [--requests 256] [--json docs/performance/overhead.json]
                                       [--plot docs/performance/overhead.png] [--device cpu|cuda]
                                       [--budget-s SECONDS]

For each engine and model size, three drivers run the same calls (256 seeded prompts of the evaluation population,
T = 1, as a contract's generate calls: one call per 64 requests, once in the pairing layout, batches of 16, and once
in a batch-32 layout):

- **invar**: the core starts the engine's worker (`invar.runner.engine.engine_session`, as `use run` does) and sends
  each call through the protocol; every call and report is recorded in a run store (hash chain, SQLite, fsync'd).
- **direct**: a plain Python process imports the same worker engine class (`workers.<engine>_worker.Engine`) and
  calls `generate` with the same params: no protocol, no records, no second process.
- **native** (vLLM and MLX): the engine's own API on the same loaded model: vLLM `LLM.generate` with its own
  scheduling (every prompt submitted at once, one `SamplingParams` with the request's seed each), MLX
  `mlx_lm.batch_generate` (all prompts at once). Not the same numbers as the worker's (own scheduling and sampler),
  so it answers "what does the engine cost by itself", not "what does Invar add".

Decisions:
- **Paired call by call.** Both drivers are started once and kept. Each round runs every call of every layout as a
  pair: invar's call k, then direct's call k (the next pair in the other order), so both see the same machine
  state within a second or two. A shared 2-core machine varies by 10-40 % between repetitions of one driver;
  pairing at the finest grain is what can resolve a 2 % difference. Reported per layout: the median of the
  per-pair ratios invar/direct and the ratio of the paired totals, each with a 95 % bootstrap interval (pairs
  resampled whole), the mean paired difference (µs), and, as before, the median over rounds of each driver's
  total for the layout with min and max. The native driver runs once per round per layout, after the pairs.
- **Same priority, same threads.** The bench lowers its niceness (`--nice`, -10: root only) and sets
  `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `OPENBLAS_NUM_THREADS` to 1 unless already set; the worker and the
  direct process inherit both. The HF worker and the direct runner both use one torch intra-op thread.
- **Only the calls are timed**, not start-up (worker start, model load): invar's call as the core sees it (encode,
  record, send, the worker's turnaround, verify, record the report), direct's `generate` inside its own process
  (reported over a private pipe, outside the timing).
- **Same outputs.** invar and direct must return the same tokens for every call (same engine, same seeds); the
  benchmark refuses to report otherwise.
- **Where invar's time goes.** After the rounds, one more pass of invar calls runs with the core's steps timed in
  place, each on the thread that runs it (the calling thread encodes, hashes, records and writes the call; the
  reader thread hashes, decodes and records the report), less that thread's waits for a CPU; the worker's protocol
  steps (hash and decode the call, encode the report) are replayed here on the last call's exact bytes.
- **Two model sizes.** The shipped tiny model (0.6 M parameters: what shows is the fixed cost per call) and a larger
  Qwen3-architecture model built here with random weights (`--large-layers`, `--large-hidden`; 36.2 M parameters
  by default) with the shipped tokenizer, so an engine step costs what it would on a small real model.
- The fixed cost per call is the mean paired difference on the tiny model; per record, half of it (a call writes
  two records: the call and its report).
- **`--device cuda`** (hf and vLLM; MLX has no CUDA) puts every driver on the GPU the same way: the worker gets the
  `device` setting `cuda` (hf: `--device cuda`; vLLM: `--device cuda`, its GPU build's defaults otherwise), the
  direct runner builds the worker's engine class with that device, and native vLLM runs on the direct runner's
  engine. The larger model defaults to 24 layers of hidden size 1024 there (290 M parameters; 36.2 M on the CPU).
  Two vLLM engines (the worker's and the direct runner's) share the one GPU, so each takes
  `gpu_memory_utilization` 0.4 instead of the worker's 0.85 (which would leave no room for the second).
- **`--budget-s`**: no new round, model size or engine starts once that many seconds have passed since the start
  (every started engine finishes at least one round), so a run under a time limit still reports what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, worker_env  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.protocol.methods import METHODS, serves  # noqa: E402
from invar.protocol.server import Handler  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.runner.engine import Engine, EngineSpec, engine_session  # noqa: E402
from invar.runner.evaluate import population_digest, request_seed, sample_indices  # noqa: E402
from invar.tasks import ModelTokenizer, load_population  # noqa: E402

sys.path.append(str(REPO / "bench"))  # last: the direct driver runs this file with -P, so bench/ is not first there
from report import write_json  # noqa: E402

POPULATION = REPO / "data" / "arith-eval.jsonl"
SEED = 20261130
LAYOUTS = {"pairing-b16": 16, "batch-32": 32}
NATIVE = ("vllm", "mlx")
# vLLM on the CPU reserves this fraction of host memory for its KV cache in each of its two engines; on CUDA each of
# the two engines (the worker's and the direct runner's) takes this fraction of the one GPU.
VLLM_SETTINGS = {"gpu_memory_utilization": 0.05}
VLLM_CUDA_UTILIZATION = 0.4
# After each message it reads, a vLLM engine's worker keeps polling its shared-memory queue (sched_yield in a loop)
# for 1 s before it goes idle (vllm.distributed.device_communicators.shm_broadcast.SpinCondition, busy_loop_s = 1).
# With two engines on 2 cores, the one that has just answered takes CPU from the one being timed; measured on the
# larger model, the invar worker's engine took 0.7 CPU s during each following direct call, which made direct
# 0.4–0.5 s a call slower. A rest longer than that before every timed call leaves each call the machine alone.
VLLM_SETTLE_S = 1.2
# The larger model's shape (layers, hidden size) by device: on a GPU a 36 M model leaves every call launch-bound.
LARGE_SHAPE = {"cpu": (12, 512), "cuda": (24, 1024)}
# MLX's CPU backend on Linux takes about 28 s for one call of 64 requests on the larger model (torch: about 1.3 s),
# so there it runs one call of 32 requests per layout.
LARGE_CAP = {"mlx": 32}


# -- the calls ------------------------------------------------------------------------------------------------------


def make_calls(count: int, max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Per layout: the generate calls (params exactly as the worker receives them), 64 requests per call.

    Prompts carry the core's token ids from the shipped tokenizer (the larger model has the same one)."""
    problems = load_population(POPULATION, population_digest(POPULATION, None))
    chosen = [problems[i] for i in sample_indices(len(problems), count, SEED)]
    tokenizer = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    requests = [{"request_id": p.id, "prompt": p.prompt, "prompt_ids": tokenizer.prompt_ids(prompt=p.prompt),
                 "seed": request_seed(SEED, p.id), "temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens}
                for p in chosen]
    per_call = 64
    out: dict[str, list[dict[str, Any]]] = {}
    for name, batch in LAYOUTS.items():
        calls = []
        for start in range(0, len(requests), per_call):
            part = requests[start : start + per_call]
            layout = [list(range(b, min(b + batch, len(part)))) for b in range(0, len(part), batch)]
            calls.append({"requests": part, "layout": layout, "adapter": None, "reference_adapter": None})
        out[name] = calls
    return out


# -- the larger model -----------------------------------------------------------------------------------------------


def build_large(out: Path, layers: int, hidden: int) -> Path:
    """A Qwen3-architecture model with random weights and the shipped tokenizer (built once per shape)."""
    folder = out / f"qwen3-random-l{layers}-h{hidden}"
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base = json.loads((DEFAULT_MODEL / "config.json").read_text())
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=base["vocab_size"], hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256), head_dim=64,
        max_position_embeddings=base["max_position_embeddings"], tie_word_embeddings=True,
        bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"],
        rms_norm_eps=base["rms_norm_eps"], dtype="float32")
    model = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(DEFAULT_MODEL / name, tmp / name)
    tmp.rename(folder)
    return folder


def parameters(model: Path) -> int:
    """Parameter count from the safetensors header (no framework needed)."""
    import struct

    with open(model / "model.safetensors", "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    total = 0
    for name, info in header.items():
        if name != "__metadata__":
            n = 1
            for d in info["shape"]:
                n *= d
            total += n
    return total


# -- CPU time of a process tree ------------------------------------------------------------------------------------


def _threads(p: int) -> list[str]:
    """The /proc folder of each thread of process `p` (none once it has ended)."""
    try:
        return [f"/proc/{p}/task/{task}" for task in os.listdir(f"/proc/{p}/task")]
    except OSError:
        return []


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for thread in _threads(p):
            with contextlib.suppress(OSError), open(f"{thread}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return pids


def _cpu_ns(thread: str) -> int:
    """CPU nanoseconds a thread has run (Linux schedstat); OSError once it has ended."""
    with open(f"{thread}/schedstat") as f:
        return int(f.read().split()[0])


def tree_cpu_s(pid: int) -> float:
    """CPU seconds run so far by every thread of `pid` and its descendants now alive.

    CPU time hardly moves with other load on the machine, where wall time does: it is the steadier measure of the
    work each driver does for the same call. A thread that has ended is not counted: to read a tree again and again
    while its processes come and go, use `TreeCpu`."""
    total = 0
    for p in _tree(pid):
        for thread in _threads(p):
            with contextlib.suppress(OSError):
                total += _cpu_ns(thread)
    return total / 1e9


class TreeCpu:
    """CPU seconds run so far by `pid`'s process tree, read again and again while it runs: a thread or process that
    has ended counts with what it had run at its last reading. `tree_cpu_s` alone drops it, so a reading just after a
    worker process exits fell below the one before (a negative cycle CPU at a run's end). A thread is told apart by
    its /proc folder (pid and thread id) and its start time, so a reused id is a new thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[tuple[str, str], int] = {}

    def __call__(self) -> float:
        for p in _tree(self.pid):
            for thread in _threads(p):
                with contextlib.suppress(OSError):
                    with open(f"{thread}/stat") as f:
                        started = f.read().rsplit(")", 1)[1].split()[19]  # field 22, after the command's name
                    self.seen[(thread, started)] = _cpu_ns(thread)
        return sum(self.seen.values()) / 1e9


# -- the direct and native drivers (a process of their own) ---------------------------------------------------------


def invar_settings(engine: str, device: str) -> dict[str, Any]:
    """The launch settings the core gives the worker: as before on the CPU, the device (and vLLM's share) on CUDA."""
    if device == "cpu":
        return dict(VLLM_SETTINGS) if engine == "vllm" else {}
    if engine == "vllm":
        return {"device": device, "gpu_memory_utilization": VLLM_CUDA_UTILIZATION}
    return {"device": device}


def handler(engine: Any, method: str) -> Handler:
    """An engine's method as its worker's server runs it: the params map read into the method's struct, the result
    written back (`invar.protocol.methods.serves`), so a direct driver times what a call costs inside the worker."""
    module = sys.modules[type(engine).__module__]
    read = getattr(module, "read_learner_step", None) if method == "learner_step" else None
    return serves(METHODS[method], getattr(engine, method), read=read)


@functools.cache
def torch_as_the_worker() -> None:
    """Once per process: torch set up as the HF worker's `main` sets it up (deterministic cuBLAS needs its workspace
    fixed before the first product; interop threads can be set only once)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    from transformers.utils import logging as hf_logging

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def _direct_engine(engine: str, device: str) -> Any:
    """The worker's engine class, set up as the worker's `main` sets it up, in this process."""
    if engine == "hf":
        torch_as_the_worker()
        from invar.workers import hf_worker

        return hf_worker.Engine(Role.INFERENCE, device)
    if engine == "mlx":
        from invar.workers import mlx_worker

        return mlx_worker.Engine(Role.INFERENCE)
    from invar.workers import vllm_worker

    utilization = VLLM_SETTINGS["gpu_memory_utilization"] if device == "cpu" else VLLM_CUDA_UTILIZATION
    return vllm_worker.Engine(vllm_worker.Settings(
        device=device, max_model_len=None, gpu_memory_utilization=utilization,
        max_num_seqs=256, max_lora_rank=8, max_loras=2, enforce_eager=True, seed=0))


def _native(engine: str, direct: Any, model: Path) -> Any:
    """A function running a list of calls through the engine's own batched API; None where there is none here."""
    if engine == "vllm":
        from vllm import SamplingParams

        llm = direct.m.llm

        def run_vllm(calls: list[dict[str, Any]]) -> int:
            reqs = [r for c in calls for r in c["requests"]]
            params = [SamplingParams(temperature=r["temperature"], top_p=r["top_p"], max_tokens=r["max_tokens"],
                                     seed=r["seed"]) for r in reqs]
            outs = llm.generate([r["prompt"] for r in reqs], params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        return run_vllm
    if engine == "mlx":
        import mlx_lm
        from mlx_lm.generate import batch_generate
        from mlx_lm.sample_utils import make_sampler

        model_, tokenizer = mlx_lm.load(str(model))[:2]

        def run_mlx(calls: list[dict[str, Any]]) -> int:
            reqs = [r for c in calls for r in c["requests"]]
            prompts = [tokenizer.encode(r["prompt"]) for r in reqs]
            out = batch_generate(model_, tokenizer, prompts, max_tokens=reqs[0]["max_tokens"],
                                 sampler=make_sampler(temp=reqs[0]["temperature"]), return_token_ids=True)
            return sum(len(t) for t in out.token_ids) if out.token_ids is not None else len(out.texts)

        return run_mlx
    return None


def serve_direct(engine: str, model: Path, reply_fd: int, device: str) -> int:
    """Load the model once, then answer timing requests read as JSON lines on stdin, on a private pipe."""
    reply = os.fdopen(reply_fd, "w", buffering=1)
    direct = _direct_engine(engine, device)
    handler(direct, "load_model")({"model_dir": str(model), "model_digest": canonical.tree_digest(str(model)),
                                   "dtype": "float32", "quantization": "none", "adapter": None})
    generate = handler(direct, "generate")
    native = _native(engine, direct, model)
    gpu = None
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name()
    reply.write(json.dumps({"ready": True, "native": native is not None, "gpu": gpu}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        calls = req["calls"]
        if req["driver"] == "direct":
            c0, t0 = tree_cpu_s(os.getpid()), time.perf_counter()
            outs = [generate(c) for c in calls]
            seconds, cpu = time.perf_counter() - t0, tree_cpu_s(os.getpid()) - c0
            tokens = {o["request_id"]: [int(t) for t in o["tokens"]] for r in outs for o in r["outputs"]}
            reply.write(json.dumps({"seconds": seconds, "cpu_s": cpu, "tokens": tokens}) + "\n")
        else:
            t0 = time.perf_counter()
            n = native(calls)
            reply.write(json.dumps({"seconds": time.perf_counter() - t0, "generated": n}) + "\n")
    return 0


class DirectDriver:
    def __init__(self, engine: str, model: Path, device: str) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).resolve()), "--serve-direct", engine, "--model", str(model),
             "--reply-fd", str(write_fd), "--device", device],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            pass_fds=(write_fd,), cwd=REPO, env=worker_env())  # the environment a worker gets
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")
        hello = self._read()
        self.native = bool(hello["native"])
        self.gpu: str | None = hello.get("gpu")

    def _read(self) -> dict[str, Any]:
        line = self.replies.readline()
        if not line:
            raise SystemExit(f"bench/overhead.py: the direct driver stopped (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def run(self, driver: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"driver": driver, "calls": calls}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


# -- the benchmark --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def invar_driver(engine: str, model: Path, run_dir: Path, device: str) -> Iterator[tuple[Any, RunStore]]:
    settings = invar_settings(engine, device)
    with RunStore.create(run_dir, meta={"command": "bench/overhead.py"}) as store, \
            engine_session(EngineSpec(Engine(engine), model, settings=settings), store) as session:
        yield session, store


def tokens_of(reports: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {o["request_id"]: [int(t) for t in o["tokens"]] for r in reports for o in r["outputs"]}


def bootstrap(invar: np.ndarray, direct: np.ndarray, resamples: int = 4000) -> dict[str, Any]:
    """Paired statistics over calls, with 95 % percentile-bootstrap intervals (pairs resampled whole)."""
    ratios = invar / direct
    idx = np.random.default_rng(SEED).integers(0, len(ratios), size=(resamples, len(ratios)))
    med = np.median(ratios[idx], axis=1)
    total = invar[idx].sum(axis=1) / direct[idx].sum(axis=1)
    diff_ms = (invar - direct)[idx].mean(axis=1) * 1e3
    return {
        "pairs": len(ratios),
        "median_ratio": float(np.median(ratios)),
        "median_ratio_ci95": [float(np.percentile(med, 2.5)), float(np.percentile(med, 97.5))],
        "total_ratio": float(invar.sum() / direct.sum()),
        "total_ratio_ci95": [float(np.percentile(total, 2.5)), float(np.percentile(total, 97.5))],
        "mean_diff_ms": float((invar - direct).mean() * 1e3),
        "mean_diff_ms_ci95": [float(np.percentile(diff_ms, 2.5)), float(np.percentile(diff_ms, 97.5))],
        "median_diff_ms": float(np.median(invar - direct) * 1e3),
        "direct_median_call_s": float(np.median(direct)),
        "ratio_min": float(ratios.min()), "ratio_max": float(ratios.max()),
    }


_SCHEDSTAT = Path("/proc/thread-self/schedstat")  # Linux: this thread's CPU time and run-queue wait (ns)
_sched_fd = threading.local()


def _runqueue_wait_s() -> float:
    """Seconds this thread has waited runnable for a CPU so far (0 where the kernel does not say)."""
    fd = getattr(_sched_fd, "fd", None)
    if fd is None:
        try:
            fd = _sched_fd.fd = os.open(_SCHEDSTAT, os.O_RDONLY)
        except OSError:
            fd = _sched_fd.fd = -1
    if fd < 0:
        return 0.0
    return int(os.pread(fd, 128, 0).split()[1]) / 1e9


class _Steps:
    """Every timed step of the core as (label, thread, start, end, time in the step), whichever thread ran it.

    The client answers a call on its reader thread (read, hash, decode and record the report) while the calling
    thread waits, so steps are kept per thread and counted in the call whose span holds them, never summed into one
    total that another thread also adds to.

    A step's time is its wall time less the time its thread waited runnable for a CPU meanwhile (Linux schedstat;
    never less than the thread's CPU time in it). Writing the call wakes the worker, and the woken worker's engine
    may take the writer's CPU at once: the writer then waits in the run queue, up to the whole call when the engine
    keeps both cores busy, and that wait is the engine's turn, not the write's. Blocking inside a step (an fsync, a
    full pipe) still counts."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, float, float, float]] = []  # list.append is atomic: any thread may add

    def timed(self, label: str, target: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            w0, c0 = _runqueue_wait_s(), time.thread_time()
            t0 = time.perf_counter()
            try:
                return target(*a, **k)
            finally:
                t1 = time.perf_counter()
                cpu, waited = time.thread_time() - c0, _runqueue_wait_s() - w0
                own = max(t1 - t0 - waited, min(cpu, t1 - t0))
                self.events.append((label, threading.current_thread().name, t0, t1, own))

        return run

    def within(self, start: float, end: float) -> list[tuple[str, str, float, float, float]]:
        return [e for e in self.events if start <= e[2] and e[3] <= end]


class _Timed:
    """A module seen through a proxy whose named functions are timed as steps."""

    def __init__(self, module: Any, wrap: dict[str, str], steps: _Steps) -> None:
        self._module, self._wrap, self._steps = module, wrap, steps

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._module, name)
        label = self._wrap.get(name)
        return target if label is None else self._steps.timed(label, target)


class _TimedHasher:
    """A sha256 whose updates are timed as one step (the reader hashes a report chunk by chunk as it lands)."""

    def __init__(self, steps: _Steps, label: str) -> None:
        self._inner = hashlib.sha256()
        self.update = steps.timed(label, self._inner.update)

    def hexdigest(self) -> str:
        return self._inner.hexdigest()


CORE_STEPS = ("encode call", "hash call", "record call", "write call to the pipe", "hash report as read",
              "decode report", "record report")


def breakdown(session: Any, store: RunStore, calls: list[dict[str, Any]], rounds: int,
              method: str = "generate") -> dict[str, Any]:
    """Where Invar's time goes per call: the core's steps timed in place, the worker's protocol steps replayed here.

    Each core step is timed on the thread that runs it: the calling thread encodes, hashes, records and writes the
    call; the client's reader thread hashes the report as it reads it, decodes and records it. A step counts in a
    call only if it started and ended within that call. A step's time leaves out its thread's waits for a CPU
    (`_Steps`); `core_wall_median_us` keeps the plain wall times, `core_thread` the thread of each step."""
    import types

    from invar.protocol import frames
    from invar.protocol.messages import Call, Report
    from invar.transport import client as client_mod

    steps = _Steps()
    saved = {"call": b"", "report": b""}
    client_globals = vars(client_mod)  # the client's module globals, swapped for timed stand-ins during the calls
    orig: dict[str, Any] = {**{name: client_globals[name] for name in ("canonical", "frames", "hashlib")},
                            "record_call": store.record_call, "record_report": store.record_report}

    def keep(kind: str) -> Any:
        inner = steps.timed("record " + kind, orig["record_" + kind])

        def record(payload: bytes, *, worker: str) -> Any:
            saved[kind] = payload
            return inner(payload, worker=worker)

        return record

    client_globals["canonical"] = _Timed(orig["canonical"], {"encode_parts": "encode call",
                                                             "sha256_parts": "hash call"}, steps)
    client_globals["frames"] = _Timed(orig["frames"], {"write_parts": "write call to the pipe",
                                                       "decode_payload": "decode report"}, steps)
    client_globals["hashlib"] = types.SimpleNamespace(sha256=lambda: _TimedHasher(steps, "hash report as read"))
    store.record_call, store.record_report = keep("call"), keep("report")  # type: ignore[method-assign]
    main = threading.current_thread().name
    per_call: list[dict[str, float]] = []
    wall_call: list[dict[str, float]] = []
    thread_of: dict[str, str] = {}
    try:
        # Untimed: the reader thread is blocked reading with a hasher made before the timing began; after this call
        # it reads the next report with a timed one.
        session.client.call(method, calls[0])
        for _ in range(rounds):
            for c in calls:
                t0 = time.perf_counter()
                session.client.call(method, c)
                t1 = time.perf_counter()
                own: dict[str, float] = {"whole call": t1 - t0}
                wall: dict[str, float] = {}
                for label, thread, s, e, spent in steps.within(t0, t1):
                    own[label] = own.get(label, 0.0) + spent
                    wall[label] = wall.get(label, 0.0) + e - s
                    thread_of[label] = "calling thread" if thread == main else "reader thread" \
                        if thread.endswith("-reader") else f"thread {thread}"
                per_call.append(own)
                wall_call.append(wall)
    finally:
        for name in ("canonical", "frames", "hashlib"):
            client_globals[name] = orig[name]
        store.record_call, store.record_report = orig["record_call"], orig["record_report"]  # type: ignore
    # The worker's side of the protocol, replayed on the last call's exact bytes (the worker runs the same code).
    replay: dict[str, list[float]] = {}
    report = Report.from_wire(frames.decode_payload(bytearray(saved["report"]), "report"))
    replayed: dict[str, Callable[[], object]] = {
        "worker: hash call as read": lambda: hashlib.sha256(saved["call"]).hexdigest(),
        "worker: decode call": lambda: Call.from_wire(frames.decode_payload(bytearray(saved["call"]))),
        "worker: encode report": lambda: canonical.encode_parts(report.to_wire()),
        "hash report as read": lambda: hashlib.sha256(saved["report"]).hexdigest(),
    }
    for name, step in replayed.items():
        for _ in range(50):
            t0 = time.perf_counter()
            step()
            replay.setdefault(name, []).append(time.perf_counter() - t0)
    labels = [k for k in (*CORE_STEPS, "whole call") if any(k in d for d in per_call)]
    return {"calls": len(per_call), "call_bytes": len(saved["call"]), "report_bytes": len(saved["report"]),
            "core_median_us": {k: float(np.median([d.get(k, 0.0) for d in per_call]) * 1e6) for k in labels},
            "core_wall_median_us": {k: float(np.median([d.get(k, 0.0) for d in wall_call]) * 1e6)
                                    for k in labels if k != "whole call"},
            "core_thread": {k: thread_of[k] for k in labels if k in thread_of},
            "core_per_call_us": [{k: v * 1e6 for k, v in d.items()} for d in per_call],
            "worker_replay_median_us": {k: float(np.median(v) * 1e6) for k, v in replay.items()}}


def measure(engine: str, model: Path, calls: dict[str, list[dict[str, Any]]], reps: int, work: Path,
            device: str = "cpu", deadline: float = float("inf"),
            settle: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """`reps` rounds; in each, every call of every layout runs as a pair (invar, direct) in alternating order.

    `settle`: seconds of rest before each timed call (default: VLLM_SETTLE_S for vLLM, none otherwise), so that the
    driver that has just finished is idle again and takes no CPU from the one being timed.

    No round after the first starts past `deadline` (`time.monotonic()`). Returns the rows per layout and what ran
    (rounds, the GPU's name on CUDA)."""
    pairs: dict[str, dict[str, list[float]]] = {layout: {"invar": [], "direct": [], "invar_cpu": [], "direct_cpu": []}
                                                for layout in calls}
    totals: dict[str, dict[str, list[float]]] = {layout: {"invar": [], "direct": [], "native": []}
                                                 for layout in calls}
    direct = DirectDriver(engine, model, device)
    rest = (VLLM_SETTLE_S if engine == "vllm" else 0.0) if settle is None else settle
    n = 0
    rounds = 0
    try:
        with invar_driver(engine, model, work / f"run-{engine}-{model.name}", device) as (session, store):
            worker_pid = session.client._proc.pid  # the worker's process tree: its CPU time is invar's too

            def invar_cpu() -> float:  # this process alone (its tree holds the direct driver and the worker too)
                return tree_cpu_s(worker_pid) + time.process_time()

            for layout_calls in calls.values():  # one untimed round: first-call costs (allocation, caches) go
                session.client.call("generate", layout_calls[0])
                direct.run("direct", layout_calls[:1])
                if direct.native:
                    direct.run("native", layout_calls[:1])
            for rep in range(reps):
                if rep and time.monotonic() > deadline:
                    print(f"  {engine} {model.name}: time budget spent after {rep} of {reps} rounds", flush=True)
                    break
                rounds += 1
                for layout, layout_calls in calls.items():
                    for c in layout_calls:
                        got: dict[str, float] = {}
                        seen: dict[str, dict[str, list[int]]] = {}
                        for driver in (("invar", "direct") if n % 2 == 0 else ("direct", "invar")):
                            time.sleep(rest)
                            if driver == "invar":
                                c0, t0 = invar_cpu(), time.perf_counter()
                                report = session.client.call("generate", c)
                                got["invar"], got["invar_cpu"] = time.perf_counter() - t0, invar_cpu() - c0
                                seen["invar"] = tokens_of([report])
                            else:
                                answer = direct.run("direct", [c])
                                got["direct"], got["direct_cpu"] = answer["seconds"], answer["cpu_s"]
                                seen["direct"] = answer["tokens"]
                        n += 1
                        if seen["invar"] != seen["direct"]:
                            raise SystemExit(f"bench/overhead.py: {engine} {layout}: invar and direct returned "
                                             "different tokens for the same call; the comparison would be meaningless")
                        for driver, s in got.items():
                            pairs[layout][driver].append(s)
                    k = len(layout_calls)
                    for driver in ("invar", "direct"):
                        totals[layout][driver].append(sum(pairs[layout][driver][-k:]))
                    if direct.native:
                        time.sleep(rest)
                        totals[layout]["native"].append(direct.run("native", layout_calls)["seconds"])
                    print(f"  {engine} {model.name} round {rep + 1}/{reps} {layout}: " + ", ".join(
                        f"{d} {xs[-1]:.3f}s" for d, xs in totals[layout].items() if xs), flush=True)
            where = {layout: breakdown(session, store, layout_calls, 1) for layout, layout_calls in calls.items()}
    finally:
        direct.close()
    result: dict[str, Any] = {}
    for layout, per in totals.items():
        row: dict[str, Any] = {}
        for driver, xs in per.items():
            if xs:
                row[driver] = {"median_s": float(np.median(xs)), "min_s": min(xs), "max_s": max(xs), "runs": xs}
        row["invar_over_direct"] = row["invar"]["median_s"] / row["direct"]["median_s"]
        if "native" in row:
            row["direct_over_native"] = row["direct"]["median_s"] / row["native"]["median_s"]
        n_calls = len(calls[layout])
        row["calls"] = n_calls
        inv, dir_ = np.array(pairs[layout]["invar"]), np.array(pairs[layout]["direct"])
        row["paired"] = bootstrap(inv, dir_)
        row["paired"]["invar_call_s"] = pairs[layout]["invar"]
        row["paired"]["direct_call_s"] = pairs[layout]["direct"]
        row["paired_cpu"] = bootstrap(np.array(pairs[layout]["invar_cpu"]), np.array(pairs[layout]["direct_cpu"]))
        row["paired_cpu"]["invar_call_s"] = pairs[layout]["invar_cpu"]
        row["paired_cpu"]["direct_call_s"] = pairs[layout]["direct_cpu"]
        # The fixed cost per call: the mean paired difference (meaningful on the tiny model, where it dominates).
        row["fixed_cost_per_call_us"] = row["paired"]["mean_diff_ms"] * 1e3
        row["fixed_cost_per_record_us"] = row["fixed_cost_per_call_us"] / 2
        row["breakdown"] = where[layout]
        result[layout] = row
    return result, {"rounds": rounds, "gpu": direct.gpu}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels: list[str] = []
    bars: dict[str, tuple[list[float], list[float], list[float]]] = {"paired": ([], [], []), "paired_cpu": ([], [], [])}
    for size, per_engine in results["sizes"].items():
        for engine, per_layout in per_engine["engines"].items():
            for layout, row in per_layout["layouts"].items():
                labels.append(f"{engine}\n{size}\n{layout}")
                for key, (ratios, lows, highs) in bars.items():
                    p = row[key]
                    ratios.append(p["total_ratio"])
                    lows.append(p["total_ratio"] - p["total_ratio_ci95"][0])
                    highs.append(p["total_ratio_ci95"][1] - p["total_ratio"])
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 1.1), 4.5))
    x = np.arange(len(labels))
    for offset, (key, name, color) in zip((-0.2, 0.2), (("paired", "wall time", "#4c72b0"),
                                                       ("paired_cpu", "CPU time", "#55a868")), strict=True):
        ratios, lows, highs = bars[key]
        ax.bar(x + offset, ratios, 0.4, color=color, yerr=[lows, highs], capsize=3, label=name)
        for i, r in enumerate(ratios):
            ax.text(x[i] + offset, r + highs[i], f"{r:.3f}", ha="center", va="bottom", fontsize=6)
    ax.axhline(1.02, color="#c44e52", linestyle="--", label="goal 1.02")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("invar / direct, paired calls (95 % interval)")
    top = max(r + h for key in bars for r, h in zip(bars[key][0], bars[key][2], strict=True))
    bottom = min(r - lo for key in bars for r, lo in zip(bars[key][0], bars[key][1], strict=True))
    ax.set_ylim(min(0.9, bottom - 0.03), max(1.1, top * 1.04))
    ax.legend(fontsize=7)
    ax.set_title("Invar's overhead on generate calls: total of paired calls, invar over direct")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,mlx,vllm")
    parser.add_argument("--sizes", default="tiny,large")
    parser.add_argument("--reps", type=int, default=5, help="rounds: every call of every layout once per round")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where every driver runs the engine (cuda: hf and vllm)")
    parser.add_argument("--large-layers", type=int, default=None, help="default 12 on the CPU, 24 on CUDA")
    parser.add_argument("--large-hidden", type=int, default=None, help="default 512 on the CPU, 1024 on CUDA")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new round, size or engine after this many seconds (each started engine "
                             "runs one round at least)")
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--replot", type=Path, default=None, help="draw --plot from this JSON; run nothing")
    parser.add_argument("--settle", type=float, default=None,
                        help=f"seconds of rest before each timed call (default {VLLM_SETTLE_S} for vLLM, 0 otherwise)")
    parser.add_argument("--serve-direct", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reply-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--nice", type=int, default=-10, help="priority of the bench and its workers (root lowers it)")
    args = parser.parse_args(argv)
    if args.serve_direct:
        return serve_direct(args.serve_direct, args.model, args.reply_fd, args.device)
    if args.replot is not None:
        if args.plot is None:
            parser.error("--replot needs --plot")
        plot(json.loads(args.replot.read_text()), args.plot)
        return 0
    engines = [e for e in args.engines.split(",") if e]
    if any(e not in ("hf", "mlx", "vllm") for e in engines) or args.reps < 1 or args.requests < 1:
        parser.error("--engines takes hf, mlx, vllm; --reps and --requests must be ≥ 1")
    if args.device == "cuda" and "mlx" in engines:
        parser.error("MLX has no CUDA device: pass --engines hf,vllm with --device cuda")
    deadline = time.monotonic() + (args.budget_s if args.budget_s is not None else float("inf"))
    layers = args.large_layers or LARGE_SHAPE[args.device][0]
    hidden = args.large_hidden or LARGE_SHAPE[args.device][1]
    # Both drivers' processes inherit these: the same priority and the same threads, so neither is favoured.
    with contextlib.suppress(PermissionError):
        os.nice(args.nice)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    results: dict[str, Any] = {"device": args.device, "requests": args.requests, "max_tokens": args.max_tokens,
                               "reps": args.reps,
                               "layouts": LAYOUTS, "cpus": os.cpu_count(), "load_at_start": os.getloadavg(),
                               "niceness": os.nice(0), "threads": {k: os.environ[k] for k in (
                                   "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
                               "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="invar-overhead-") as tmp:
        for size in args.sizes.split(","):
            if time.monotonic() > deadline:
                print(f"{size}: not measured, the time budget was spent", flush=True)
                results.setdefault("not_measured", []).append(f"{size} (time budget)")
                continue
            model = DEFAULT_MODEL if size == "tiny" else build_large(args.cache, layers, hidden)
            shown = model.relative_to(REPO) if model.is_relative_to(REPO) else model
            entry: dict[str, Any] = {"model": str(shown), "parameters": parameters(model), "engines": {}}
            results["sizes"][size] = entry
            for engine in engines:
                if time.monotonic() > deadline:
                    print(f"{engine} on {model.name}: not measured, the time budget was spent", flush=True)
                    results.setdefault("not_measured", []).append(f"{size} {engine} (time budget)")
                    continue
                count = args.requests if size == "tiny" else min(args.requests, LARGE_CAP.get(engine, args.requests))
                print(f"{engine} on {model.name} ({entry['parameters']:,} parameters), {count} requests", flush=True)
                layouts, ran = measure(engine, model, make_calls(count, args.max_tokens), args.reps, Path(tmp),
                                       args.device, deadline, args.settle)
                rest = (VLLM_SETTLE_S if engine == "vllm" else 0.0) if args.settle is None else args.settle
                entry["engines"][engine] = {"requests": count, **ran, "settle_s": rest, "layouts": layouts}
                # Kept as it goes: a long run stopped part-way still leaves its figures.
                write_json(args.json, results, say=False)
    results["load_at_end"] = os.getloadavg()
    print()
    print(f"{'size':6} {'engine':6} {'layout':12} {'measure':5} {'pairs':>5} {'direct s/call':>13} "
          f"{'median ratio (95%)':>24} {'total ratio (95%)':>24} {'µs/call (95%)':>22}")
    for size, entry in results["sizes"].items():
        for engine, per_layout in entry["engines"].items():
            for layout, row in per_layout["layouts"].items():
                for kind, p in (("wall", row["paired"]), ("cpu", row["paired_cpu"])):
                    mr, tr, d = p["median_ratio_ci95"], p["total_ratio_ci95"], p["mean_diff_ms_ci95"]
                    print(f"{size:6} {engine:6} {layout:12} {kind:5} {p['pairs']:5} "
                          f"{p['direct_median_call_s']:13.4f} {p['median_ratio']:.4f} ({mr[0]:.4f}-{mr[1]:.4f}) "
                          f"{p['total_ratio']:.4f} ({tr[0]:.4f}-{tr[1]:.4f}) {p['mean_diff_ms'] * 1e3:7.0f} "
                          f"({d[0] * 1e3:.0f}-{d[1] * 1e3:.0f})")
    write_json(args.json, results)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
