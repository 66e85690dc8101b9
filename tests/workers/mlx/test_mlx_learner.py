"""The MLX learner on the shipped model: one update on the engine's own samples lowers the objective, the
core's recomputation of the reported terms matches, and the saved adapter passes the core's check and takes
effect in the inference engine.

Tolerance of the core's recomputation: the learner reports the per-token float32 terms MLX computed, summed in
float64 and divided by N, exactly as `invar.loop.objective.loss_terms` sums its own; the core recomputes each
per-token term from the reported proximal log-probabilities with numpy. Where proximal = behavior (importance
weight exactly 1) and there is no KL term, both evaluate the same float32 operations on the same bits: the
measured difference is 0 and the test requires 0. The KL term k = exp(d) − d − 1 (d = reference − current) is
computed in float32 on both sides from the same d; MLX's `exp` and numpy's may differ in the last place of
exp(d), and the two subtractions round near 1 whatever the size of k, so one token's k may differ by a few ulp
of max(exp(d), 1): the bound used is 4·2⁻²³·Σ max(exp(d), 1)/N (the test prints the measured difference;
about 1 % of the bound).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from invar.engines import DEFAULT_MODEL
from invar.errors import WorkerError
from invar.loop.checkpoint import check_adapter
from invar.loop.objective import LossTerms, ObjectiveSettings, group_advantages, loss_terms
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import MAX_ANSWER_CHARS, Problem, score
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

GROUP = 8
TEMPERATURE = 1.0
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
OPTIMIZER = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
TOK = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
"""The shipped model's tokenizer: requests and samples carry the core's `prompt_ids` (workers never tokenize)."""


Rollout = tuple[list[dict[str, Any]], list[str], np.ndarray]


def rollout(inference: WorkerClient, vocab: ModelTokenizer, prompts: list[str], seed0: int,
            adapter: str | None = None, reference: str | None = None) -> Rollout:
    """G samples per prompt at the rollout temperature; the core's rewards and group advantages."""
    order = [p for p in prompts for _ in range(GROUP)]
    reqs = [{"request_id": f"s{i}", "prompt": p, "prompt_ids": TOK.prompt_ids(prompt=p), "seed": seed0 + i,
             "temperature": TEMPERATURE, "top_p": 1.0, "max_tokens": MAX_ANSWER_CHARS + 1}
            for i, p in enumerate(order)]
    outputs: list[dict[str, Any]] = inference.call(
        "generate", {"requests": reqs, "adapter": adapter, "reference_adapter": reference})["outputs"]
    rewards = np.array([1 - score(p, vocab.decode(o["tokens"])) for p, o in zip(order, outputs, strict=True)],
                       dtype=np.float64)
    return outputs, order, group_advantages(rewards, GROUP)


def step_params(outputs: list[dict[str, Any]], prompts: list[str], advantages: np.ndarray, save_dir: Path,
                kl_coef: float = 0.0, **extra: Any) -> dict[str, Any]:
    samples = []
    for o, p, a in zip(outputs, prompts, advantages, strict=True):
        sample = {"prompt": p, "prompt_ids": TOK.prompt_ids(prompt=p), "tokens": o["tokens"],
                  "behavior_logprobs": o["logprobs"], "advantage": float(a)}
        if "reference_logprobs" in o:
            sample["reference_logprobs"] = o["reference_logprobs"]
        samples.append(sample)
    return {"samples": samples, "temperature": TEMPERATURE,
            "objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": kl_coef}, "optimizer": OPTIMIZER,
            "lora": LORA, "seed": 11, "save_dir": str(save_dir), **extra}


def core_terms(result: dict[str, Any], outputs: list[dict[str, Any]], advantages: np.ndarray,
               kl_coef: float = 0.0, current: list[np.ndarray] | None = None) -> LossTerms:
    reference = [o["reference_logprobs"] for o in outputs] if kl_coef else None
    return loss_terms(result["proximal_logprobs"], [o["logprobs"] for o in outputs], advantages,
                      ObjectiveSettings(0.2, 0.28, kl_coef), reference=reference, current=current)


