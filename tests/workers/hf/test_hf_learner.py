"""The HF worker as the learner, on the shipped model: one update lowers the objective, the core recomputes the
reported loss, the adapter round-trips with its digest, and the optimizer state carries over to the next step.

Tolerance of the core's recomputation: the worker and the core evaluate the same float32 per-token formula on the
same inputs (the reported proximal, the engine's behavior, the core's advantages) and both sum in float64, but
torch's vectorised `exp` and numpy's may round differently in the last place. Every intermediate is of size about
1 (weights and ratios near 1, exp(d) near 1 in the k3 term, where the result is a small difference of such values),
so each token's term agrees to a few float32 ulps of 1 (~2.4e-7) times its scale: |A| for the policy term, 1 for
the k3 term. The means must therefore agree within 1e-6·max|A| (policy), 1e-6 (kl) and 1e-6·(max|A| + kl_coef)
(loss); bit-identity is not expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_calls import bit_identical, generate, max_abs_diff, prompt_ids, score

from invar import canonical
from invar.loop.checkpoint import check_checkpoint
from invar.loop.objective import ObjectiveSettings, group_advantages, loss_terms
from invar.tasks import ModelTokenizer, Problem
from invar.tasks import score as task_score
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

GROUP = 4
OBJECTIVE = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0}
OPTIMIZER = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


@dataclass
class Rollout:
    requests: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    advantages: np.ndarray

    def samples(self, reference: list[np.ndarray] | None = None) -> list[dict[str, Any]]:
        out = []
        for i, (r, o, a) in enumerate(zip(self.requests, self.outputs, self.advantages, strict=True)):
            s = {"prompt": r["prompt"], "prompt_ids": r["prompt_ids"], "tokens": o["tokens"],
                 "behavior_logprobs": o["logprobs"], "advantage": float(a)}
            if reference is not None:
                s["reference_logprobs"] = reference[i]
            out.append(s)
        return out

    @property
    def behavior(self) -> list[np.ndarray]:
        return [o["logprobs"] for o in self.outputs]


@pytest.fixture(scope="module")
def rollout(inference: WorkerClient, problems: list[Problem], vocab: ModelTokenizer) -> Rollout:
    """GROUP samples at T=1 for 8 harder problems; rewards and group advantages computed by the core."""
    hard = [p for p in problems if p.kind in ("add3", "sub3", "mul", "addsub")][:8]
    reqs = []
    for i, p in enumerate(hard):
        for g in range(GROUP):
            reqs.append({"request_id": f"{p.id}/{g}", "prompt": p.prompt, "prompt_ids": prompt_ids(p.prompt),
                         "seed": 10_000 + GROUP * i + g, "temperature": 1.0, "top_p": 1.0, "max_tokens": 6})
    outs = generate(inference, reqs)
    rewards = np.array([1 - task_score(r["prompt"], vocab.decode(o["tokens"])) for r, o in zip(reqs, outs,
                                                                                               strict=True)])
    advantages = group_advantages(rewards, GROUP)
    assert np.count_nonzero(advantages) >= GROUP, "the batch needs groups with both right and wrong answers"
    return Rollout(reqs, outs, advantages)


def _step(worker: WorkerClient, rollout: Rollout, save_dir: Path, **extra: Any) -> dict[str, Any]:
    params = {"samples": rollout.samples(), "temperature": 1.0, "objective": OBJECTIVE, "optimizer": OPTIMIZER,
              "lora": LORA, "seed": 7, "save_dir": str(save_dir), **extra}
    result: dict[str, Any] = worker.call("learner_step", params)
    return result


def _objective(rollout: Rollout, proximal: list[np.ndarray], current: list[np.ndarray]) -> float:
    return loss_terms(proximal, rollout.behavior, rollout.advantages, ObjectiveSettings(**OBJECTIVE),
                      current=current).loss


@dataclass
class Stepped:
    result: dict[str, Any]
    before: list[np.ndarray]
    after: list[np.ndarray]


@pytest.fixture(scope="module")
def stepped(learner: WorkerClient, rollout: Rollout, tmp_path_factory: pytest.TempPathFactory) -> Stepped:
    """The learner's first step on the rollout, with the batch scored by the learner before and after it."""
    before = [s["logprobs"] for s in score(learner, rollout.requests, rollout.outputs)]
    result = _step(learner, rollout, tmp_path_factory.mktemp("step") / "adapter")
    after = [s["logprobs"] for s in score(learner, rollout.requests, rollout.outputs)]
    return Stepped(result, before, after)


