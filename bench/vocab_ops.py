"""The large-vocabulary units' operations, MLX on this CPU against torch: where MLX's time goes on them.

    .venv/bin/python bench/vocab_ops.py [--vocab 262144] [--hidden 128] [--rows 1,8,40,160] [--reps 3]
        [--blocks 2048,16384] [--json docs/performance/vocab_ops.json]

On `bench/prefill_vocab.py`'s model (Gemma 3's 262,144-token vocabulary on a body of hidden width 128) nearly all of a
forward is the output layer, so the MLX worker's time there is a few operations, timed here one by one on the same
float32 inputs, each in a process of its own (so one library's threads and allocator do not colour the other's):

- **matmul**: the output layer [rows × hidden] · [hidden × vocab] (rows 1: one decode step; 8: one decode step of a
  batch of 8; 40 and 160: a prefill's rows read by 40 units, once and four times; a phase of 40 units reads 640),
  with GFLOP/s;
- **matmul_t**: the same product with the layer stored [vocab × hidden] and used transposed (a tied output layer,
  as the embedding; what Gemma 3's and SmolLM2's forwards run);
- **matmul_bB** (MLX only, one per `--blocks` size B): the [hidden × vocab] product taken in column blocks of B
  contiguous columns each, the blocks' products concatenated (the same sums: whether a cache-sized block helps);
- **matmul_tiled** (MLX only): the MLX inference worker's own product (`TiledHead`: the reference BLAS's sums by a
  compiled kernel on the layer stored in [vocab/64 × hidden × 64] tiles), checked equal to `matmul` bit for bit;
- **logsumexp** and **log_softmax** of the [rows × vocab] logits (log_softmax: logits − logsumexp);
- **step**: one decode step's bookkeeping without the output layer: a [1 × hidden] · [hidden × hidden] product and
  evaluating it (MLX builds a graph and `mx.eval`s it; torch runs at once), the fixed cost a step pays.

MLX runs on its CPU device with the BLAS the mlx-cpu wheel bundles (netlib's reference `cblas_sgemm`, the worker's
default `blas = "bundled"`); torch with one thread, as the HF worker runs by default (`--threads 1`). Reported per
operation: the best of `--reps` CPU times of the process (user + system; the machine may be loaded), in ms.
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

from report import header, write_json

REPO = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    return time.process_time()  # every thread of this process, at the clock's resolution (os.times: 10 ms)


def _time(run: Any, reps: int) -> float:
    """The best of `reps` CPU times of `run()` (after one untimed call), in ms."""
    run()
    best = float("inf")
    for _ in range(reps):
        c0 = _cpu()
        run()
        best = min(best, _cpu() - c0)
    return best * 1e3


def _inputs(vocab: int, hidden: int, rows: list[int]) -> tuple[Any, Any, dict[int, Any]]:
    """The output layer [hidden × vocab], a [hidden × hidden] product, and [n × hidden] inputs, seeded float32."""
    import numpy as np

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((hidden, vocab), dtype=np.float32) * 0.05
    square = rng.standard_normal((hidden, hidden), dtype=np.float32) * 0.05
    return weight, square, {n: rng.standard_normal((n, hidden), dtype=np.float32) for n in rows}


def measure_mlx(vocab: int, hidden: int, rows: list[int], reps: int, blocks: list[int]) -> dict[str, float]:
    """Every operation's best CPU ms in this process, on MLX's CPU device."""
    import mlx.core as mx
    import numpy as np

    from invar.workers.mlx_worker import TiledHead

    mx.set_default_device(mx.cpu)
    weight, square, inputs = _inputs(vocab, hidden, rows)
    w, sq = mx.array(weight), mx.array(square)
    wt = mx.array(weight.T.copy())  # a tied output layer: the embedding [vocab × hidden], used transposed
    parts = {b: [mx.contiguous(w[:, c:c + b]) for c in range(0, vocab, b)] for b in blocks}
    mx.eval(parts)
    tiled = TiledHead(wt)
    out: dict[str, float] = {}
    for n, x in inputs.items():
        a = mx.array(x)
        logits = a @ w
        mx.eval(logits)
        out[f"matmul {n}"] = _time(lambda a=a: mx.eval(a @ w), reps)
        out[f"matmul_t {n}"] = _time(lambda a=a: mx.eval(a @ wt.T), reps)
        for b, part in parts.items():
            def blocked(a: Any = a, part: list[Any] = part) -> Any:
                return mx.concatenate([a @ p for p in part], axis=-1)

            if not bool(mx.array_equal(blocked(), logits).item()):
                raise SystemExit(f"vocab_ops: the product in blocks of {b} columns differs from the whole product")
            out[f"matmul_b{b} {n}"] = _time(lambda blocked=blocked: mx.eval(blocked()), reps)
        if np.array(tiled(a)).tobytes() != np.array(logits).tobytes():
            raise SystemExit("vocab_ops: the tiled kernel's product differs from MLX's")
        out[f"matmul_tiled {n}"] = _time(lambda a=a: mx.eval(tiled(a)), reps)
        out[f"logsumexp {n}"] = _time(lambda z=logits: mx.eval(mx.logsumexp(z, axis=-1, keepdims=True)), reps)
        out[f"log_softmax {n}"] = _time(lambda z=logits: mx.eval(z - mx.logsumexp(z, axis=-1, keepdims=True)), reps)
    one = mx.array(inputs[rows[0]][:1])
    out["step"] = _time(lambda: mx.eval(one @ sq), max(reps, 200))
    return out


def measure_torch(vocab: int, hidden: int, rows: list[int], reps: int) -> dict[str, float]:
    """Every operation's best CPU ms in this process, in torch with one thread."""
    import torch

    torch.set_num_threads(1)
    weight, square, inputs = _inputs(vocab, hidden, rows)
    w, sq = torch.from_numpy(weight), torch.from_numpy(square)
    wt = torch.from_numpy(weight.T.copy())
    out: dict[str, float] = {}
    with torch.inference_mode():
        for n, x in inputs.items():
            a = torch.from_numpy(x)
            logits = a @ w
            out[f"matmul {n}"] = _time(lambda a=a: a @ w, reps)
            out[f"matmul_t {n}"] = _time(lambda a=a: torch.nn.functional.linear(a, wt), reps)
            out[f"logsumexp {n}"] = _time(lambda z=logits: torch.logsumexp(z, dim=-1, keepdim=True), reps)
            out[f"log_softmax {n}"] = _time(lambda z=logits: torch.log_softmax(z, dim=-1), reps)
        one = torch.from_numpy(inputs[rows[0]][:1])
        out["step"] = _time(lambda: one @ sq, max(reps, 200))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--rows", default="1,8,40,160")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--blocks", default="2048,16384", help="MLX's column-block sizes (matmul_bB); '' for none")
    parser.add_argument("--library", choices=["mlx", "torch"], help=argparse.SUPPRESS)  # one measuring process
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    blocks = [int(b) for b in args.blocks.split(",") if b]
    if args.library is not None:
        found = (measure_mlx(args.vocab, args.hidden, rows, args.reps, blocks) if args.library == "mlx"
                 else measure_torch(args.vocab, args.hidden, rows, args.reps))
        print(json.dumps(found))
        return 0
    load = os.getloadavg()[0]
    results: dict[str, dict[str, float]] = {}
    for library in ("mlx", "torch"):
        proc = subprocess.run([sys.executable, __file__, "--library", library, "--vocab", str(args.vocab),
                               "--hidden", str(args.hidden), "--rows", args.rows, "--reps", str(args.reps),
                               "--blocks", args.blocks],
                              capture_output=True, text=True, check=True)
        results[library] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{'operation':<18}{'mlx ms':>12}{'torch ms':>12}{'mlx/torch':>11}{'mlx GFLOP/s':>13}{'torch GFLOP/s':>15}")
    table = []
    for op in results["mlx"]:
        # MLX's blocked and tiled products are set against torch's same product (`matmul`).
        m, t = results["mlx"][op], results["torch"][op if op in results["torch"] else f"matmul {op.split()[1]}"]
        flops = 2 * int(op.split()[1]) * args.hidden * args.vocab if op.startswith("matmul") else 0
        row: dict[str, Any] = {"operation": op, "mlx_ms": round(m, 3), "torch_ms": round(t, 3),
                               "mlx_over_torch": round(m / t, 2) if t > 0 else None}
        if flops:
            row["mlx_gflops"] = round(flops / m / 1e6, 2) if m > 0 else None
            row["torch_gflops"] = round(flops / t / 1e6, 2) if t > 0 else None
        table.append(row)
        print(f"{op:<18}{m:>12.3f}{t:>12.3f}{row['mlx_over_torch'] or 0:>11.2f}"
              f"{row.get('mlx_gflops') or 0:>13.2f}{row.get('torch_gflops') or 0:>15.2f}")
    doc = {**header("vocab_ops.py", argv),
           "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
           "vocab": args.vocab, "hidden": args.hidden, "reps": args.reps, "operations": table}
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
