"""Peak memory and wall time of one learner step on a model, as `invar train` runs it.

    .venv/bin/python bench/learner_memory.py [--model models/smollm2-135m-instruct] [--rows 64] [--tokens 48]
        [--prompts data/chat-train.jsonl] [--out DIR] [--save proximal.npy] [--engine hf|mlx] [--setting N=V]

Starts the engine's worker (HF by default; `--setting` gives it launch settings, e.g. `--engine mlx --setting
blas=openblas`) in the learner role through the project's own client (`invar.engines.start_worker`), loads the
model in float32, and sends one `learner_step` from a fresh seeded LoRA adapter (r 8, alpha 16, q_proj and v_proj,
AdamW, the objective of configs/arith-vllm-hf.toml, no micro-batching: the learner's default pass). The prompts are
the first `--rows` prompts of `--prompts` (a population file: chat messages rendered with the model's chat template,
or a plain prompt, as the core tokenizes them); each response is `--tokens` token ids drawn uniformly from the
vocabulary by a seeded generator, with behavior log-probabilities of -1 and advantages alternating ±1: memory and
time depend on the shapes, not on which tokens were sampled. The worker's peak RSS is its VmHWM (/proc/<pid>/status)
read after loading and after the step; the step's wall time is the call's. `--save` writes the proximal
log-probabilities (float32, concatenated in sample order) so two builds of the learner can be compared value by
value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.engines import launch_args, parse_launch_settings, start_worker
from invar.protocol import Role
from invar.tasks import ModelTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]


def _vm(pid: int, key: str) -> int:
    """A /proc/<pid>/status memory field in bytes (VmHWM: peak resident set; VmRSS: current)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def samples(model: Path, prompts: Path, rows: int, tokens: int, vocab: int) -> list[dict[str, Any]]:
    """The first `rows` prompts of the population file `prompts` with seeded uniform responses of `tokens` ids."""
    tok = ModelTokenizer.from_model_dir(model)
    lines = prompts.read_text(encoding="utf-8").splitlines()[:rows]
    rng = np.random.default_rng(0)
    out = []
    for i, line in enumerate(lines):
        problem = json.loads(line)
        ids = (tok.prompt_ids(messages=problem["messages"]) if "messages" in problem
               else tok.prompt_ids(prompt=problem["prompt"]))
        out.append({"prompt_ids": ids, "tokens": rng.integers(0, vocab, tokens, dtype=np.int32),
                    "behavior_logprobs": np.full(tokens, -1.0, dtype=np.float32),
                    "advantage": 1.0 if i % 2 == 0 else -1.0})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO_ROOT / "models" / "smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompts", type=Path, default=REPO_ROOT / "data" / "chat-train.jsonl",
                    help="Population file whose first --rows prompts are scored.")
    ap.add_argument("--out", type=Path, default=None, help="Folder for the saved adapter (default: temporary).")
    ap.add_argument("--save", type=Path, default=None, help="Write the proximal log-probabilities here (.npy).")
    ap.add_argument("--engine", choices=["hf", "mlx"], default="hf", help="The learner's engine.")
    ap.add_argument("--setting", action="append", default=[], help="A launch setting of its worker, NAME=VALUE.")
    args = ap.parse_args()
    settings = parse_launch_settings(args.engine, args.setting)
    model = args.model.resolve()
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    batch = samples(model, args.prompts, args.rows, args.tokens, int(config["vocab_size"]))
    out = args.out or Path(tempfile.mkdtemp(prefix="invar-learner-memory-"))
    client = start_worker(args.engine, Role.LEARNER, args=launch_args(args.engine, settings, {}))
    try:
        process = client.process
        assert process is not None
        pid = int(process.pid)  # type: ignore[attr-defined]  # a local subprocess.Popen
        t0 = time.perf_counter()
        client.call("load_model", {"model_dir": str(model), "model_digest": canonical.tree_digest(model),
                                   "dtype": "float32", "quantization": "none", "adapter": None})
        load_s = time.perf_counter() - t0
        loaded_hwm = _vm(pid, "VmHWM")
        params = {"samples": batch, "temperature": 1.0,
                  "objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "importance": "truncate",
                                "importance_cap": 2.0},
                  "optimizer": {"lr": 0.003, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                                "max_grad_norm": 1.0},
                  "lora": {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
                  "seed": 0, "save_dir": str(out / "step1")}
        t0 = time.perf_counter()
        result = client.call("learner_step", params)
        step_s = time.perf_counter() - t0
        step_hwm = _vm(pid, "VmHWM")
    finally:
        client.close()
    proximal = np.concatenate([np.asarray(p, dtype=np.float32) for p in result["proximal_logprobs"]])
    if args.save is not None:
        np.save(args.save, proximal)
    widths = [len(s["prompt_ids"]) + args.tokens for s in batch]
    report = {"engine": args.engine, "settings": settings, "model": str(model), "rows": args.rows,
              "tokens": args.tokens, "max_width": max(widths),
              "mean_prompt": float(np.mean([len(s["prompt_ids"]) for s in batch])),
              "load_s": round(load_s, 1), "step_s": round(step_s, 1),
              "peak_rss_after_load_gb": round(loaded_hwm / 1e9, 2), "peak_rss_step_gb": round(step_hwm / 1e9, 2),
              "loss": result["loss"], "grad_norm": result["grad_norm"],
              "proximal_digest": canonical.sha256(proximal.tobytes()), "loadavg": os.getloadavg()}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
