"""What running through Invar costs: the same generate calls driven by Invar, by a direct runner, and natively.

    .venv/bin/python bench/overhead.py [--engines hf,mlx,vllm] [--sizes tiny,large] [--reps 5]
                                       [--requests 256] [--json docs/performance/overhead.json]
                                       [--plot docs/performance/overhead.png]

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
- **Side by side, alternating.** All drivers are started once and kept; each repetition runs every driver on every
  layout in turn (the order rotates per repetition), so slow phases of a shared machine fall on all of them alike.
  Reported: the median over repetitions with min and max, and the ratio invar/direct of the medians.
- **Only the calls are timed**, not start-up (worker start, model load): the drivers time the same loop of calls
  from the inside (the direct and native drivers in their own process, reported over a private pipe).
- **Same outputs.** invar and direct must return the same tokens for every request (same engine, same seeds); the
  benchmark refuses to report otherwise.
- **Two model sizes.** The shipped tiny model (0.3 M parameters: what shows is the fixed cost per call) and a larger
  Qwen3-architecture model built here with random weights (`--large-layers`, `--large-hidden`; about 40 M
  parameters by default) with the shipped tokenizer, so an engine step costs what it would on a small real model.
- The fixed cost per call is (invar − direct) / calls on the tiny model; per record, that over the 2 records a call
  writes (call and report).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, worker_env  # noqa: E402
from invar.records import RunStore  # noqa: E402
from invar.runner.engine import Engine, EngineSpec, engine_session  # noqa: E402
from invar.runner.evaluate import population_digest, request_seed, sample_indices  # noqa: E402
from invar.tasks import load_population  # noqa: E402

POPULATION = REPO / "data" / "arith-eval.jsonl"
SEED = 20261130
LAYOUTS = {"pairing-b16": 16, "batch-32": 32}
NATIVE = ("vllm", "mlx")
# vLLM on the CPU reserves this fraction of host memory for its KV cache in each of its two engines.
VLLM_SETTINGS = {"gpu_memory_utilization": 0.05}
# MLX's CPU backend on Linux takes about 28 s for one call of 64 requests on the larger model (torch: about 1.3 s),
# so there it runs one call of 32 requests per layout.
LARGE_CAP = {"mlx": 32}


# -- the calls ------------------------------------------------------------------------------------------------------


def make_calls(count: int, max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Per layout: the generate calls (params exactly as the worker receives them), 64 requests per call."""
    problems = load_population(POPULATION, population_digest(POPULATION, None))
    chosen = [problems[i] for i in sample_indices(len(problems), count, SEED)]
    requests = [{"request_id": p.id, "prompt": p.prompt, "seed": request_seed(SEED, p.id), "temperature": 1.0,
                 "top_p": 1.0, "max_tokens": max_tokens} for p in chosen]
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
    model = Qwen3ForCausalLM(config)
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


# -- the direct and native drivers (a process of their own) ---------------------------------------------------------


