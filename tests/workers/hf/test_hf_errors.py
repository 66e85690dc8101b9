"""Bad input to the HF worker: each is one clear error through the protocol, and the worker keeps serving exactly
what it had loaded (the next call succeeds and gives the same bits as before the bad one).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_calls import bit_identical, generate, load_params, make_requests, prompt_ids
from safetensors.numpy import save_file

from invar import canonical
from invar.errors import WorkerError
from invar.tasks import Problem
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

PREFIX = "base_model.model."


def write_adapter(folder: Path, model_dir: Path, *, base_digest: str, in_features: int | None = None,
                  layers: list[int] | None = None, r: int = 4) -> Path:
    """A PEFT-format LoRA adapter on q_proj and v_proj with small random weights."""
    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, head_dim = cfg["hidden_size"], cfg["head_dim"]
    outs = {"q_proj": cfg["num_attention_heads"] * head_dim, "v_proj": cfg["num_key_value_heads"] * head_dim}
    rng = np.random.default_rng(0)
    tensors = {}
    for layer in layers if layers is not None else range(cfg["num_hidden_layers"]):
        for proj, out in outs.items():
            name = f"{PREFIX}model.layers.{layer}.self_attn.{proj}"
            tensors[f"{name}.lora_A.weight"] = rng.normal(0, 0.05, (r, in_features or hidden)).astype(np.float32)
            tensors[f"{name}.lora_B.weight"] = rng.normal(0, 0.05, (out, r)).astype(np.float32)
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": ["q_proj", "v_proj"], "bias": "none"}))
    save_file(tensors, str(folder / "adapter_model.safetensors"),
              metadata={"format": "pt", "invar_base_model_digest": base_digest})
    return folder


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, model_digest: str) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    good = write_adapter(root / "good", model_dir, base_digest=model_digest)
    corrupt = root / "corrupt"
    shutil.copytree(good, corrupt)
    weights = corrupt / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return {
        "good": good,
        "corrupt": corrupt,
        "other_base": write_adapter(root / "other_base", model_dir, base_digest="0" * 64),
        "wrong_shape": write_adapter(root / "wrong_shape", model_dir, base_digest=model_digest, in_features=64),
        "missing_layer": write_adapter(root / "missing_layer", model_dir, base_digest=model_digest, layers=[99]),
    }


def _load_adapter(path: Path, digest: str | None = None) -> tuple[str, dict[str, Any]]:
    return "load_adapter", {"name": "bad", "path": str(path),
                            "digest": digest if digest is not None else canonical.tree_digest(str(path))}


BadCall = Callable[[Path, str, dict[str, Path]], tuple[str, dict[str, Any]]]

ONE = Problem("p", "1+1=", "2", "add")


def _prompt_ids(ids: Any) -> tuple[str, dict[str, Any]]:
    """A generate call whose one request carries `ids` as its prompt_ids (`...`: no prompt_ids at all)."""
    request = {k: v for k, v in make_requests([ONE])[0].items() if k != "prompt_ids"}
    return "generate", {"requests": [request if ids is ... else {**request, "prompt_ids": ids}]}

CASES: dict[str, tuple[BadCall, str]] = {
    "missing model folder": (
        lambda m, d, a: ("load_model", load_params(m.parent / "no-such-model", d)), "does not exist"),
    "model digest mismatch": (
        lambda m, d, a: ("load_model", load_params(m, "f" * 64)), "the files differ from the ones the call names"),
    "unknown quantization": (
        lambda m, d, a: ("load_model", load_params(m, d, "int3")), "is not supported by this engine"),
    "missing adapter folder": (
        lambda m, d, a: ("load_adapter", {"name": "x", "path": str(m.parent / "no-such-adapter"), "digest": None}),
        "does not exist"),
    "adapter digest mismatch": (lambda m, d, a: _load_adapter(a["good"], "e" * 64), "has digest"),
    "corrupt adapter": (lambda m, d, a: _load_adapter(a["corrupt"]), "the adapter is corrupt"),
    "adapter for another base model (digest)": (
        lambda m, d, a: _load_adapter(a["other_base"]), "was trained on base model"),
    "adapter for another base model (shapes)": (
        lambda m, d, a: _load_adapter(a["wrong_shape"]), "the adapter is for another base model"),
    "adapter for another base model (modules)": (
        lambda m, d, a: _load_adapter(a["missing_layer"]), "which this model does not have"),
    "adapter in a model call under load_model": (
        lambda m, d, a: ("load_model", {**load_params(m, d), "adapter": {"path": str(a["corrupt"]), "digest": None}}),
        "the adapter is corrupt"),
    "unknown adapter name": (
        lambda m, d, a: ("generate", {"requests": make_requests([ONE]),
                                      "adapter": "never-loaded"}), "is not loaded"),
    "prompt id outside the vocabulary": (
        lambda m, d, a: _prompt_ids([1, 5, 9999]),
        "generate.requests[0].prompt_ids: token id 9999 is outside the model's vocabulary [0, 18)"),
    "negative prompt id": (
        lambda m, d, a: _prompt_ids([1, -1]),
        "generate.requests[0].prompt_ids: token id -1 is outside the model's vocabulary [0, 18)"),
    "prompt_ids missing": (lambda m, d, a: _prompt_ids(...), "generate.requests[0]: missing field 'prompt_ids'"),
    "prompt_ids not a list": (
        lambda m, d, a: _prompt_ids("1+1="), "generate.requests[0].prompt_ids: expected list, got str"),
    "prompt_ids empty": (
        lambda m, d, a: _prompt_ids([]), "generate.requests[0].prompt_ids: expected a non-empty list of token ids"),
    "prompt_ids of bools": (
        lambda m, d, a: _prompt_ids([True, False]),
        "generate.requests[0].prompt_ids: expected a non-empty list of token ids"),
    "score prompt id outside the vocabulary": (
        lambda m, d, a: ("score", {"items": [{"item_id": "i", "prompt": "1+1=", "prompt_ids": [1, 18],
                                              "temperature": 1.0,
                                              "response_tokens": np.array([5, 2], dtype=np.int32)}]}),
        "score.items[0].prompt_ids: token id 18 is outside the model's vocabulary [0, 18)"),
    "request longer than the maximum": (
        lambda m, d, a: ("generate", {"requests": make_requests([ONE], max_tokens=10_000)}),
        "exceed the model's maximum length"),
    "score tokens outside the vocabulary": (
        lambda m, d, a: ("score", {"items": [{"item_id": "i", "prompt": "1+1=", "prompt_ids": prompt_ids("1+1="),
                                              "temperature": 1.0,
                                              "response_tokens": np.array([5, 9999], dtype=np.int32)}]}),
        "token ids must be in"),
    "bad layout": (
        lambda m, d, a: ("generate", {"requests": make_requests([ONE]),
                                      "layout": [[0, 0]]}), "exactly once"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_error_and_the_worker_keeps_serving(
        case: str, inference: WorkerClient, model_dir: Path, model_digest: str, adapters: dict[str, Path],
        problems: list[Problem]) -> None:
    reqs = make_requests(problems[:4], seed=42)
    before = generate(inference, reqs)
    build, expected = CASES[case]
    method, params = build(model_dir, model_digest, adapters)
    with pytest.raises(WorkerError) as info:
        inference.call(method, params)
    message = info.value.message
    assert info.value.error_type == "BadRequest", message
    print(f"\n{case}: {message}")
    assert expected in message
    assert "\n" not in message
    assert "Traceback" not in message
    after = generate(inference, reqs)
    assert bit_identical([o["logprobs"] for o in before], [o["logprobs"] for o in after])
    assert bit_identical([o["tokens"] for o in before], [o["tokens"] for o in after])


def test_an_unknown_method_is_named_and_the_worker_keeps_serving(inference: WorkerClient,
                                                                 problems: list[Problem]) -> None:
    with pytest.raises(WorkerError) as info:
        inference.call("learner_step", {})
    assert info.value.error_type == "UnknownMethod"
    assert "'learner_step' is not served by this worker" in info.value.message
    assert generate(inference, make_requests(problems[:2]))


def test_a_good_adapter_loads_and_changes_the_model(inference: WorkerClient, adapters: dict[str, Path],
                                                    problems: list[Problem]) -> None:
    """The positive control for the adapter cases above: the same files, intact, load and take effect."""
    digest = canonical.tree_digest(str(adapters["good"]))
    assert inference.call("load_adapter", {"name": "good", "path": str(adapters["good"]),
                                           "digest": digest})["adapter_digest"] == digest
    reqs = make_requests(problems[:4], seed=42)
    base = generate(inference, reqs)
    tuned = generate(inference, reqs, adapter="good")
    assert not bit_identical([o["logprobs"] for o in base], [o["logprobs"] for o in tuned])


def test_learner_inputs_are_checked_before_anything_changes(learner: WorkerClient, tmp_path: Path) -> None:
    sample = {"prompt": "12+3=", "prompt_ids": prompt_ids("12+3="), "tokens": np.array([4, 8, 2], dtype=np.int32),
              "behavior_logprobs": np.array([-0.5, -0.1, -0.01], dtype=np.float32), "advantage": 1.0}
    base = {"samples": [sample], "temperature": 1.0, "objective": {"clip_low": 0.2, "clip_high": 0.28},
            "optimizer": {"lr": 1e-3}, "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}, "seed": 0,
            "save_dir": str(tmp_path / "out")}
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = {
        "save_dir": ({"save_dir": str(tmp_path / "full")}, "is not an empty folder"),
        "temperature": ({"temperature": 0.0}, "must be > 0"),
        "kl without reference": ({"objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.1}},
                                 "needs reference_logprobs"),
        "behavior length": ({"samples": [{**sample, "behavior_logprobs": np.zeros(2, np.float32)}]},
                            "expected a float32 array of 3"),
        "dropout": ({"lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj"]}}, "must be 0"),
        "targets": ({"lora": {"r": 4, "alpha": 8, "target_modules": ["nothing"]}}, "match no linear layer"),
        "prompt id": ({"samples": [{**sample, "prompt_ids": [1, 18]}]},
                      "learner_step.samples[0].prompt_ids: token id 18 is outside the model's vocabulary [0, 18)"),
        "prompt_ids missing": ({"samples": [{k: v for k, v in sample.items() if k != "prompt_ids"}]},
                               "learner_step.samples[0]: missing field 'prompt_ids'"),
        "prompt_ids of floats": ({"samples": [{**sample, "prompt_ids": [1.0, 4.0]}]},
                                 "learner_step.samples[0].prompt_ids: expected a non-empty list of token ids"),
    }
    for name, (change, expected) in cases.items():
        with pytest.raises(WorkerError) as info:
            learner.call("learner_step", {**base, **change})
        assert info.value.error_type == "BadRequest", name
        assert expected in info.value.message, (name, info.value.message)
    assert not (tmp_path / "out").exists()