def rescore(inference: WorkerClient, outputs: list[dict[str, Any]], prompts: list[str],
            adapter: str) -> list[Any]:
    items = [{"item_id": str(i), "prompt": p, "prompt_ids": TOK.prompt_ids(prompt=p), "response_tokens": o["tokens"],
              "temperature": TEMPERATURE}
             for i, (o, p) in enumerate(zip(outputs, prompts, strict=True))]
    return [o["logprobs"] for o in inference.call("score", {"items": items, "adapter": adapter})["outputs"]]


def test_learner_step_lowers_the_objective_and_the_core_recomputes_it(
        inference: WorkerClient, learner: WorkerClient, load_params: dict[str, Any], vocab: ModelTokenizer,
        problems: list[Problem], model_dir: Path, tmp_path: Path) -> None:
    learner.call("load_model", load_params)  # a fresh adapter and optimizer
    prompts = [p.prompt for p in problems[500:516]]
    outputs, order, advantages = rollout(inference, vocab, prompts, seed0=100)
    assert np.any(advantages != 0), "the rollout must hold right and wrong answers in some group"
    result = learner.call("learner_step", step_params(outputs, order, advantages, tmp_path / "step1"))

    # The learner's proximal reading of the engine's tokens: bit-identical to the behavior log-probabilities
    # (same engine, same weights), so every importance weight is exactly 1.
    behavior = [o["logprobs"] for o in outputs]
    assert all(p.tobytes() == b.tobytes() for p, b in zip(result["proximal_logprobs"], behavior, strict=True))
    assert result["importance_weight_mean"] == 1.0
    assert result["start_adapter_digest"] is None
    assert result["optimizer_steps"] == 1
    assert result["tokens"] == sum(o["tokens"].size for o in outputs)
    assert result["grad_norm"] > 0

    core = core_terms(result, outputs, advantages)
    assert (core.loss, core.policy, core.kl, core.tokens) == (
        result["loss"], result["policy"], result["kl"], result["tokens"])

    checked = check_adapter(result["adapter_dir"], model_dir, reported_digest=result["adapter_digest"],
                            reported_tensors=result["adapter_tensors"],
                            base_model_digest=load_params["model_digest"])
    assert set(checked.formats) == {"mlx", "peft"}
    assert (checked.rank, checked.scale, len(checked.modules)) == (8, 2.0, 2 * 3)

    # The update lowers the objective, evaluated by the core at the new weights (as the inference engine reads
    # them).
    name = "learner-step-1"
    loaded = inference.call("load_adapter", {"name": name, "path": result["adapter_dir"],
                                             "digest": result["adapter_digest"]})
    assert loaded["adapter_digest"] == result["adapter_digest"]
    after = core_terms(result, outputs, advantages, current=rescore(inference, outputs, order, name))
    assert after.loss < core.loss

    # The next update continues from that adapter, with the optimizer state kept, and reads the same weights.
    outputs2, order2, advantages2 = rollout(inference, vocab, prompts, seed0=900, adapter=name)
    result2 = learner.call("learner_step", step_params(outputs2, order2, advantages2, tmp_path / "step2"))
    assert result2["start_adapter_digest"] == result["adapter_digest"]
    assert result2["optimizer_steps"] == 2
    assert all(p.tobytes() == o["logprobs"].tobytes()
               for p, o in zip(result2["proximal_logprobs"], outputs2, strict=True))
    assert result2["adapter_digest"] != result["adapter_digest"]


