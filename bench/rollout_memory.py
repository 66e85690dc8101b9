"""Peak memory of an inference worker generating one rollout batch of real chats, as `invar train` sends it.

    .venv/bin/python bench/rollout_memory.py [--engine mlx] [--setting blas=openblas] [--chats 16]
        [--model models/smollm2-135m-instruct-mlx] [--old-src DIR] [--json OUT]

The worker (this checkout's, and with `--old-src` also another checkout's src, e.g. `git archive HEAD src | tar -x
-C /tmp/old`, each a process of its own) loads the model in float32 and answers one `generate` call: the first
`--chats` prompts of data/chat-train.jsonl (rendered as the core renders them), one batch, T = 1, 8 tokens each,
as a training cycle's rollout (configs/smollm2-mlx.toml: 64 requests in one batch). Reported per worker: its resident
memory after loading and its peak (VmHWM) after the call, in MiB, and the call's wall and CPU seconds. A prefill
that takes the output layer at every prompt position holds float32 logits [chats, width, vocabulary] at once
(64 chats × about 250 positions × 49,152 on SmolLM2: about 3 GB); one that takes it at the last position holds
[chats, 1, vocabulary].

`--cut kept,whole,blocks` instead runs the MLX worker's engine class in a process of its own for each value (with
OpenBLAS preloaded when `--setting blas=openblas` is given, as the worker preloads it), its prefill path set whatever
the load-time probe found: the output layer at the last position only (kept: `head_rows`), at every position at
once (whole), or at every position in blocks of `COLUMN_BLOCK` vocabulary columns, each cut to the last position
before the next (blocks: `column_block`): what each path holds on the same call, where the worker itself takes one
of them. Each row carries the sha256 of the call's outputs (equal: the paths gave the same bits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from procfs import cpu_s, status_kib  # noqa: E402
from report import header, write_json  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import launch_args, parse_launch_settings, start_worker  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.tasks import ModelTokenizer  # noqa: E402
from invar.tasks.population import load_units  # noqa: E402

PROMPTS = REPO / "data" / "chat-train.jsonl"


def measure(engine: str, args: list[str], model: Path, prompts: list[list[int]], src: Path | None) -> dict[str, Any]:
    load = {"model_dir": str(model), "model_digest": canonical.tree_digest(model), "dtype": "float32",
            "quantization": "none", "adapter": None}
    requests = [{"request_id": f"c{i}", "prompt_ids": p, "seed": i, "temperature": 1.0, "top_p": 1.0,
                 "max_tokens": 8} for i, p in enumerate(prompts)]
    env = None if src is None else {"PYTHONPATH": str(src)}
    with start_worker(engine, Role.INFERENCE, args=args, env=env, call_timeout=7200.0) as worker:
        pid = worker.identity.pid
        worker.call("load_model", load)
        loaded = status_kib(pid, "VmRSS")
        cpu, began = cpu_s(pid), time.perf_counter()
        worker.call("generate", {"requests": requests, "layout": [list(range(len(requests)))], "adapter": None,
                                 "reference_adapter": None})
        row = {"src": "this checkout" if src is None else str(src), "rss_after_load_mib": round(loaded / 1024, 1),
               "peak_mib": round(status_kib(pid, "VmHWM") / 1024, 1),
               "generate_wall_s": round(time.perf_counter() - began, 1), "generate_cpu_s": round(cpu_s(pid) - cpu, 1)}
    print(row, flush=True)
    return row


def child(cut: str, model: Path, prompts: list[list[int]]) -> int:
    """One engine in this process, its prefill path set by `cut`; prints the row as JSON."""
    from invar.protocol.methods import GENERATE, LOAD_MODEL, serves
    from invar.workers import mlx_worker

    engine = mlx_worker.Engine(Role.INFERENCE)
    serves(LOAD_MODEL, engine.load_model)({"model_dir": str(model), "model_digest": canonical.tree_digest(model),
                                          "dtype": "float32", "quantization": "none", "adapter": None})
    assert engine.m is not None
    probe, engine.m.head_rows = engine.m.head_rows, cut == "kept"
    engine.m.column_block = mlx_worker.COLUMN_BLOCK if cut == "blocks" else 0
    loaded = status_kib(os.getpid(), "VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    cpu = time.process_time()
    result = serves(GENERATE, engine.generate)({
        "requests": [{"request_id": f"c{i}", "prompt_ids": p, "seed": i, "temperature": 1.0, "top_p": 1.0,
                      "max_tokens": 8} for i, p in enumerate(prompts)],
        "layout": [list(range(len(prompts)))], "adapter": None, "reference_adapter": None})
    print(json.dumps({"cut": cut, "probe_head_rows": probe, "rss_after_load_mib": round(loaded / 1024, 1),
                      "peak_mib": round(status_kib(os.getpid(), "VmHWM") / 1024, 1),
                      "generate_cpu_s": round(time.process_time() - cpu, 1),
                      "outputs_sha256": canonical.sha256(canonical.encode(result["outputs"]))}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="mlx")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--model", type=Path, default=REPO / "models" / "smollm2-135m-instruct-mlx")
    parser.add_argument("--old-src", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cut", default=None, help="kept,whole,blocks: the engine class in this process, per path")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.model.is_dir():
        raise SystemExit(f"rollout_memory: {args.model} is missing; build it first: python scripts/build_smollm2.py")
    worker_args = launch_args(args.engine, parse_launch_settings(args.engine, args.setting), {})
    vocab = ModelTokenizer.from_model_dir(args.model)
    prompts = [vocab.unit_prompt(u)[1] for u in load_units(PROMPTS)[:args.chats]]
    if args.child is not None:
        return child(args.child, args.model, prompts)
    if args.cut is not None:
        import subprocess

        from invar.workers.mlx_worker import find_openblas, openblas_env

        library = find_openblas() if "blas=openblas" in args.setting else None
        env = dict(os.environ) if library is None else openblas_env(library, dict(os.environ))
        rows = []
        for cut in args.cut.split(","):
            out = subprocess.run([sys.executable, __file__, "--child", cut, "--chats", str(args.chats), "--model",
                                  str(args.model)], env=env, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    else:
        rows = [measure(args.engine, worker_args, args.model, prompts, None)]
        if args.old_src is not None:
            rows.append(measure(args.engine, worker_args, args.model, prompts, args.old_src))
    doc = {**header("rollout_memory.py", argv), "engine": args.engine,
           "settings": args.setting, "model": str(args.model), "chats": len(prompts),
           "prompt_tokens": [len(p) for p in prompts], "vocabulary": vocab.size, "workers": rows}
    write_json(args.json, doc, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
