"""Whether a row of an output-layer product keeps its bits when the product holds fewer rows, per BLAS.

    .venv/bin/python bench/openblas_rows.py [--vocab 49152] [--hidden 576] [--rows 8,37,64]
        [--blas bundled,openblas] [--json docs/performance/openblas_rows.json]

The MLX inference worker takes the output layer at the used positions only where each kept row is the whole
forward's bit for bit (docs/mlx.md, "The output layer only where it is read"). This measures, on MLX's CPU device,
a random float32 layer of SmolLM2's shape ([vocab × hidden], used transposed, as mlx-lm's tied layer) and `--rows`
random inputs [N × hidden]: for each row j of the whole product X · Wᵀ, whether the same row computed in a smaller
product has the same bits, for the smaller products a cut could run: the row alone; the aligned group of 4, 8 or 16
rows holding it; the suffix X[j:] (teacher forcing's cut); the prefix X[:j + 1]; and every row at once with the
product taken 1,000 or 4,096 vocabulary columns at a time (the worker's column blocks). Each BLAS runs in a
process of its own (`--blas`): the bundled reference BLAS (slow: a few minutes at N = 64 on a quiet core), and
OpenBLAS preloaded as the worker's `--blas openblas` does (one thread), whose kernels depend on the CPU (recorded as
`openblas_core`).
Reported: per BLAS, per N and per partition, the count of rows equal to the whole product's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from report import header, write_json

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = ("alone", "group of 4", "group of 8", "group of 16", "suffix", "prefix")
COLUMN_BLOCKS = (1000, 4096)
"""Every row at once, the product taken this many vocabulary columns at a time (the MLX worker's
`logits_in_blocks`)."""


def _span(kind: str, j: int, n: int) -> tuple[int, int]:
    """The rows [a, b) of the smaller product that holds row j."""
    if kind == "alone":
        return j, j + 1
    if kind.startswith("group of "):
        size = int(kind.rsplit(" ", 1)[1])
        return j // size * size, min(n, j // size * size + size)
    return (j, n) if kind == "suffix" else (0, j + 1)


def measure(vocab: int, hidden: int, rows: list[int]) -> dict[str, dict[str, int]]:
    """Per N, per partition: how many of the N rows keep the whole product's bits, in this process's BLAS."""
    import mlx.core as mx
    import numpy as np

    mx.set_default_device(mx.cpu)
    rng = np.random.default_rng(0)
    weight = mx.array(rng.standard_normal((vocab, hidden), dtype=np.float32) * 0.05)
    out: dict[str, dict[str, int]] = {}
    for n in rows:
        x = mx.array(rng.standard_normal((n, hidden), dtype=np.float32))
        whole = np.array(x @ weight.T)
        counts = {}
        for kind in PARTITIONS:
            same = 0
            for j in range(n):
                a, b = _span(kind, j, n)
                same += np.array(x[a:b] @ weight.T)[j - a].tobytes() == whole[j].tobytes()
            counts[kind] = same
        for block in COLUMN_BLOCKS:
            blocks = np.concatenate([np.array(x @ weight[v:v + block].T) for v in range(0, vocab, block)], axis=1)
            counts[f"columns by {block}"] = sum(blocks[j].tobytes() == whole[j].tobytes() for j in range(n))
        out[str(n)] = counts
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--rows", default="8,37,64")
    parser.add_argument("--blas", default="bundled,openblas")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one measuring process
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    if args.measure:
        print(json.dumps(measure(args.vocab, args.hidden, rows)))
        return 0
    sys.path.insert(0, str(REPO / "src"))
    from invar.workers.mlx_worker import find_openblas, openblas_env

    library = find_openblas()
    if library is None:
        raise SystemExit("openblas_rows: no OpenBLAS library found (the worker's --blas openblas finds none either)")
    results: dict[str, Any] = {}
    envs = {"bundled": {**os.environ}, "openblas": openblas_env(library, {**os.environ})}
    for blas in args.blas.split(","):
        env = envs[blas]
        proc = subprocess.run([sys.executable, __file__, "--measure", "--vocab", str(args.vocab), "--hidden",
                               str(args.hidden), "--rows", args.rows], capture_output=True, text=True, check=True,
                              env=env)
        results[blas] = json.loads(proc.stdout.strip().splitlines()[-1])
        for n, counts in results[blas].items():
            print(f"{blas:<9} N={n:<4} " + ", ".join(f"{k}: {v}/{n}" for k, v in counts.items()), flush=True)
    import ctypes

    core = ctypes.CDLL(str(library)).openblas_get_corename
    core.restype = ctypes.c_char_p
    doc = {**header("openblas_rows.py", argv),
           "vocab": args.vocab, "hidden": args.hidden, "openblas_library": library.name,
           "openblas_core": core().decode(),
           "rows_equal_to_the_whole_product": results}
    write_json(args.json, doc, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