def test_kl_term_against_the_engines_reference_logprobs(
        inference: WorkerClient, learner: WorkerClient, load_params: dict[str, Any], vocab: ModelTokenizer,
        problems: list[Problem], tmp_path: Path) -> None:
    learner.call("load_model", load_params)
    prompts = [p.prompt for p in problems[600:612]]
    kl_coef = 0.1
    outputs, order, advantages = rollout(inference, vocab, prompts, seed0=300, reference="base")
    first = learner.call("learner_step",
                         step_params(outputs, order, advantages, tmp_path / "a", kl_coef=kl_coef))
    assert first["kl"] == 0.0  # a fresh adapter is the base model exactly (b = 0): reference = current
    name = "kl-step-1"
    inference.call("load_adapter", {"name": name, "path": first["adapter_dir"],
                                    "digest": first["adapter_digest"]})
    outputs, order, advantages = rollout(inference, vocab, prompts, seed0=400, adapter=name, reference="base")
    result = learner.call("learner_step",
                          step_params(outputs, order, advantages, tmp_path / "b", kl_coef=kl_coef))
    assert result["kl"] > 0
    core = core_terms(result, outputs, advantages, kl_coef=kl_coef)
    assert core.policy == result["policy"]
    # A few ulp of max(exp(d), 1) per token (MLX exp vs numpy exp; see the module docstring).
    d = [o["reference_logprobs"] - p for o, p in zip(outputs, result["proximal_logprobs"], strict=True)]
    scale = sum(float(np.sum(np.maximum(np.exp(x.astype(np.float64)), 1.0))) for x in d) / result["tokens"]
    bound = 4 * 2.0**-23 * scale
    print(f"core vs MLX learner with KL: |Δkl| = {abs(core.kl - result['kl']):.3g} on kl {result['kl']:.3g} "
          f"(bound {bound:.3g}), |Δloss| = {abs(core.loss - result['loss']):.3g}")
    assert abs(core.kl - result["kl"]) <= bound
    assert abs(core.loss - result["loss"]) <= kl_coef * bound + 1e-15


def test_a_tiny_kl_term_is_the_term_not_rounding(
        inference: WorkerClient, learner: WorkerClient, load_params: dict[str, Any], vocab: ModelTokenizer,
        problems: list[Problem], tmp_path: Path) -> None:
    """A fresh adapter reads exactly the engine's reference; lowered by 2⁻¹⁶, k3 ≈ d²/2 ≈ 1e-10. Written
    exp(d) − d − 1 in float32 it is rounding of 1 (ulp 1.2e-7, of either sign); expm1(d) − d is the term to 1 %."""
    learner.call("load_model", load_params)
    prompts = [p.prompt for p in problems[600:612]]
    outputs, order, advantages = rollout(inference, vocab, prompts, seed0=300, reference="base")
    delta = np.float32(2.0**-16)
    shifted = [{**o, "reference_logprobs": np.asarray(o["reference_logprobs"], np.float32) - delta} for o in outputs]
    result = learner.call("learner_step", step_params(shifted, order, advantages, tmp_path / "a", kl_coef=0.1))
    d = [(o["reference_logprobs"] - np.asarray(p, np.float32)).astype(np.float64)
         for o, p in zip(shifted, result["proximal_logprobs"], strict=True)]
    exact = sum(float(np.sum(np.expm1(x) - x)) for x in d) / result["tokens"]
    core = core_terms(result, shifted, advantages, kl_coef=0.1)
    print(f"tiny KL: learner {result['kl']!r}, core {core.kl!r}, float64 {exact!r}")
    assert 0 < exact < 1e-8
    assert abs(result["kl"] - exact) <= 0.05 * exact
    assert abs(core.kl - exact) <= 0.05 * exact


def test_bad_learner_input_changes_nothing(learner: WorkerClient, inference: WorkerClient,
                                           load_params: dict[str, Any], vocab: ModelTokenizer,
                                           problems: list[Problem], tmp_path: Path) -> None:
    learner.call("load_model", load_params)
    outputs, order, advantages = rollout(inference, vocab, [problems[0].prompt], seed0=1)
    good = step_params(outputs, order, advantages, tmp_path / "ok")

    def refused(params: dict[str, Any], *fragments: str) -> None:
        with pytest.raises(WorkerError) as info:
            learner.call("learner_step", params)
        for fragment in fragments:
            assert fragment in info.value.message, info.value.message

    refused({**good, "lora": {**LORA, "dropout": 0.1}}, "dropout: must be 0")
    refused({**good, "lora": {**LORA, "target_modules": ["wq"]}}, "['wq'] match no linear layer")
    refused(step_params(outputs, order, advantages, tmp_path / "x", kl_coef=0.1), "needs reference_logprobs")
    refused({**good, "lora": None}, "send lora settings for a fresh one")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    refused({**good, "save_dir": str(tmp_path / "full")}, "not an empty folder")
    with pytest.raises(WorkerError) as info:
        learner.call("generate", {"requests": []})
    assert info.value.error_type == "UnknownMethod"
    first = learner.call("learner_step", good)
    assert first["optimizer_steps"] == 1
    assert first["start_adapter_digest"] is None
    refused({**good, "save_dir": str(tmp_path / "y"), "lora": {**LORA, "r": 4}}, "r=8, alpha=16")
    again = learner.call("learner_step", {**good, "save_dir": str(tmp_path / "z"), "lora": None})
    assert again["optimizer_steps"] == 2


