"""vLLM's engine core in the worker's process against a spawned one: the same numbers, and the time each takes.

    .venv/bin/python bench/vllm_engine_core.py

Starts the vLLM worker twice on the shipped model, once with `VLLM_ENABLE_V1_MULTIPROCESSING=1` (a spawned engine
core, vLLM's default) and once with `=0` (in-process, the worker's default on one CPU device), and sends each the
same calls: 96 prompts of the evaluation population generated at T = 1 in one batch, at T = 0.7 in two batches
(even indices; odd ones reversed) and greedily, each generation then teacher-forced (`score`, with the whole
vocabulary at step 0). One sha256 over every token id, sampled log-probability, score and vocabulary row, per mode;
they must be equal (exit 1 otherwise). Prints each mode's digest and wall time (start, load, calls, close).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO / "src"))

from invar.canonical import tree_digest  # noqa: E402
from invar.engines import DEFAULT_MODEL, start_worker  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.tasks import ModelTokenizer  # noqa: E402

UNITS = 96


def run(multiprocessing: str) -> tuple[str, float]:
    started = time.perf_counter()
    tok = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    lines = (REPO / "data" / "arith-eval.jsonl").read_text(encoding="utf-8").splitlines()[:UNITS]
    prompts = [json.loads(line)["prompt"] for line in lines]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing}
    if multiprocessing == "1":  # the worker reads its effective configuration back from the spawned core, which
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # vLLM allows only so (docs/vllm.md)
    worker = start_worker("vllm", Role.INFERENCE, env=env)
    digest = hashlib.sha256()
    try:
        worker.call("load_model", {"model_dir": str(DEFAULT_MODEL), "model_digest": tree_digest(DEFAULT_MODEL),
                                   "dtype": "float32", "quantization": "none", "adapter": None})
        split = [list(range(0, UNITS, 2)), list(range(1, UNITS, 2))[::-1]]
        for temperature, layout in ((1.0, [list(range(UNITS))]), (0.7, split), (0.0, [list(range(UNITS))])):
            reqs = [{"request_id": f"r{i}", "prompt_ids": tok.prompt_ids(prompt=p), "prompt": p, "seed": i,
                     "temperature": temperature, "top_p": 1.0, "max_tokens": 12} for i, p in enumerate(prompts)]
            outputs = worker.call("generate", {"requests": reqs, "layout": layout})["outputs"]
            for o in outputs:
                digest.update(np.asarray(o["tokens"], dtype=np.int32).tobytes())
                digest.update(np.asarray(o["logprobs"], dtype=np.float32).tobytes())
            items = [{"item_id": o["request_id"], "prompt_ids": r["prompt_ids"], "prompt": r["prompt"],
                      "response_tokens": o["tokens"], "temperature": max(temperature, 0.5), "vocab_steps": [0]}
                     for o, r in zip(outputs, reqs, strict=True)]
            for s in worker.call("score", {"items": items})["outputs"]:
                digest.update(np.asarray(s["logprobs"], dtype=np.float32).tobytes())
                digest.update(np.asarray(s["vocab_logprobs"], dtype=np.float32).tobytes())
    finally:
        worker.close()
    return digest.hexdigest(), time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    results = {mode: run(value) for mode, value in (("spawned", "1"), ("in-process", "0"))}
    for mode, (digest, wall) in results.items():
        print(f"{mode:10s} {digest} {wall:.1f} s")
    same = len({d for d, _ in results.values()}) == 1
    print("same numbers" if same else "DIFFERENT numbers")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
