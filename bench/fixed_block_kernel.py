"""fixed-block's compiled kernel against its torch operations, side by side in one run, the same bits checked.

    .venv/bin/python bench/fixed_block_kernel.py [--reps 5] [--json docs/performance/fixed_block_kernel.json]

patches/fixed-block computes every product and row sum in fixed blocks of 16 by a fixed tree. `kernel.c` does it
compiled; `bmm_torch` / `block_sum_torch` do it with torch elementwise operations (the reference, and the fallback
where no C compiler is found). For each shape, alternating the two, the fastest and the median of `--reps` calls,
and whether the results are bit-identical. The shapes are SmolLM2-135M's (hidden 576, MLP 1,536, vocabulary 49,152):
one decode step of a batch of 16, a prefill of 16 chats of ~110 tokens, and the output layer over one chat.
The torch operations run on torch's threads (all cores by default); the kernel runs on one thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from report import write_json

from invar.patches import patch_digest
from invar.workers.common import load_patches

# (what, M, K, N): the product [M, K] by a linear layer's weight [N, K] transposed, as a linear layer passes it.
PRODUCTS = [
    ("decode, batch 16: attention projection", 16, 576, 576),
    ("decode, batch 16: MLP up", 16, 576, 1536),
    ("decode, batch 16: MLP down", 16, 1536, 576),
    ("decode, batch 16: output layer", 16, 576, 49152),
    ("prefill, 16 chats × 110 tokens: attention projection", 1760, 576, 576),
    ("output layer over one chat (210 tokens)", 210, 576, 49152),
]
ROW_SUMS = [("log_softmax's sum over the vocabulary, batch 16", 16, 49152), ("RMSNorm, prefill", 1760, 576)]


def _time(fn: Any) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    # The patch's code as a worker imports it (its digest checked first), nothing applied.
    fb = load_patches([f"fixed-block={patch_digest('fixed-block')}"], []).modules["fixed-block"]
    lib = fb._kernel()
    if lib is None:
        raise SystemExit(f"the kernel was not built here: {fb.implementation()}")
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    cases: list[tuple[str, Any, Any, float]] = []
    for what, m, k, n in PRODUCTS:
        a, w = torch.randn(1, m, k, generator=gen), torch.randn(1, n, k, generator=gen)
        b = w.transpose(1, 2)
        cases.append((f"{what}: [{m} × {k}] · [{k} × {n}]", lambda a=a, b=b: fb._bmm_c(lib, a, b),
                      lambda a=a, b=b: fb.bmm_torch(a, b), 2.0 * m * k * n))
    for what, r, k in ROW_SUMS:
        x = torch.randn(r, k, generator=gen)
        cases.append((f"{what}: {r} rows of {k}", lambda x=x: fb._block_sum_c(lib, x, -1, False),
                      lambda x=x: fb.block_sum_torch(x, -1, False), float(r * k)))
    for name, kernel, reference, flops in cases:
        times: dict[str, list[float]] = {"kernel": [], "torch": []}
        same = True
        for _ in range(args.reps):
            tk, out_k = _time(kernel)
            tt, out_t = _time(reference)
            times["kernel"].append(tk)
            times["torch"].append(tt)
            same = same and torch.equal(out_k.view(torch.int32), out_t.view(torch.int32))
        row: dict[str, Any] = {"case": name, "bit_identical": same,
               **{f"{impl}_s_min": min(t) for impl, t in times.items()},
               **{f"{impl}_s_median": statistics.median(t) for impl, t in times.items()},
               "speedup_median": statistics.median(times["torch"]) / statistics.median(times["kernel"]),
               "kernel_gflops": flops / min(times["kernel"]) / 1e9}
        rows.append(row)
        print(f"{name}: kernel {row['kernel_s_median'] * 1e3:.2f} ms, torch {row['torch_s_median'] * 1e3:.2f} ms "
              f"(median), {row['speedup_median']:.1f}x, bit-identical {same}", flush=True)
    doc = {"implementation": fb.implementation(), "torch_threads": torch.get_num_threads(), "reps": args.reps,
           "torch": torch.__version__, "cases": rows}
    write_json(args.json, doc)
    if not all(r["bit_identical"] for r in rows):
        raise SystemExit("the kernel and the torch operations gave different bits")


if __name__ == "__main__":
    main()
