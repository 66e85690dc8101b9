"""What the MLX worker's BLAS changes: speed, and the invariances the bundled reference BLAS gives for free.

    .venv/bin/python bench/mlx_blas.py [--models models/tiny-arith,models/smollm2-135m-instruct-mlx] [--prompts 8]
        [--json docs/performance/mlx_blas.json]

On Linux the MLX CPU backend sends every float32 matmul to `cblas_sgemm`. The mlx-cpu wheel links netlib's
reference BLAS; the worker's `blas = "openblas"` setting puts OpenBLAS in front of it (docs/mlx.md). For each BLAS:

- **matmul**: the seconds and GFLOP/s of one [210 × 576] · [576 × 49,152] float32 product (SmolLM2's output layer
  over one chat), the best of 3, in a process of its own with that BLAS preloaded as the worker preloads it;
- per model, through the MLX worker (`invar.engines.start_worker`, inference role): the first `--prompts` prompts of
  the model's task (chat messages for a chat model, `data/arith-eval.jsonl`'s prompts otherwise), T = 1, seeds
  0..n-1, 8 new tokens: generated in one batch and each alone (**alone vs batch**: responses with the same tokens,
  and with bit-identical log-probabilities), and the batch's responses teacher-forced by `score` (**generate vs
  score**: responses whose log-probabilities are bit-identical to generate's), with the generate call's wall time.

The reference BLAS computes each dot product in one order whatever the matrices' shapes, so a row's numbers do not
depend on how many rows share the product: MLX's bit-identities across batch layouts, and between the decode loop
and teacher forcing, rest on it. OpenBLAS picks kernels and blockings by shape.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from report import write_json

from invar import canonical
from invar.engines import start_worker
from invar.protocol import Role
from invar.tasks import ModelTokenizer
from invar.transport import WorkerClient

REPO = Path(__file__).resolve().parents[1]
BLAS = ("bundled", "openblas")

_MATMUL = """
import time, mlx.core as mx
a = mx.random.normal((210, 576), key=mx.random.key(0)); b = mx.random.normal((576, 49152), key=mx.random.key(1))
mx.eval(a, b)
best = min((lambda t: (mx.eval(a @ b), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
print(best)
"""


def matmul_seconds(blas: str) -> float:
    """One [210 × 576] · [576 × 49,152] product's best time of 3, with `blas` loaded as the worker loads it."""
    env = dict(os.environ)
    if blas == "openblas":
        from invar.workers.mlx_worker import find_openblas, openblas_env

        library = find_openblas()
        if library is None:
            raise SystemExit("no OpenBLAS found (docs/mlx.md)")
        env = openblas_env(library, env)
    out = subprocess.run([sys.executable, "-c", _MATMUL], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def prompts_for(model: Path, n: int) -> list[list[int]]:
    tok = ModelTokenizer.from_model_dir(model)
    chat = (model / "chat_template.jinja").exists()
    lines = (REPO / "data" / ("chat-eval.jsonl" if chat else "arith-eval.jsonl")).read_text().splitlines()[:n]
    problems = [json.loads(line) for line in lines]
    return [tok.prompt_ids(messages=p["messages"]) if chat else tok.prompt_ids(prompt=p["prompt"]) for p in problems]


def _generate(worker: WorkerClient, ids: list[list[int]], which: list[int]) -> list[dict[str, Any]]:
    reqs = [{"request_id": f"c{i}", "prompt": "", "prompt_ids": ids[i], "seed": i, "temperature": 1.0,
             "top_p": 1.0, "max_tokens": 8} for i in which]
    outputs: list[dict[str, Any]] = worker.call("generate", {"requests": reqs})["outputs"]
    return outputs


def _bits(out: dict[str, Any]) -> bytes:
    return np.asarray(out["logprobs"], dtype=np.float32).tobytes()


def invariances(model: Path, blas: str, n: int) -> dict[str, Any]:
    ids = prompts_for(model, n)
    worker = start_worker("mlx", Role.INFERENCE, args=["--blas", blas])
    try:
        worker.call("load_model", {"model_dir": str(model), "model_digest": canonical.tree_digest(model),
                                   "dtype": "float32", "quantization": "none", "adapter": None})
        began = time.perf_counter()
        together = _generate(worker, ids, list(range(n)))
        batch_s = time.perf_counter() - began
        alone = [_generate(worker, ids, [i])[0] for i in range(n)]
        items = [{"item_id": f"c{i}", "prompt": "", "prompt_ids": ids[i], "response_tokens": out["tokens"],
                  "temperature": 1.0, "vocab_steps": []} for i, out in enumerate(together)]
        scored = worker.call("score", {"items": items})["outputs"]
        identity = {"settings": worker.identity.settings, "engine_version": worker.identity.engine_version}
    finally:
        worker.close()
    return {"model": str(model.relative_to(REPO) if model.is_relative_to(REPO) else model), "blas": blas,
            "prompts": n, "prompt_tokens": [len(p) for p in ids], "generate_batch_s": round(batch_s, 2),
            "alone_vs_batch_same_tokens": sum(a["tokens"].tolist() == b["tokens"].tolist()
                                              for a, b in zip(together, alone, strict=True)),
            "alone_vs_batch_bit_identical": sum(_bits(a) == _bits(b) for a, b in zip(together, alone, strict=True)),
            "generate_vs_score_bit_identical": sum(_bits(a) == _bits(s)
                                                   for a, s in zip(together, scored, strict=True)),
            "identity": identity}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="models/tiny-arith,models/smollm2-135m-instruct-mlx",
                    help="model folders, comma-separated")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    flops = 2 * 210 * 576 * 49152
    result: dict[str, Any] = {"matmul": {}, "models": [], "loadavg_start": os.getloadavg()}
    for blas in BLAS:
        seconds = matmul_seconds(blas)
        result["matmul"][blas] = {"seconds": round(seconds, 4), "gflops": round(flops / seconds / 1e9, 1)}
        print(f"[mlx_blas] matmul [210x576]·[576x49152], {blas}: {seconds:.3f} s, {flops / seconds / 1e9:.1f} GFLOP/s",
              flush=True)
    for name in args.models.split(","):
        for blas in BLAS:
            row = invariances((REPO / name).resolve() if not Path(name).is_absolute() else Path(name), blas,
                              args.prompts)
            result["models"].append(row)
            print(f"[mlx_blas] {row['model']}, {blas}: alone vs batch of {row['prompts']}: same tokens "
                  f"{row['alone_vs_batch_same_tokens']}, bit-identical {row['alone_vs_batch_bit_identical']}; "
                  f"generate vs score bit-identical {row['generate_vs_score_bit_identical']}; "
                  f"generate of the batch {row['generate_batch_s']} s", flush=True)
    result["loadavg_end"] = os.getloadavg()
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
