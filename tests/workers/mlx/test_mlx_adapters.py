"""Adapters on the MLX worker: a reload takes effect and is named by its digest, bad adapters are one clear
error, and the learner's saved folder loads in every engine that must load it: the MLX worker (either format),
mlx-lm's own `load_adapters`, and PEFT (the format the HF worker and vLLM read); a PEFT adapter saved by peft
loads in the MLX worker.

Cross-engine comparisons (PEFT on torch vs MLX, both float32 on the CPU) agree only up to float32 rounding in
different kernels: log-probabilities of magnitude ≤ 20 computed through 3 layers differ by a few ulp of the
logits. The bound used is 1e-4 nats; measured max differences are stated in each test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.errors import WorkerError
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import MAX_ANSWER_CHARS, Problem
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

TOK = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
"""The shipped model's tokenizer: requests carry the core's `prompt_ids` (workers never tokenize)."""

CROSS_ENGINE_NATS = 1e-4
LAYERS, HIDDEN, KV = 3, 128, 64  # the shipped model: q_proj 128 → 128, v_proj 128 → 64


def write_mlx_adapter(folder: Path, seed: int, rank: int = 4, hidden: int = HIDDEN, kv: int = KV,
                      metadata: dict[str, str] | None = None) -> str:
    """An mlx-lm LoRA adapter: random a and b on q_proj and v_proj of each layer. Returns its digest."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for name, out in (("q_proj", hidden), ("v_proj", kv)):
            module = f"model.layers.{layer}.self_attn.{name}"
            a = rng.standard_normal((hidden, rank)) / np.sqrt(hidden)
            tensors[f"{module}.lora_a"] = a.astype(np.float32)
            tensors[f"{module}.lora_b"] = (rng.standard_normal((rank, out)) * 0.2).astype(np.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapters.safetensors"), metadata=metadata)
    config = {"fine_tune_type": "lora", "num_layers": LAYERS,
              "lora_parameters": {"rank": rank, "scale": 2.0, "dropout": 0.0,
                                  "keys": ["self_attn.q_proj", "self_attn.v_proj"]}}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return canonical.tree_digest(folder)


def reqs(problems: list[Problem], n: int = 16, temperature: float = 1.0) -> list[dict[str, Any]]:
    return [{"request_id": f"a{i}", "prompt": p.prompt, "prompt_ids": TOK.prompt_ids(prompt=p.prompt),
             "seed": 31 + i, "temperature": temperature, "top_p": 1.0, "max_tokens": MAX_ANSWER_CHARS + 1}
            for i, p in enumerate(problems[700:700 + n])]


def logprob_bits(outputs: list[dict[str, Any]]) -> list[bytes]:
    return [o["tokens"].tobytes() + o["logprobs"].tobytes() for o in outputs]


def score(worker: WorkerClient, requests: list[dict[str, Any]], outputs: list[dict[str, Any]],
          adapter: str | None) -> list[np.ndarray]:
    items = [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"], "temperature": r["temperature"] or 1.0}
             for r, o in zip(requests, outputs, strict=True)]
    return [o["logprobs"] for o in worker.call("score", {"items": items, "adapter": adapter})["outputs"]]


def test_adapter_reload_takes_effect(inference: WorkerClient, problems: list[Problem],
                                     tmp_path: Path) -> None:
    d1, d2 = write_mlx_adapter(tmp_path / "one", 1), write_mlx_adapter(tmp_path / "two", 2)
    requests = reqs(problems)
    base = inference.call("generate", {"requests": requests, "adapter": "base"})
    assert base["adapter_digest"] is None
    assert inference.call("load_adapter", {"name": "pol", "path": str(tmp_path / "one"), "digest": d1}) == {
        "name": "pol", "adapter_digest": d1}
    one = inference.call("generate", {"requests": requests, "adapter": "pol"})
    assert one["adapter_digest"] == d1
    assert logprob_bits(one["outputs"]) != logprob_bits(base["outputs"])
    inference.call("load_adapter", {"name": "pol", "path": str(tmp_path / "two"), "digest": d2})
    two = inference.call("generate", {"requests": requests, "adapter": "pol"})
    assert two["adapter_digest"] == d2
    assert logprob_bits(two["outputs"]) != logprob_bits(one["outputs"])
    inference.call("load_adapter", {"name": "pol", "path": str(tmp_path / "one"), "digest": d1})
    again = inference.call("generate", {"requests": requests, "adapter": "pol"})
    assert logprob_bits(again["outputs"]) == logprob_bits(one["outputs"])


def test_reference_logprobs_are_the_reference_adapters_scores(
        inference: WorkerClient, problems: list[Problem], tmp_path: Path) -> None:
    inference.call("load_adapter", {"name": "ref-pol", "path": str(tmp_path / "p"),
                                    "digest": write_mlx_adapter(tmp_path / "p", 3)})
    requests = reqs(problems, temperature=0.8)
    got = inference.call("generate", {"requests": requests, "adapter": "ref-pol",
                                      "reference_adapter": "base"})
    outputs = got["outputs"]
    ref = [o["reference_logprobs"] for o in outputs]
    assert all(r.tobytes() == s.tobytes() for r, s in zip(ref, score(inference, requests, outputs, "base"),
                                                               strict=True))
    assert any(r.tobytes() != o["logprobs"].tobytes() for r, o in zip(ref, outputs, strict=True))
    # Scored under the policy itself, the reference is the sampled log-probabilities, bit for bit.
    same = inference.call("generate", {"requests": requests, "adapter": "ref-pol",
                                       "reference_adapter": "ref-pol"})
    assert all(o["reference_logprobs"].tobytes() == o["logprobs"].tobytes() for o in same["outputs"])


def test_load_model_with_an_adapter_serves_it_as_null(inference: WorkerClient, load_params: dict[str, Any],
                                                      problems: list[Problem], tmp_path: Path) -> None:
    digest = write_mlx_adapter(tmp_path / "a", 4)
    requests = reqs(problems)
    try:
        got = inference.call("load_model", {**load_params, "adapter": {"path": str(tmp_path / "a"),
                                                                        "digest": digest}})
        assert got["adapter_digest"] == digest
        loaded = inference.call("generate", {"requests": requests, "adapter": None})
        assert loaded["adapter_digest"] == digest
        base = inference.call("generate", {"requests": requests, "adapter": "base"})
    finally:
        inference.call("load_model", load_params)
    assert logprob_bits(loaded["outputs"]) != logprob_bits(base["outputs"])
    plain = inference.call("generate", {"requests": requests, "adapter": None})
    assert plain["adapter_digest"] is None
    assert logprob_bits(plain["outputs"]) == logprob_bits(base["outputs"])


def test_bad_adapters_are_one_clear_error(inference: WorkerClient, load_params: dict[str, Any],
                                          problems: list[Problem], tmp_path: Path) -> None:
    requests = reqs(problems, n=4)
    before = logprob_bits(inference.call("generate", {"requests": requests})["outputs"])

    def refused(folder: Path, *fragments: str, digest: str | None = None) -> None:
        with pytest.raises(WorkerError) as info:
            inference.call("load_adapter", {"name": "bad", "path": str(folder), "digest": digest})
        assert info.value.error_type == "BadRequest"
        for fragment in fragments:
            assert fragment in info.value.message, info.value.message
        assert "\n" not in info.value.message

    write_mlx_adapter(tmp_path / "other-base", 5, hidden=64, kv=32)
    refused(tmp_path / "other-base", "needs [128, 4]", "made for another base model")
    write_mlx_adapter(tmp_path / "foreign", 6, metadata={"invar_base_model_digest": "ab" * 32})
    refused(tmp_path / "foreign", "was trained on base model abababab")
    good = tmp_path / "good"
    write_mlx_adapter(good, 7)
    refused(good, "expected 0000000000000000", digest="0" * 64)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    data = (corrupt / "adapters.safetensors").read_bytes()
    (corrupt / "adapters.safetensors").write_bytes(data[: len(data) - 100])
    refused(corrupt, "truncated or corrupt")
    (corrupt / "adapters.safetensors").unlink()
    refused(corrupt, "holds neither adapter_model.safetensors (PEFT) nor adapters.safetensors (MLX)")
    refused(tmp_path / "missing", "does not exist")
    with pytest.raises(WorkerError, match="'bad' is not loaded"):
        inference.call("generate", {"requests": requests, "adapter": "bad"})
    assert logprob_bits(inference.call("generate", {"requests": requests})["outputs"]) == before


# PEFT warns that it ignores mlx-lm's keys in the shared adapter_config.json; that is the design.
@pytest.mark.filterwarnings("ignore:Unexpected keyword arguments")
def test_the_learners_adapter_loads_in_every_engine(
        inference: WorkerClient, learner: WorkerClient, load_params: dict[str, Any], problems: list[Problem],
        model_dir: Path, tmp_path: Path) -> None:
    """Required: MLX worker (MLX file) = MLX worker (PEFT file) = mlx-lm in-process, bit for bit; PEFT on
    torch within 1e-4 nats (the measured maximum is printed)."""
    import mlx.core as mx
    import torch
    from mlx_lm.tuner.utils import load_adapters
    from mlx_lm.utils import load_model
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner.call("load_model", load_params)
    requests = reqs(problems, n=8)
    outputs = inference.call("generate", {"requests": requests, "adapter": "base"})["outputs"]
    samples = [{"prompt": r["prompt"], "prompt_ids": r["prompt_ids"], "tokens": o["tokens"],
                "behavior_logprobs": o["logprobs"], "advantage": float(1 - 2 * (i % 2))}
               for i, (r, o) in enumerate(zip(requests, outputs, strict=True))]
    result = learner.call("learner_step", {
        "samples": samples, "temperature": 1.0, "objective": {"clip_low": 0.2, "clip_high": 0.28},
        "optimizer": {"lr": 3e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]}, "seed": 5,
        "save_dir": str(tmp_path / "learned")})
    folder = Path(result["adapter_dir"])
    inference.call("load_adapter", {"name": "learned", "path": str(folder),
                                    "digest": result["adapter_digest"]})
    mlx_scores = score(inference, requests, outputs, "learned")
    base_scores = score(inference, requests, outputs, "base")
    assert any(a.tobytes() != b.tobytes() for a, b in zip(mlx_scores, base_scores, strict=True))

    # The PEFT half alone, read by the MLX worker.
    peft_only = tmp_path / "peft-only"
    peft_only.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(folder / name, peft_only / name)
    inference.call("load_adapter", {"name": "learned-peft", "path": str(peft_only)})
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip(score(inference, requests, outputs, "learned-peft"), mlx_scores, strict=True))

    # mlx-lm's own loader, in this process.
    model, _ = load_model(model_dir)
    load_adapters(model, str(folder))
    # PEFT on torch: the format the HF worker and vLLM read.
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(folder))
    peft_model.eval()
    worst = 0.0
    for o, want in zip(outputs, mlx_scores, strict=True):
        ids = np.concatenate([o["prompt_tokens"], o["tokens"][:-1]]).astype(np.int64)
        start = o["prompt_tokens"].size - 1
        logits = model(mx.array(ids[None].astype(np.int32)))[0, start:]
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        got = np.array(mx.take_along_axis(lp, mx.array(o["tokens"].astype(np.int32))[:, None], axis=-1)[:, 0])
        assert got.tobytes() == want.tobytes()
        with torch.no_grad():
            t_logits = peft_model(torch.from_numpy(ids[None])).logits[0, start:].float()
        target = torch.from_numpy(o["tokens"].astype(np.int64))[:, None]
        t_lp = torch.log_softmax(t_logits, -1).gather(-1, target)
        worst = max(worst, float(np.max(np.abs(t_lp[:, 0].numpy() - want))))
    print(f"PEFT (torch) vs MLX worker on the learner's adapter: max |Δ log p| = {worst:.3g} nats")
    assert worst <= CROSS_ENGINE_NATS