def test_a_step_lowers_the_objective_on_its_batch(rollout: Rollout, stepped: Stepped) -> None:
    proximal = stepped.result["proximal_logprobs"]
    before = _objective(rollout, proximal, stepped.before)
    after = _objective(rollout, proximal, stepped.after)
    print(f"\nobjective on the batch: before {before:.6g}, after {after:.6g} (lr {OPTIMIZER['lr']})")
    assert after < before - 1e-4


def test_the_core_recomputes_the_reported_loss(rollout: Rollout, stepped: Stepped) -> None:
    res = stepped.result
    proximal = res["proximal_logprobs"]
    assert [p.shape for p in proximal] == [b.shape for b in rollout.behavior]
    assert all(p.dtype == np.float32 for p in proximal)
    core = loss_terms(proximal, rollout.behavior, rollout.advantages, ObjectiveSettings(**OBJECTIVE))
    tolerance = 1e-6 * float(np.max(np.abs(rollout.advantages)))
    print(f"\nloss: worker {res['loss']!r}, core {core.loss!r}, |diff| {abs(core.loss - res['loss']):.3g} "
          f"(tolerance {tolerance:.3g}); importance weight mean {res['importance_weight_mean']!r}")
    assert abs(core.loss - res["loss"]) <= tolerance
    assert abs(core.policy - res["policy"]) <= tolerance
    assert abs(core.importance_weight_mean - res["importance_weight_mean"]) <= 1e-6
    assert res["kl"] == core.kl == 0.0
    assert res["tokens"] == core.tokens == sum(b.size for b in rollout.behavior)
    assert res["grad_norm"] > 0


def test_learner_and_engine_readings_of_the_same_tokens(rollout: Rollout, stepped: Stepped) -> None:
    """Both start from the base weights; the learner's one-pass forward differs from the engine's decode loop."""
    gap = np.concatenate([p.astype(np.float64) - b for p, b in
                          zip(stepped.result["proximal_logprobs"], rollout.behavior, strict=True)])
    print(f"\nlearner − engine on {gap.size} tokens: {np.mean(gap == 0):.1%} exactly equal, "
          f"max |gap| {np.abs(gap).max():.3g} nats")
    assert np.abs(gap).max() < 1e-4
    assert max_abs_diff(stepped.result["proximal_logprobs"], stepped.before) < 1e-4


def test_the_saved_adapter_passes_the_core_checkpoint_check(stepped: Stepped, model_dir: Path,
                                                             model_digest: str) -> None:
    res = stepped.result
    folder = Path(res["adapter_dir"])
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                         "invar-manifest.json", "optimizer.safetensors"]
    assert res["adapter_digest"] == canonical.tree_digest(str(folder))
    checked = check_checkpoint(folder, model_dir, reported_digest=res["adapter_digest"],
                               reported_tensors=res["adapter_tensors"], reported_steps=res["optimizer_steps"],
                               base_model_digest=model_digest).adapter
    assert checked.rank == LORA["r"]
    assert checked.scale == LORA["alpha"] / LORA["r"]
    assert res["start_adapter_digest"] is None
    tensors = res["adapter_tensors"]
    assert all(t["dtype"] == "float32" for t in tensors.values())
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert a["shape"][0] == LORA["r"]
    assert len(tensors) == 2 * 2 * sum(1 for k in tensors if k.endswith("q_proj.lora_A.weight"))


def test_the_adapter_round_trips_with_its_digest(inference: WorkerClient, rollout: Rollout,
                                                 stepped: Stepped) -> None:
    res = stepped.result
    loaded = inference.call("load_adapter", {"name": "stepped", "path": res["adapter_dir"],
                                             "digest": res["adapter_digest"]})
    assert loaded["adapter_digest"] == res["adapter_digest"]
    reloaded = [s["logprobs"] for s in score(inference, rollout.requests, rollout.outputs, adapter="stepped")]
    assert bit_identical(reloaded, stepped.after), "the reloaded adapter must give the learner's own bits"
    base = [s["logprobs"] for s in score(inference, rollout.requests, rollout.outputs, adapter="base")]
    assert max_abs_diff(base, reloaded) > 1e-6, "the adapter must change the model"
    # Rollouts under the adapter name its digest, and a reference under the base model is scored in the same call.
    report = inference.call("generate", {"requests": rollout.requests[:8], "layout": [list(range(8))],
                                         "adapter": "stepped", "reference_adapter": "base"})
    assert report["adapter_digest"] == res["adapter_digest"]
    under = report["outputs"]
    again = score(inference, rollout.requests[:8], under, adapter="base")
    assert bit_identical([o["reference_logprobs"] for o in under], [s["logprobs"] for s in again])


