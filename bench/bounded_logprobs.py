"""The HF learner's memory-bounded scoring against the model's own forward on a real model, bit for bit.

    .venv/bin/python bench/bounded_logprobs.py [--model models/smollm2-135m-instruct] [--rows 8] [--tokens 48]
        [--positions 5] [--head-rows 16] [--json FILE]

Loads the model in float32 in this process as the learner does (one thread, a fresh seeded LoRA adapter, r 8,
q_proj and v_proj, its B set to seeded nonzero values so A's gradient is not zero either), takes the first `--rows`
prompts of data/chat-train.jsonl with `--tokens` seeded response ids each (bench/learner_memory.py's samples), and
scores them at T = 0.7 three ways: the model's own forward (no budget), the bounded path at the default
`LOGITS_BUDGET`, and the bounded path with a budget of `--positions` positions a chunk. For each bounded run it counts
the log-probabilities and the LoRA gradients (of a fixed seeded weighting of the values) whose bits equal the full
forward's. `--head-rows` sets the fewest rows the bounded path's output projection multiplies at once (the worker's
`HEAD_ROWS`), so the padding's effect can be seen: with 1, a chunk is projected as it is.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from learner_memory import samples
from report import header, write_json

from invar import canonical
from invar.protocol import Role
from invar.protocol.payloads import LoadModelParams, LoraParams
from invar.workers import hf_worker
from invar.workers.hf_worker import LOADED, LOGITS_BUDGET, Engine

REPO_ROOT = Path(__file__).resolve().parents[1]


def _learner(model: Path) -> Engine:
    engine = Engine(Role.LEARNER, "cpu")
    engine.load_model(LoadModelParams.from_wire({
        "model_dir": str(model), "model_digest": canonical.tree_digest(model), "dtype": "float32",
        "quantization": "none", "adapter": None}))
    engine._fresh(LoraParams(8, 16.0, ["q_proj", "v_proj"]), 0)
    assert engine.trainer is not None
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for b in engine.trainer.params[1::2]:
            b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return engine


def _scored(engine: Engine, rows: list[tuple[list[int], Any]], budget: int) -> tuple[Any, list[Any], float]:
    started = time.perf_counter()
    with engine.active(LOADED):
        values = torch.cat(engine._teacher_forced(rows, 0.7, budget))
    weights = torch.as_tensor(np.random.default_rng(5).standard_normal(values.numel()), dtype=torch.float32)
    assert engine.trainer is not None
    grads = torch.autograd.grad((values * weights).sum(), engine.trainer.params)
    return values.detach(), list(grads), time.perf_counter() - started


def _equal(a: Any, b: Any) -> Any:
    return a.view(torch.int32) == b.view(torch.int32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=REPO_ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--positions", type=int, default=5)
    parser.add_argument("--head-rows", type=int, default=hf_worker.HEAD_ROWS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(f"bounded_logprobs: {args.model} holds no model; build it first: python scripts/build_smollm2.py",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    hf_worker.HEAD_ROWS = args.head_rows  # the module global `_sampled_logprobs` reads
    engine = _learner(args.model)
    assert engine.m is not None
    vocab = engine.m.vocab_size
    rows = [(list(map(int, s["prompt_ids"])), s["tokens"])
            for s in samples(args.model, REPO_ROOT / "data" / "chat-train.jsonl", args.rows, args.tokens, vocab)]
    width = max(len(p) + len(t) for p, t in rows)
    print(f"{args.rows} rows of width {width}: {args.rows * width * vocab * 4 / 2**20:.0f} MiB of float32 logits "
          f"against the {LOGITS_BUDGET / 2**20:.0f} MiB budget; output projection over at least {args.head_rows} rows",
          flush=True)
    full, full_grads, full_s = _scored(engine, rows, 1 << 60)
    doc: dict[str, Any] = {**header("bounded_logprobs.py", argv), "model": args.model.name, "rows": args.rows,
                           "tokens": args.tokens, "width": width, "head_rows": args.head_rows,
                           "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "full_forward_s": round(full_s, 1), "bounded": []}
    for name, budget in (("default budget", LOGITS_BUDGET), (f"{args.positions} positions a chunk",
                                                             4 * vocab * args.positions)):
        values, grads, seconds = _scored(engine, rows, budget)
        same = int(_equal(values, full).sum())
        grads_same = sum(bool(_equal(g, f).all()) for g, f in zip(grads, full_grads, strict=True))
        row = {"budget": name, "chunk_positions": max(args.head_rows, budget // (4 * vocab)),
               "logprobs_bit_equal": same, "logprobs": values.numel(),
               "max_abs_diff": float((values - full).abs().max()),
               "lora_gradients_bit_equal": grads_same, "lora_gradients": len(full_grads),
               "max_abs_gradient_diff": max(float((g - f).abs().max()) for g, f in zip(grads, full_grads, strict=True)),
               "seconds": round(seconds, 1)}
        doc["bounded"].append(row)
        print(f"{name}: {same}/{values.numel()} log-probabilities bit-equal (max |diff| {row['max_abs_diff']:.3g}), "
              f"{grads_same}/{len(full_grads)} LoRA gradients bit-equal (max |diff| "
              f"{row['max_abs_gradient_diff']:.3g}); {seconds:.1f} s against the full forward's {full_s:.1f} s",
              flush=True)
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
