"""What the MLX and HF learner tests check alike (tests/workers/{mlx,hf}/test_*_checkpoints.py): both learners save
training checkpoints that the core's check accepts, and a learner restarted from a checkpoint (`load_model` with
`adapter.resume`) takes exactly the step the uninterrupted learner takes: same proximal log-probabilities, same
loss, same saved files (the same tree digest). Importance-weight truncation and masking reach the learner's
objective as the core computes it. Each engine's test module runs these on its session's learner worker and leaves
it holding the base model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from invar.engines import DEFAULT_MODEL
from invar.errors import WorkerError
from invar.loop.checkpoint import check_checkpoint
from invar.loop.objective import ObjectiveSettings, loss_terms
from invar.tasks import ModelTokenizer, Problem
from invar.transport import WorkerClient

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
ADVANTAGES = [0.9, -0.4, 1.3, -0.7, 0.2, -1.1]
OPTIMIZER = {"lr": 2e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
TOK = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
"""The shipped model's tokenizer: samples carry the core's `prompt_ids` (workers never tokenize)."""


def _load(model_dir: Path, digest: str, adapter: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"model_dir": str(model_dir), "model_digest": digest, "dtype": "float32", "quantization": "none",
            "adapter": adapter}


def _samples(problems: list[Problem], shift: float) -> list[dict[str, Any]]:
    """Fixed responses (the answers plus EOS) with made-up behavior log-probabilities near the learner's own."""
    out = []
    for i, p in enumerate(problems[:6]):
        tokens = np.array([3 + int(ch) if ch.isdigit() else 2 for ch in p.answer] + [2], np.int32)
        out.append({"prompt": p.prompt, "prompt_ids": TOK.prompt_ids(prompt=p.prompt), "tokens": tokens,
                    "behavior_logprobs": np.full(tokens.size, -0.5 - shift * (i % 3), np.float32),
                    "advantage": ADVANTAGES[i]})
    return out


def _step(worker: WorkerClient, samples: list[dict[str, Any]], folder: Path,
          objective: dict[str, Any] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = worker.call("learner_step", {
        "samples": samples, "temperature": 1.0,
        "objective": objective or {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0},
        "optimizer": OPTIMIZER, "lora": LORA, "seed": 3, "save_dir": str(folder)})
    return result


def resumed_learner_takes_the_uninterrupted_step(engine: str, worker: WorkerClient, model_dir: Path,
                                                 model_digest: str, problems: list[Problem], tmp_path: Path) -> None:
    samples = _samples(problems, 0.0)
    worker.call("load_model", _load(model_dir, model_digest))
    first = _step(worker, samples, tmp_path / "1")
    second = _step(worker, samples, tmp_path / "2")
    third = _step(worker, samples, tmp_path / "3")
    for result, steps in ((first, 1), (second, 2), (third, 3)):
        check_checkpoint(result["adapter_dir"], model_dir, reported_digest=result["adapter_digest"],
                         reported_tensors=result["adapter_tensors"], reported_steps=steps,
                         base_model_digest=model_digest)
    loaded = worker.call("load_model", _load(model_dir, model_digest, {
        "path": second["adapter_dir"], "digest": second["adapter_digest"], "resume": True}))
    assert loaded["optimizer_steps"] == 2
    again = _step(worker, samples, tmp_path / "3-resumed")
    assert again["start_adapter_digest"] == second["adapter_digest"]
    assert again["optimizer_steps"] == 3
    assert again["loss"] == third["loss"]
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip(again["proximal_logprobs"], third["proximal_logprobs"], strict=True))
    assert again["adapter_digest"] == third["adapter_digest"], f"{engine}: the resumed step saved other files"
    # Without the optimizer state the step differs: the state is what makes the resumed step exact.
    worker.call("load_model", _load(model_dir, model_digest, {"path": second["adapter_dir"],
                                                              "digest": second["adapter_digest"]}))
    fresh = _step(worker, samples, tmp_path / "3-fresh-moments")
    assert fresh["optimizer_steps"] == 1
    assert fresh["adapter_digest"] != third["adapter_digest"]
    worker.call("load_model", _load(model_dir, model_digest))


def resume_needs_a_training_checkpoint(worker: WorkerClient, model_dir: Path, model_digest: str,
                                       problems: list[Problem], tmp_path: Path) -> None:
    worker.call("load_model", _load(model_dir, model_digest))
    result = _step(worker, _samples(problems, 0.0), tmp_path / "ck")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (bare / name).write_bytes((Path(result["adapter_dir"]) / name).read_bytes())
    from invar import canonical

    with pytest.raises(WorkerError, match="holds no readable optimizer state"):
        worker.call("load_model", _load(model_dir, model_digest, {"path": str(bare),
                                                                  "digest": canonical.tree_digest(bare),
                                                                  "resume": True}))


def importance_handling_reaches_the_learners_objective(worker: WorkerClient, model_dir: Path, model_digest: str,
                                                       problems: list[Problem], tmp_path: Path,
                                                       handling: str) -> None:
    worker.call("load_model", _load(model_dir, model_digest))
    # Behavior far below the learner's reading: weights exp(proximal − behavior) well above the cap of 1.5.
    samples = _samples(problems, 0.4)
    objective = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "importance": handling, "importance_cap": 1.5}
    result = _step(worker, samples, tmp_path / handling, objective)
    settings = ObjectiveSettings(0.2, 0.28, 0.0, handling, 1.5)
    core = loss_terms(result["proximal_logprobs"], [s["behavior_logprobs"] for s in samples],
                      np.array([s["advantage"] for s in samples], np.float32), settings)
    raw = np.concatenate([np.exp(p - s["behavior_logprobs"]) for p, s in
                          zip(result["proximal_logprobs"], samples, strict=True)])
    print(f"measured: {handling}: {np.sum(raw > 1.5)}/{raw.size} weights above the cap; core loss {core.loss!r}, "
          f"learner {result['loss']!r}")
    assert np.sum(raw > 1.5) > 0
    assert abs(core.loss - result["loss"]) <= 1e-6 * 1.5
    assert abs(core.importance_weight_mean - result["importance_weight_mean"]) <= 1e-6 * 1.5
    plain = loss_terms(result["proximal_logprobs"], [s["behavior_logprobs"] for s in samples],
                       np.array([s["advantage"] for s in samples], np.float32), ObjectiveSettings())
    assert abs(plain.loss - result["loss"]) > 1e-4  # the handling changed the objective
    with pytest.raises(WorkerError, match="importance_cap: give a cap exactly when"):
        _step(worker, samples, tmp_path / "x", {**objective, "importance_cap": None})
    worker.call("load_model", _load(model_dir, model_digest))  # leave the session's learner as it found it