def _direct_engine(engine: str) -> Any:
    """The worker's engine class, set up as the worker's `main` sets it up, in this process."""
    if engine == "hf":
        import torch

        from workers import hf_worker

        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        return hf_worker.Engine(hf_worker.Role.INFERENCE, "cpu")
    if engine == "mlx":
        from workers import mlx_worker

        return mlx_worker.Engine(mlx_worker.Role.INFERENCE)
    from workers import vllm_worker

    return vllm_worker.Engine(vllm_worker.Settings(
        device="cpu", max_model_len=None, gpu_memory_utilization=VLLM_SETTINGS["gpu_memory_utilization"],
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

        model_, tokenizer = mlx_lm.load(str(model))

        def run_mlx(calls: list[dict[str, Any]]) -> int:
            reqs = [r for c in calls for r in c["requests"]]
            prompts = [tokenizer.encode(r["prompt"]) for r in reqs]
            out = batch_generate(model_, tokenizer, prompts, max_tokens=reqs[0]["max_tokens"],
                                 sampler=make_sampler(temp=reqs[0]["temperature"]), return_token_ids=True)
            return sum(len(t) for t in out.token_ids) if getattr(out, "token_ids", None) else len(out.texts)

        return run_mlx
    return None


def serve_direct(engine: str, model: Path, reply_fd: int) -> int:
    """Load the model once, then answer timing requests read as JSON lines on stdin, on a private pipe."""
    reply = os.fdopen(reply_fd, "w", buffering=1)
    direct = _direct_engine(engine)
    direct.load_model({"model_dir": str(model), "model_digest": canonical.tree_digest(str(model)),
                       "dtype": "float32", "quantization": "none", "adapter": None})
    native = _native(engine, direct, model)
    reply.write(json.dumps({"ready": True, "native": native is not None}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        calls = req["calls"]
        if req["driver"] == "direct":
            t0 = time.perf_counter()
            outs = [direct.generate(c) for c in calls]
            seconds = time.perf_counter() - t0
            tokens = {o["request_id"]: [int(t) for t in o["tokens"]] for r in outs for o in r["outputs"]}
            reply.write(json.dumps({"seconds": seconds, "tokens": tokens}) + "\n")
        else:
            t0 = time.perf_counter()
            n = native(calls)
            reply.write(json.dumps({"seconds": time.perf_counter() - t0, "generated": n}) + "\n")
    return 0


class DirectDriver:
    def __init__(self, engine: str, model: Path) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).resolve()), "--serve-direct", engine, "--model", str(model),
             "--reply-fd", str(write_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            pass_fds=(write_fd,), cwd=REPO, env=worker_env())  # the environment a worker gets
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")
        hello = self._read()
        self.native = bool(hello["native"])

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
def invar_driver(engine: str, model: Path, run_dir: Path) -> Iterator[Any]:
    settings = VLLM_SETTINGS if engine == "vllm" else {}
    with RunStore.create(run_dir, meta={"command": "bench/overhead.py"}) as store, \
            engine_session(EngineSpec(Engine(engine), model, settings=settings), store) as session:
        yield session


def measure(engine: str, model: Path, calls: dict[str, list[dict[str, Any]]], reps: int,
            work: Path) -> dict[str, Any]:
    times: dict[str, dict[str, list[float]]] = {layout: {"invar": [], "direct": [], "native": []} for layout in calls}
    direct = DirectDriver(engine, model)
    try:
        with invar_driver(engine, model, work / f"run-{engine}-{model.name}") as session:
            drivers = ["invar", "direct"] + (["native"] if direct.native else [])
            for layout_calls in calls.values():  # one untimed round: first-call costs (allocation, caches) go
                session.client.call("generate", layout_calls[0])
                for driver in drivers[1:]:
                    direct.run(driver, layout_calls[:1])
            for rep in range(reps):
                order = drivers[rep % len(drivers):] + drivers[: rep % len(drivers)]
                for layout, layout_calls in calls.items():
                    seen: dict[str, dict[str, list[int]]] = {}
                    for driver in order:
                        if driver == "invar":
                            t0 = time.perf_counter()
                            reports = [session.client.call("generate", c) for c in layout_calls]
                            times[layout]["invar"].append(time.perf_counter() - t0)
                            seen["invar"] = {o["request_id"]: [int(t) for t in o["tokens"]]
                                             for r in reports for o in r["outputs"]}
                        else:
                            got = direct.run(driver, layout_calls)
                            times[layout][driver].append(got["seconds"])
                            if driver == "direct":
                                seen["direct"] = got["tokens"]
                    if seen["invar"] != seen["direct"]:
                        raise SystemExit(f"bench/overhead.py: {engine} {layout}: invar and direct returned different "
                                         "tokens for the same calls; the comparison would be meaningless")
                    print(f"  {engine} {model.name} rep {rep + 1}/{reps} {layout}: " + ", ".join(
                        f"{d} {times[layout][d][-1]:.3f}s" for d in order), flush=True)
    finally:
        direct.close()
    result: dict[str, Any] = {}
    for layout, per in times.items():
        row: dict[str, Any] = {}
        for driver, xs in per.items():
            if xs:
                row[driver] = {"median_s": float(np.median(xs)), "min_s": min(xs), "max_s": max(xs), "runs": xs}
        row["invar_over_direct"] = row["invar"]["median_s"] / row["direct"]["median_s"]
        if "native" in row:
            row["direct_over_native"] = row["direct"]["median_s"] / row["native"]["median_s"]
        n_calls = len(calls[layout])
        row["calls"] = n_calls
        row["fixed_cost_per_call_us"] = (row["invar"]["median_s"] - row["direct"]["median_s"]) / n_calls * 1e6
        row["fixed_cost_per_record_us"] = row["fixed_cost_per_call_us"] / 2
        result[layout] = row
    return result


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ratios = [], []
    for size, per_engine in results["sizes"].items():
        for engine, per_layout in per_engine["engines"].items():
            for layout, row in per_layout["layouts"].items():
                labels.append(f"{engine}\n{size}\n{layout}")
                ratios.append(row["invar_over_direct"])
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    ax.bar(range(len(labels)), ratios, color="#4c72b0")
    ax.axhline(1.02, color="#c44e52", linestyle="--", label="goal 1.02")
    ax.axhline(1.07, color="#dd8452", linestyle=":", label="1.07")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("wall time, invar / direct (median)")
    ax.set_ylim(min(0.9, min(ratios) * 0.95), max(1.1, max(ratios) * 1.05))
    for i, r in enumerate(ratios):
        ax.text(i, r, f"{r:.2f}", ha="center", va="bottom", fontsize=7)
    ax.legend()
    ax.set_title("Invar's overhead on generate calls")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,mlx,vllm")
    parser.add_argument("--sizes", default="tiny,large")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--large-layers", type=int, default=12)
    parser.add_argument("--large-hidden", type=int, default=512)
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--serve-direct", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reply-fd", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_direct:
        return serve_direct(args.serve_direct, args.model, args.reply_fd)
    engines = [e for e in args.engines.split(",") if e]
    if any(e not in ("hf", "mlx", "vllm") for e in engines) or args.reps < 1 or args.requests < 1:
        parser.error("--engines takes hf, mlx, vllm; --reps and --requests must be ≥ 1")
    results: dict[str, Any] = {"requests": args.requests, "max_tokens": args.max_tokens, "reps": args.reps,
                               "layouts": LAYOUTS, "cpus": os.cpu_count(), "load_at_start": os.getloadavg(),
                               "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="invar-overhead-") as tmp:
        for size in args.sizes.split(","):
            model = DEFAULT_MODEL if size == "tiny" else build_large(args.cache, args.large_layers, args.large_hidden)
            shown = model.relative_to(REPO) if model.is_relative_to(REPO) else model
            entry: dict[str, Any] = {"model": str(shown), "parameters": parameters(model), "engines": {}}
            results["sizes"][size] = entry
            for engine in engines:
                count = args.requests if size == "tiny" else min(args.requests, LARGE_CAP.get(engine, args.requests))
                print(f"{engine} on {model.name} ({entry['parameters']:,} parameters), {count} requests", flush=True)
                entry["engines"][engine] = {"requests": count, "layouts": measure(
                    engine, model, make_calls(count, args.max_tokens), args.reps, Path(tmp))}
                if args.json:  # kept as it goes: a long run stopped part-way still leaves its figures
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(results, indent=2) + "\n")
    results["load_at_end"] = os.getloadavg()
    print()
    print(f"{'size':6} {'engine':6} {'layout':12} {'invar s':>9} {'direct s':>9} {'native s':>9} {'invar/direct':>13} "
          f"{'µs/call':>9}")
    for size, entry in results["sizes"].items():
        for engine, per_layout in entry["engines"].items():
            for layout, row in per_layout["layouts"].items():
                native = f"{row['native']['median_s']:9.3f}" if "native" in row else f"{'-':>9}"
                invar_s, direct_s = row["invar"]["median_s"], row["direct"]["median_s"]
                print(f"{size:6} {engine:6} {layout:12} {invar_s:9.3f} {direct_s:9.3f} {native} "
                      f"{row['invar_over_direct']:13.4f} {row['fixed_cost_per_call_us']:9.0f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