def test_the_optimizer_state_carries_to_the_next_step(learner: WorkerClient, rollout: Rollout, stepped: Stepped,
                                                      tmp_path: Path) -> None:
    second = _step(learner, rollout, tmp_path / "second")
    assert second["start_adapter_digest"] == stepped.result["adapter_digest"]
    assert second["optimizer_steps"] == 2
    # Proximal values of step 2 are the learner's reading with the weights step 1 produced.
    assert max_abs_diff(second["proximal_logprobs"], stepped.after) < 1e-4
    assert max_abs_diff(second["proximal_logprobs"], stepped.result["proximal_logprobs"]) > 1e-6


def test_the_kl_term_is_recomputed_by_the_core(learner: WorkerClient, inference: WorkerClient, rollout: Rollout,
                                               stepped: Stepped, tmp_path: Path) -> None:
    reference = [s["logprobs"] for s in score(inference, rollout.requests, rollout.outputs, adapter="base")]
    objective = {**OBJECTIVE, "kl_coef": 0.1}
    res = learner.call("learner_step", {
        "samples": rollout.samples(reference), "temperature": 1.0, "objective": objective, "optimizer": OPTIMIZER,
        "lora": None, "seed": 7, "save_dir": str(tmp_path / "kl")})
    core = loss_terms(res["proximal_logprobs"], rollout.behavior, rollout.advantages, ObjectiveSettings(**objective),
                      reference=reference)
    print(f"\nwith kl_coef 0.1: worker loss {res['loss']!r} kl {res['kl']!r}; core {core.loss!r} {core.kl!r}; "
          f"|diff| loss {abs(core.loss - res['loss']):.3g}, kl {abs(core.kl - res['kl']):.3g}")
    assert res["kl"] > 0
    assert abs(core.kl - res["kl"]) <= 1e-6
    assert abs(core.loss - res["loss"]) <= 1e-6 * (float(np.max(np.abs(rollout.advantages))) + 0.1)


def test_a_tiny_kl_term_is_the_term_not_rounding(learner: WorkerClient, rollout: Rollout, tmp_path: Path) -> None:
    """With the reference within ~1.5e-5 of the learner's reading, k3 ≈ d²/2 ≈ 1e-10: written exp(d) − d − 1 in
    float32 it is rounding of 1 (ulp 1.2e-7, of either sign); expm1(d) − d is the term to about 1 %."""
    current = [s["logprobs"] for s in score(learner, rollout.requests, rollout.outputs)]
    delta = np.float32(2.0**-16)
    reference = [np.asarray(c, np.float32) - delta for c in current]
    objective = {**OBJECTIVE, "kl_coef": 0.1}
    res = learner.call("learner_step", {
        "samples": rollout.samples(reference), "temperature": 1.0, "objective": objective, "optimizer": OPTIMIZER,
        "lora": None, "seed": 7, "save_dir": str(tmp_path / "tiny-kl")})
    d = [(r - np.asarray(p, np.float32)).astype(np.float64) for r, p in zip(reference, res["proximal_logprobs"],
                                                                          strict=True)]
    exact = sum(float(np.sum(np.expm1(x) - x)) for x in d) / res["tokens"]
    core = loss_terms(res["proximal_logprobs"], rollout.behavior, rollout.advantages, ObjectiveSettings(**objective),
                      reference=reference)
    print(f"\ntiny KL: learner {res['kl']!r}, core {core.kl!r}, float64 {exact!r}")
    assert 0 < exact < 1e-8
    assert abs(res["kl"] - exact) <= 0.05 * exact
    assert abs(core.kl - exact) <= 0.05 * exact


def test_a_step_over_the_nf4_base_lowers_the_objective(nf4_learner: WorkerClient, rollout: Rollout,
                                                       tmp_path: Path) -> None:
    before = [s["logprobs"] for s in score(nf4_learner, rollout.requests, rollout.outputs)]
    res = _step(nf4_learner, rollout, tmp_path / "nf4")
    after = [s["logprobs"] for s in score(nf4_learner, rollout.requests, rollout.outputs)]
    proximal = res["proximal_logprobs"]
    core = loss_terms(proximal, rollout.behavior, rollout.advantages, ObjectiveSettings(**OBJECTIVE))
    b, a = _objective(rollout, proximal, before), _objective(rollout, proximal, after)
    print(f"\nNF4 base: objective before {b:.6g}, after {a:.6g}; importance weight mean "
          f"{res['importance_weight_mean']:.6g} (behavior from the FP32 engine)")
    assert res["grad_norm"] > 0
    assert a < b - 1e-4
    assert abs(core.loss - res["loss"]) <= 1e-6 * float(np.max(np.abs(rollout.advantages)))