def test_a_peft_adapter_saved_by_peft_loads_in_the_mlx_worker(
        inference: WorkerClient, problems: list[Problem], model_dir: Path, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "up_proj"], lora_dropout=0.0,
                        init_lora_weights=False)  # random B as well, so the adapter changes the outputs
    peft_model = get_peft_model(base, config)
    peft_model.eval()
    peft_model.save_pretrained(str(tmp_path / "peft"))
    inference.call("load_adapter", {"name": "from-peft", "path": str(tmp_path / "peft")})
    requests = reqs(problems, n=8)
    outputs = inference.call("generate", {"requests": requests, "adapter": "from-peft"})["outputs"]
    mlx_scores = score(inference, requests, outputs, "from-peft")
    worst = 0.0
    for o, want in zip(outputs, mlx_scores, strict=True):
        ids = np.concatenate([o["prompt_tokens"], o["tokens"][:-1]]).astype(np.int64)
        with torch.no_grad():
            logits = peft_model(torch.from_numpy(ids[None])).logits[0, o["prompt_tokens"].size - 1:].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(o["tokens"].astype(np.int64))[:, None])
        worst = max(worst, float(np.max(np.abs(lp[:, 0].numpy() - want))))
    print(f"PEFT-saved adapter, MLX worker vs PEFT (torch): max |Δ log p| = {worst:.3g} nats")
    assert worst <= CROSS_ENGINE_NATS