def test_the_mlx_and_hf_learners_take_the_same_step(
        inference: WorkerClient, learner: WorkerClient, load_params: dict[str, Any], vocab: ModelTokenizer,
        problems: list[Problem], model_dir: Path, tmp_path: Path) -> None:
    """Both learners start from the same adapter (an earlier MLX step, so b ≠ 0) with fresh AdamW state and
    take one step on the same samples, with eps = 1 and lr = 1 so that the step is nearly the gradient itself
    (Δw = g/(|g| + 1) for a first AdamW step): the updated weights compare the two gradients element by
    element. They agree to float32 rounding in different kernels (forward and backward through 3 layers, sums
    over 128 tokens in different orders): grad_norm within 1e-4 relative and every weight within 1e-4 of the
    largest move, while a wrong gradient would be off by the size of the move (measured values printed)."""
    from invar.engines import start_worker
    from invar.formats.checkpoint import inspect_adapter
    from invar.protocol import Role

    learner.call("load_model", load_params)
    prompts = [p.prompt for p in problems[800:804]]
    outputs, order, advantages = rollout(inference, vocab, prompts, seed0=50)
    advantages = np.sin(np.arange(len(order))).astype(np.float32)  # non-zero for every sample
    first = learner.call("learner_step", {**step_params(outputs, order, advantages, tmp_path / "start"),
                                          "optimizer": {**OPTIMIZER, "lr": 3e-2}})
    start = {"path": first["adapter_dir"], "digest": first["adapter_digest"]}
    inference.call("load_adapter", {"name": "same-step", **start})
    outputs, order, _ = rollout(inference, vocab, prompts, seed0=60, adapter="same-step")
    params = {**step_params(outputs, order, advantages, tmp_path / "x"), "lora": None,
              "optimizer": {"lr": 1.0, "betas": [0.9, 0.999], "eps": 1.0, "weight_decay": 0.0}}
    learner.call("load_model", {**load_params, "adapter": start})
    mlx = learner.call("learner_step", {**params, "save_dir": str(tmp_path / "mlx")})
    with start_worker("hf", Role.LEARNER) as hf:
        hf.call("load_model", {**load_params, "adapter": start})
        torch = hf.call("learner_step", {**params, "save_dir": str(tmp_path / "hf")})
    learner.call("load_model", load_params)
    assert mlx["start_adapter_digest"] == torch["start_adapter_digest"] == start["digest"]
    gap = max(float(np.max(np.abs(a - b)))
              for a, b in zip(mlx["proximal_logprobs"], torch["proximal_logprobs"], strict=True))
    ours = inspect_adapter(mlx["adapter_dir"], model_dir).formats["peft"]
    theirs = inspect_adapter(torch["adapter_dir"], model_dir).formats["peft"]
    before = inspect_adapter(first["adapter_dir"], model_dir).formats["peft"]
    worst = moved = 0.0
    for module in theirs.modules:
        for x, y, z in zip(ours.pair(module), theirs.pair(module), before.pair(module), strict=True):
            worst = max(worst, float(np.max(np.abs(x - y))))
            moved = max(moved, float(np.max(np.abs(y - z))))
    print(f"MLX vs HF learner: grad_norm {mlx['grad_norm']:.9g} vs {torch['grad_norm']:.9g}, proximal gap "
          f"{gap:.3g} nats, updated weights max |Δ| {worst:.3g} (largest move {moved:.3g})")
    assert moved > 0
    assert abs(mlx["grad_norm"] - torch["grad_norm"]) <= 1e-4 * torch["grad_norm"]
    assert worst <= 1e-4 * moved
