"""Measure the candidate patches against the stock engines: the numbers in patches/*/README.md.

    .venv/bin/python tests/patches/measure_patches.py [--engines hf,vllm] [--repeats 5] [--n 32]

For each engine it starts the stock worker, then one worker per patch (one at a time), runs the first N evaluation
prompts (T = 1, a seed per request) as one batch, as two halves, as shuffled halves and one by one, and prints per
worker: the share of log-probabilities bit-equal between the one-batch run and each other layout, the largest
difference from stock (requests whose tokens agree with stock), how many requests sampled other tokens than stock,
and the wall time of one generate call of the N prompts as one batch (the fastest of `--repeats`), with its ratio
to stock. The vLLM stock row is measured twice: as the worker runs by default (engine core in a spawned process)
and with the engine core in the worker's process, as patched workers run it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "workers" / "hf")]

from hf_calls import load_params, make_requests  # noqa: E402
from patch_helpers import bit_equal_share, layouts, patch_args, run, same_token_diff  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import DEFAULT_MODEL, start_worker  # noqa: E402
from invar.protocol import Role  # noqa: E402
from invar.tasks import load_population  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to


def measure(engine: str, args: list[str], env: dict[str, str], requests: list[dict[str, Any]],
            repeats: int) -> dict[str, Any]:
    worker = start_worker(engine, Role.INFERENCE, args=args, env=env)
    try:
        worker.call("load_model", load_params(DEFAULT_MODEL, canonical.tree_digest(DEFAULT_MODEL)))
        n = len(requests)
        outputs = {name: run(worker, requests, layout)["outputs"] for name, layout in layouts(n).items()}
        times = []
        calls = None
        for _ in range(repeats):
            started = time.perf_counter()
            result = run(worker, requests, layouts(n)["one batch"])
            times.append(time.perf_counter() - started)
            calls = result.get("patch_calls")
        return {"outputs": outputs, "seconds": min(times), "patch_calls": calls}
    finally:
        worker.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="measure_patches")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n", type=int, default=32)
    args = parser.parse_args()
    population = REPO_ROOT / "data" / "arith-eval.jsonl"
    problems = load_population(population, population.with_suffix(".sha256").read_text().split()[0])
    requests = make_requests(problems[: args.n], seed=1000, temperature=1.0)
    for engine in args.engines.split(","):
        rows: dict[str, dict[str, Any]] = {"stock": measure(engine, [], {}, requests, args.repeats)}
        if engine == "vllm":
            rows["stock, engine core in-process"] = measure(engine, [], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                                                            requests, args.repeats)
        for patch in ("fixed-block", "split-k"):
            rows[patch] = measure(engine, patch_args(patch), {}, requests, args.repeats)
        stock = rows["stock"]
        print(f"\n{engine}: {args.n} prompts, T = 1; bit-equal = share of log-probs bit-identical to the one-batch "
              "run (requests with the same tokens)")
        names = [name for name in layouts(args.n) if name != "one batch"]
        print(f"| worker | {' | '.join(f'bit-equal, {n}' for n in names)} | other tokens than stock | "
              "max abs diff vs stock | generate of one batch | vs stock |")
        print("|---" * (len(names) + 5) + "|")
        for name, row in rows.items():
            base = row["outputs"]["one batch"]
            shares = [f"{100 * bit_equal_share(base, row['outputs'][n])[0]:.1f} %" for n in names]
            differ = bit_equal_share(base, stock["outputs"]["one batch"])[1]
            diff = same_token_diff(base, stock["outputs"]["one batch"])
            print(f"| {name} | {' | '.join(shares)} | {differ}/{args.n} | {diff:.2g} | "
                  f"{row['seconds']:.3f} s | {row['seconds'] / stock['seconds']:.1f}x |")
            if row["patch_calls"]:
                print(f"|   patch_calls per generate: {row['patch_calls']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
