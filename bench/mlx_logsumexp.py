"""The MLX worker's logsumexp kernel against MLX's own: every exponential it can meet, and the time of a table.

    .venv/bin/python bench/mlx_logsumexp.py [--stride 1] [--rows 16] [--vocab 262144] [--reps 5] [--json FILE]

1. The exponential: every `--stride`-th float32 from −0 down to −88 (1 = all 1,118,830,593 of them: the inputs a
   logsumexp's exponential meets, each entry less its row's maximum), in chunks, through the kernel's exponential
   (`mlx_worker.logsumexp_kernels`) and through `mx.exp` on the CPU; reported: how many differ in any bit.
2. The logsumexp of a `--rows` × `--vocab` table of normal draws (×3, seeded), `mx.logsumexp` and the worker's
   `row_logsumexp` alternating, `--reps` each: the medians and their ratio, and whether the two gave the same bits.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path, where a bench's name could hide a module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from invar.workers import mlx_worker  # noqa: E402

CHUNK = 1 << 24


def exponentials(stride: int) -> dict[str, int]:
    """How many of every `stride`-th float32 in [−88, −0] the kernel's exponential gives otherwise than `mx.exp`."""
    first, last = 0x80000000, 0xC2B00000  # −0 and −88 as bit patterns: the magnitude grows with the pattern
    _, kernel = mlx_worker.logsumexp_kernels()
    checked = differing = 0
    step = CHUNK * stride
    for start in range(first, last + 1, step):
        x = np.arange(start, min(last + 1, start + step), stride, dtype=np.uint64).astype(np.uint32).view(np.float32)
        ours = np.empty_like(x)
        kernel(x, ours)
        theirs = np.array(mx.exp(mx.array(x)), dtype=np.float32)
        differing += int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
        checked += x.size
        print(f"\rexponentials: {checked:,} checked, {differing} differing", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {"checked": checked, "differing": differing, "stride": stride}


def timing(rows: int, vocab: int, reps: int) -> dict[str, object]:
    """`mx.logsumexp` against the worker's `row_logsumexp` on one table, alternating: medians and the bits."""
    if not mlx_worker.logsumexp_matches():
        raise SystemExit("mlx_logsumexp: the kernel fails its probe in this process (not the CPU device, no numba, or "
                         "another MLX), so the worker uses MLX's own; nothing to time")
    table = mx.array((np.random.default_rng(0).standard_normal((rows, vocab)) * 3).astype(np.float32))
    mx.eval(table)
    times: dict[str, list[float]] = {"mlx": [], "kernel": []}
    out: dict[str, bytes] = {}
    for _ in range(reps):
        for name in times:
            start = time.perf_counter()
            got = (mx.logsumexp(table, axis=-1, keepdims=True) if name == "mlx"
                   else mlx_worker.row_logsumexp(table))
            mx.eval(got)
            times[name].append(time.perf_counter() - start)
            out[name] = np.array(got).tobytes()
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"rows": rows, "vocab": vocab, "reps": reps, "median_s": medians,
            "mlx_over_kernel": medians["mlx"] / medians["kernel"], "same_bits": out["mlx"] == out["kernel"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = {"mlx": version("mlx"), "exponentials": exponentials(args.stride),
              "logsumexp": timing(args.rows, args.vocab, args.reps)}
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
