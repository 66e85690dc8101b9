"""Peak memory of an engine worker scoring the real model's chats, at T = 1 and T != 1, with and without captures.

    .venv/bin/python bench/score_memory.py [--engine vllm] [--count 32] [--temperatures 1.0,0.7]
        [--env NAME=VALUE ...] [--worker-arg=--max-num-seqs=32 ...] [--out docs/performance/score_memory.json]

One worker of `--engine` loads SmolLM2-135M-Instruct (`models/smollm2-135m-instruct`, built by
scripts/build_smollm2.py), samples `--count` chats of `data/chat-eval.jsonl` (as `invar evaluate` renders them) at
each temperature, then scores all of them in ONE `score` call: first the response tokens alone, then with
whole-vocabulary captures at the first and the last step. Reported per phase: the worker's resident memory when the
phase starts and its peak during the phase (the kernel's VmHWM of the worker process, reset before each phase by
writing 5 to /proc/PID/clear_refs, which needs root or the worker's own user), in MiB. Teacher forcing at T != 1
once took the vLLM worker past 15 GB on these 32 chats (it asked for the whole vocabulary at every prompt
position), so that is the figure this bench exists to hold down. `--env` sets a variable in the worker's environment
(`VLLM_CPU_KVCACHE_SPACE=1`: vLLM's 1 GiB KV cache instead of the one the worker sizes), `--worker-arg` passes a
launch argument; each phase records the sha256 of what it returned (tokens, log-probabilities, captured rows), so
two runs can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from procfs import status_kib  # noqa: E402
from report import header, write_json  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import start_worker  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.runner.evaluate import request_seed, sample_indices  # noqa: E402
from invar.tasks import ModelTokenizer  # noqa: E402
from invar.tasks.population import load_units  # noqa: E402

MODEL = REPO / "models" / "smollm2-135m-instruct"
POPULATION = REPO / "data" / "chat-eval.jsonl"
MAX_TOKENS = 8
BATCH = 16


def _phase(pid: int, name: str, run: Any, outputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run `run()` as one phase: the worker's resident memory before it and its peak during it, in MiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = status_kib(pid, "VmRSS")
    began = time.perf_counter()
    result = run()
    row = {"phase": name, "rss_before_mib": round(before / 1024, 1),
           "peak_mib": round(status_kib(pid, "VmHWM") / 1024, 1), "wall_s": round(time.perf_counter() - began, 1)}
    print(f"{name}: {row['rss_before_mib']} MiB before, peak {row['peak_mib']} MiB, {row['wall_s']} s", flush=True)
    row["result"] = result
    if outputs is not None:
        row["outputs_sha256"] = _digest(outputs)
    return row


def _digest(outputs: list[dict[str, Any]]) -> str:
    """sha256 over every array a call returned, in order: equal digests mean the same bits."""
    h = hashlib.sha256()
    for o in outputs:
        for key in sorted(o):
            value = o[key]
            h.update(key.encode() + (value.tobytes() if hasattr(value, "tobytes") else str(value).encode()))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--temperatures", default="1.0,0.7")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--worker-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "performance" / "score_memory.json")
    args = parser.parse_args(argv)
    if not MODEL.is_dir():
        raise SystemExit(f"score_memory: {MODEL} is missing; build it first: python scripts/build_smollm2.py")
    vocab = ModelTokenizer.from_model_dir(MODEL)
    units = load_units(POPULATION)
    chosen = [units[i] for i in sample_indices(len(units), args.count, 0)]
    prompts = [vocab.unit_prompt(u) for u in chosen]
    load = {"model_dir": str(MODEL), "model_digest": canonical.tree_digest(MODEL), "dtype": "float32",
            "quantization": "none", "adapter": None}
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    env = dict(e.split("=", 1) for e in args.env)
    with start_worker(args.engine, Role.INFERENCE, env=env, args=args.worker_arg) as worker:
        pid = worker.identity.pid  # the worker process itself, as its handshake names it
        rows.append(_phase(pid, "load_model", lambda: worker.call("load_model", load)["model_digest"][:12]))
        for temperature in (float(t) for t in args.temperatures.split(",")):
            drawn: list[dict[str, Any]] = []

            def generate(t: float = temperature, out: list[dict[str, Any]] = drawn) -> int:
                for start in range(0, len(chosen), BATCH):
                    reqs = [{"request_id": u.id, "prompt": text, "prompt_ids": ids, "seed": request_seed(0, u.id),
                             "temperature": t, "top_p": 1.0, "max_tokens": MAX_TOKENS}
                            for u, (text, ids) in zip(chosen[start:start + BATCH], prompts[start:start + BATCH],
                                                      strict=True)]
                    out += worker.call("generate", {"requests": reqs, "layout": [list(range(len(reqs)))],
                                                    "adapter": None, "reference_adapter": None})["outputs"]
                return sum(int(o["tokens"].size) for o in out)

            def score(t: float = temperature, captures: bool = False, out: list[dict[str, Any]] = drawn,
                      kept: list[dict[str, Any]] | None = None) -> int:
                items = [{"item_id": o["request_id"], "prompt": text, "prompt_ids": ids,
                          "response_tokens": o["tokens"], "temperature": t,
                          "vocab_steps": sorted({0, int(o["tokens"].size) - 1}) if captures else []}
                         for o, (text, ids) in zip(out, prompts, strict=True)]
                scored = worker.call("score", {"items": items, "adapter": None})["outputs"]
                if kept is not None:
                    kept += scored
                return sum(int(s["vocab_logprobs"].shape[0]) for s in scored)

            rows.append(_phase(pid, f"generate T={temperature:g}", generate, drawn))
            scored_t = temperature if temperature > 0 else 1.0
            plain: list[dict[str, Any]] = []
            captured: list[dict[str, Any]] = []
            rows.append(_phase(pid, f"score T={scored_t:g}", lambda s=scored_t, k=plain: score(s, kept=k), plain))
            rows.append(_phase(pid, f"score T={scored_t:g}, captures at the first and last step",
                               lambda s=scored_t, k=captured: score(s, captures=True, kept=k), captured))
    doc = {**header("score_memory.py", argv), "engine": args.engine,
           "model": str(MODEL.relative_to(REPO)), "env": env, "worker_args": args.worker_arg,
           "chats": len(chosen), "max_tokens": MAX_TOKENS,
           "vocabulary": vocab.size, "phases": rows, "wall_s": round(time.perf_counter() - started, 1)}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
