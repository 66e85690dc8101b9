"""Teacher forcing and generation on a 262,144-token vocabulary: the HF and MLX workers on the same 40 units.

    .venv/bin/python bench/prefill_vocab.py [--drivers hf,mlx,mlx-old,vllm,vllm-old] [--old-src /tmp/old/src]
        [--units 40] [--temperature 1.0] [--cache bench/.cache] [--json docs/performance/prefill_vocab.json]

The model: a Gemma 3 text model with random weights (seeded), Gemma 3's vocabulary size (262,144) and a tiny body
(2 layers, hidden 128, tied output layer: about 135 MB), built once under `--cache`. On such a model the output
layer is nearly all of a forward's work: 262,144 × 128 multiply-adds per position, against about 0.3 M for the
layers. The units: `--units` prompts of 32 to 128 random token ids (seeded) with 16-token responses.

Each driver is one worker process (`hf`; `mlx` this checkout's MLX worker; `mlx-old` the MLX worker of another
checkout's `--old-src`, e.g. `git archive HEAD src | tar -x -C /tmp/old`; `mlx-openblas` this checkout's with
`--blas openblas`; `vllm` the vLLM worker, `vllm-old` another checkout's, as `mlx-old`) that loads the model
and runs three phases, each one call, at `--temperature` (scored and sampled at that temperature):
- `score`: every unit's response teacher-forced, with whole-vocabulary rows at the first and the last step (as
  `invar score --capture-steps 0,last` asks);
- `generate`: every prompt decoded for 16 tokens at T = 1 (seeded), in batches of 8;
- `score, no captures`: the response tokens' log-probabilities alone.
Per phase: wall seconds, the worker's CPU seconds (its /proc/PID/stat user + system time) and its peak resident
memory (VmHWM, reset before each phase through /proc/PID/clear_refs), in MiB, and the sha256 of the call's outputs
(equal digests: two drivers returned the same bits). The MLX worker runs on the BLAS its
wheel bundles unless the driver says otherwise; HF on torch's CPU kernels, one thread (as every worker here).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from procfs import cpu_s, status_kib  # noqa: E402
from report import header, write_json  # noqa: E402

from invar import canonical  # noqa: E402
from invar.engines import start_worker  # noqa: E402
from invar.protocol import Role  # noqa: E402

VOCAB = 262_144
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 64}
RESPONSE = 16
BATCH = 8


def build(cache: Path) -> Path:
    """The random-weight Gemma 3 text model with a 262,144-token vocabulary (built once, seeded)."""
    folder = cache / "gemma3-random-v262144-h128"
    if (folder / "tokenizer.json").is_file():
        return folder
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    settings: dict[str, Any] = {
        **SHAPE, "vocab_size": VOCAB, "max_position_embeddings": 1024, "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "dtype": "float32"}
    config = Gemma3TextConfig(**settings)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    # A word-level tokenizer over the whole vocabulary: the workers read the ids that end a response through it.
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    names = ["<pad>", "</s>", "<s>", "<unk>"] + [f"t{i}" for i in range(4, VOCAB)]
    Tokenizer(WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "backend": "tokenizers", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 2, "eos_token_id": 1,
                                                               "pad_token_id": 0}) + "\n")
    return folder


def units(count: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per unit: 32-128 prompt ids and 16 response ids, none of them an end id."""
    rng = np.random.default_rng(0)
    return [([int(t) for t in rng.integers(3, VOCAB, int(rng.integers(32, 129)))],
             [int(t) for t in rng.integers(3, VOCAB, RESPONSE)]) for _ in range(count)]


def _phase(pid: int, name: str, run: Callable[[], Any]) -> dict[str, Any]:
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    cpu, began = cpu_s(pid), time.perf_counter()
    result = run()
    row = {"phase": name, "wall_s": round(time.perf_counter() - began, 2), "cpu_s": round(cpu_s(pid) - cpu, 2),
           "peak_mib": round(status_kib(pid, "VmHWM") / 1024, 1)}
    if isinstance(result, dict) and "outputs" in result:  # what came back, to compare two drivers bit for bit
        digest = hashlib.sha256()
        for out in result["outputs"]:
            for key in sorted(out):
                value = out[key]
                digest.update(key.encode() + (value.tobytes() if hasattr(value, "tobytes") else str(value).encode()))
        row["outputs_sha256"] = digest.hexdigest()
    print(f"  {name}: {row['wall_s']} s wall, {row['cpu_s']} CPU-s, peak {row['peak_mib']} MiB", flush=True)
    return row


def drive(driver: str, model: Path, work: list[tuple[list[int], list[int]]], old_src: Path | None,
          temperature: float = 1.0) -> dict[str, Any]:
    base = driver.removesuffix("-old")
    engine = base if base in ("hf", "vllm") else "mlx"  # mlx, mlx-openblas
    env = {"PYTHONPATH": str(old_src)} if base != driver and old_src is not None else None
    args = ["--blas", "openblas"] if driver == "mlx-openblas" else None
    load = {"model_dir": str(model), "model_digest": canonical.tree_digest(model), "dtype": "float32",
            "quantization": "none", "adapter": None}
    items = [{"item_id": f"u{i}", "prompt_ids": p, "response_tokens": np.asarray(r, dtype=np.int32),
              "temperature": temperature, "vocab_steps": [0, RESPONSE - 1]} for i, (p, r) in enumerate(work)]
    requests = [{"request_id": f"u{i}", "prompt_ids": p, "seed": i, "temperature": temperature, "top_p": 1.0,
                 "max_tokens": RESPONSE} for i, (p, _) in enumerate(work)]
    layout = [list(range(a, min(a + BATCH, len(work)))) for a in range(0, len(work), BATCH)]
    print(driver, flush=True)
    with start_worker(engine, Role.INFERENCE, args=args, env=env, call_timeout=7200.0) as worker:
        pid = worker.identity.pid
        phases = [_phase(pid, "load_model", lambda: worker.call("load_model", load)),
                  _phase(pid, "score", lambda: worker.call("score", {"items": items, "adapter": None})),
                  _phase(pid, "generate", lambda: worker.call("generate", {
                      "requests": requests, "layout": layout, "adapter": None, "reference_adapter": None})),
                  _phase(pid, "score, no captures", lambda: worker.call("score", {
                      "items": [{**it, "vocab_steps": []} for it in items], "adapter": None}))]
    return {"driver": driver, "phases": phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drivers", default="hf,mlx")
    parser.add_argument("--old-src", type=Path, default=None)
    parser.add_argument("--units", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--cache", type=Path, default=REPO / "bench" / ".cache")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    drivers = args.drivers.split(",")
    if any(d.endswith("-old") for d in drivers) and args.old_src is None:
        raise SystemExit("prefill_vocab: an -old driver runs another checkout's src: pass --old-src DIR")
    model = build(args.cache)
    work = units(args.units)
    results = [drive(d, model, work, args.old_src, args.temperature) for d in drivers]
    doc = {**header("prefill_vocab.py", argv),
           "model": {"vocab_size": VOCAB, **SHAPE, "family": "gemma3_text, tied output layer, random weights"},
           "units": len(work), "temperature": args.temperature, "prompt_tokens": sum(len(p) for p, _ in work),
           "response_tokens": RESPONSE,
           "results": results}
    write_json(args.json, doc, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
