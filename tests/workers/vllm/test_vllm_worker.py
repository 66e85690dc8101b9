"""The vLLM inference worker on the shipped model, with the real engine on the CPU: its identity, seeded
reproducibility, teacher-forced scores against the engine's own sampled log-probabilities, a request alone against
the same request inside a batch of 32, LoRA adapters replaced without a restart, the adapter one step of the HF or
the MLX learner saves scoring in vLLM as in that learner, and one clear error per bad input after which the worker
keeps serving.

Measured numbers are printed with the prefix `measured:` (run pytest with -rP to see them) and are in docs/vllm.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from invar import canonical
from invar.engines import DEFAULT_MODEL, start_worker
from invar.errors import ProtocolError, WorkerError
from invar.loop.checkpoint import check_adapter
from invar.loop.objective import group_advantages
from invar.protocol import Role
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import MAX_ANSWER_CHARS, Problem, score
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine

BUDGET = MAX_ANSWER_CHARS + 1
TOK = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
"""The shipped model's tokenizer: requests carry the core's `prompt_ids` (workers never tokenize)."""
SCORE_TOLERANCE = 1e-5
"""Teacher forcing recomputes the logits in one prefill where sampling computed them one decode step at a time;
the two differ by float32 rounding, a few ulps of values below 16 nats (ulp 1.9e-6 there)."""


LEARNER_ADAPTER_TOLERANCE = 1e-4
"""vLLM vs the learner's engine (HF or MLX) under the learner's adapter: two implementations of the same float32
forward with different kernels and summation orders, on log-probabilities below about 20 nats."""


def requests(prompts: list[str], temperature: float = 1.0, seed0: int = 1000,
             max_tokens: int = BUDGET) -> list[dict[str, Any]]:
    return [{"request_id": f"r{i}", "prompt": p, "prompt_ids": TOK.prompt_ids(prompt=p), "seed": seed0 + i,
             "temperature": temperature, "top_p": 1.0, "max_tokens": max_tokens} for i, p in enumerate(prompts)]


def generate(worker: WorkerClient, reqs: list[dict[str, Any]], **params: Any) -> list[dict[str, Any]]:
    outputs: list[dict[str, Any]] = worker.call("generate", {"requests": reqs, **params})["outputs"]
    return outputs


def items(reqs: list[dict[str, Any]], outputs: list[dict[str, Any]], temperature: float,
          vocab_steps: list[int] | None = None) -> list[dict[str, Any]]:
    return [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
             "response_tokens": o["tokens"], "temperature": temperature, "vocab_steps": vocab_steps or []}
            for r, o in zip(reqs, outputs, strict=True)]


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Tokens and log-probabilities equal bit for bit."""
    return all(x["tokens"].tobytes() == y["tokens"].tobytes() and x["logprobs"].tobytes() == y["logprobs"].tobytes()
               for x, y in zip(a, b, strict=True))


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b, strict=True))


def error_of(worker: WorkerClient, method: str, params: dict[str, Any]) -> str:
    """The worker's one-line error for a call that must fail."""
    with pytest.raises(WorkerError) as info:
        worker.call(method, params)
    message = str(info.value)
    assert "\n" not in message
    assert "Traceback" not in message
    return message


def still_serves(worker: WorkerClient, problems: list[Problem]) -> None:
    out = generate(worker, requests([problems[0].prompt], temperature=0.0))
    assert out[0]["tokens"].size >= 1


# -- identity -------------------------------------------------------------------------------------------------------


def test_identity_names_vllm_its_version_and_logprobs_mode(worker: WorkerClient) -> None:
    identity = worker.identity
    assert identity.engine == "vllm"
    assert identity.role == Role.INFERENCE
    assert identity.engine_version["vllm"] not in ("", "absent")
    assert identity.settings["logprobs_mode"] == "processed_logprobs"
    assert identity.settings["enable_prefix_caching"] is False
    assert identity.settings["device"] == "cpu"
    assert set(identity.methods) == {"load_model", "load_adapter", "generate", "score"}


def test_learner_role_is_refused_at_start() -> None:
    with pytest.raises(ProtocolError) as info:
        start_worker("vllm", Role.LEARNER, handshake_timeout=120)
    message = str(info.value)
    assert "inference engine only" in message
    assert "the worker refused to start: invar.workers.vllm_worker: " in message  # its own line, alone


def test_engine_processes_cannot_write_to_the_protocol_stream(worker: WorkerClient) -> None:
    """On one CPU device vLLM's engine core runs in the worker's process, whose fd 1 is stderr; any process vLLM
    spawns holds stderr as its stdout and never the frame pipe (the split worker of test_vllm_parallel.py checks the
    spawned engine core and model workers)."""
    assert_engine_output_on_stderr(worker, spawned=False)


def assert_engine_output_on_stderr(worker: WorkerClient, spawned: bool) -> None:
    proto = os.fstat(worker._proc.stdout.fileno()).st_ino  # type: ignore[union-attr]
    err = os.fstat(worker._proc.stderr.fileno()).st_ino  # type: ignore[union-attr]
    process = psutil.Process(worker.identity.pid)
    children = process.children(recursive=True)
    assert any("EngineCore" in c.name() for c in children) == spawned, [c.name() for c in children]
    own = {fd.name: os.readlink(fd) for fd in Path(f"/proc/{process.pid}/fd").iterdir() if fd.name.isdigit()}
    assert own.get("1") == f"pipe:[{err}]", own
    for child in children:
        fds = Path(f"/proc/{child.pid}/fd")
        links = {fd.name: os.readlink(fd) for fd in fds.iterdir() if fd.name.isdigit()}
        assert f"pipe:[{proto}]" not in links.values(), (child.name(), links)
        assert links.get("1") == f"pipe:[{err}]", (child.name(), links)


# -- sampling -------------------------------------------------------------------------------------------------------


def test_load_model_reports_the_model(worker: WorkerClient, load_params: dict[str, Any], vocab: ModelTokenizer) -> None:
    got = worker.call("load_model", load_params)  # the same model again reuses the engine
    assert got["model_digest"] == load_params["model_digest"]
    assert got["adapter_digest"] is None
    assert got["vocab_size"] == vocab.size
    assert got["eos_token_id"] == vocab.eos_token_id
    assert got["max_model_len"] == 128


def test_seeded_generation_is_reproducible(worker: WorkerClient, problems: list[Problem],
                                           vocab: ModelTokenizer) -> None:
    reqs = requests([p.prompt for p in problems[:16]], temperature=1.0)
    first, again = generate(worker, reqs), generate(worker, reqs)
    assert same(first, again)
    other = generate(worker, requests([p.prompt for p in problems[:16]], temperature=1.0, seed0=5000))
    assert not same(first, other)
    for r, o in zip(reqs, first, strict=True):
        assert o["request_id"] == r["request_id"]
        assert o["prompt_tokens"].dtype == np.int32
        assert o["prompt_tokens"].tolist() == r["prompt_ids"] == vocab.encode(r["prompt"], add_bos=True)
        assert o["tokens"].dtype == np.int32
        assert o["logprobs"].dtype == np.float32
        assert o["tokens"].size == o["logprobs"].size <= BUDGET
        assert np.all(o["logprobs"] <= 0)
        stopped = int(o["tokens"][-1]) == vocab.eos_token_id
        assert o["finish_reason"] == ("stop" if stopped else "length")


def test_greedy_answers_match_transformers_and_score_with_the_core_scorer(
        worker: WorkerClient, problems: list[Problem], vocab: ModelTokenizer, model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    sample = problems[:64]
    out = generate(worker, requests([p.prompt for p in sample], temperature=0.0))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reference = []
    with torch.no_grad():
        for p in sample:
            ids = torch.tensor([vocab.encode(p.prompt, add_bos=True)])
            full = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=BUDGET,
                                  eos_token_id=vocab.eos_token_id, pad_token_id=vocab.eos_token_id)
            reference.append(full[0, ids.shape[1]:].tolist())
    assert [o["tokens"].tolist() for o in out] == reference
    losses = [score(p.prompt, vocab.decode(o["tokens"])) for p, o in zip(sample, out, strict=True)]
    print(f"measured: greedy tokens equal to transformers' on 64 eval problems; task loss {sum(losses)}/64")


def test_teacher_forced_scores_match_the_sampled_logprobs(worker: WorkerClient, problems: list[Problem]) -> None:
    prompts = [p.prompt for p in problems[:32]]
    for temperature in (1.0, 0.7, 0.0):
        reqs = requests(prompts, temperature=temperature, seed0=200)
        out = generate(worker, reqs)
        # Greedy tokens' log-probabilities are at T = 1, so they are scored at T = 1.
        scored = worker.call("score", {"items": items(reqs, out, temperature or 1.0), "adapter": None})["outputs"]
        sampled = [o["logprobs"] for o in out]
        forced = [s["logprobs"] for s in scored]
        exact = sum(int(np.sum(a.view(np.int32) == b.view(np.int32))) for a, b in zip(sampled, forced, strict=True))
        total = sum(a.size for a in sampled)
        diff = max_diff(sampled, forced)
        print(f"measured: generate vs score at T={temperature}: {exact}/{total} log-probs bit-identical, "
              f"max |diff| {diff:.3g}")
        assert diff <= SCORE_TOLERANCE, f"T={temperature}: max |diff| {diff:.3g}"


def test_whole_vocabulary_logprobs_at_requested_steps(worker: WorkerClient, problems: list[Problem],
                                                      vocab: ModelTokenizer) -> None:
    reqs = requests([p.prompt for p in problems[:4]], temperature=0.7, seed0=300, max_tokens=2)
    out = generate(worker, reqs)
    steps = [0, 1] if all(o["tokens"].size == 2 for o in out) else [0]
    scored = worker.call("score", {"items": items(reqs, out, 0.7, steps), "adapter": None})["outputs"]
    for o, s in zip(out, scored, strict=True):
        full = s["vocab_logprobs"]
        assert full.shape == (len(steps), vocab.size)
        assert full.dtype == np.float32
        np.testing.assert_allclose(np.logaddexp.reduce(full.astype(np.float64), axis=1), 0.0, atol=1e-6)
        for row, step in zip(full, steps, strict=True):
            assert row[o["tokens"][step]] == s["logprobs"][step]  # the same numbers, bit for bit


def test_request_alone_and_in_a_batch_of_32_are_bit_identical(worker: WorkerClient,
                                                               problems: list[Problem]) -> None:
    prompts = [p.prompt for p in problems[100:132]]
    batch = requests(prompts, temperature=1.0, seed0=7000)
    positions = [0, 15, 31]
    alone = generate(worker, [batch[i] for i in positions], layout=[[0], [1], [2]])
    together = generate(worker, batch)
    reversed_order = generate(worker, batch, layout=[list(range(31, -1, -1))])
    halves = generate(worker, batch, layout=[list(range(16)), list(range(16, 32))])
    assert same(alone, [together[i] for i in positions])
    assert same(together, reversed_order)
    assert same(together, halves)
    print("measured: 3 requests alone vs at positions 0, 15, 31 of a batch of 32, and 32 requests under 3 layouts: "
          "tokens and log-probs bit-identical (max |diff| 0)")


# -- adapters -------------------------------------------------------------------------------------------------------


def test_a_batch_past_vllms_default_prefill_budget_runs_in_one_step(worker: WorkerClient) -> None:
    """64 seeded prompts of 100 ids (6,400 prompt tokens, past vLLM's CPU default of 4,096, where a seeded prompt
    prefilled in chunks fails in vLLM's sampler) run as one batch with the numbers of four batches of 16; 168
    prompts of 100 ids (16,800 tokens) are past the worker's budget and refused, naming it."""
    rng = np.random.default_rng(5)
    digits = [TOK.prompt_ids(prompt=str(d))[-1] for d in range(10)]
    reqs = [{"request_id": f"long{i}", "prompt": "", "prompt_ids": [TOK.bos_token_id or 1, *rng.choice(digits, 99)],
             "seed": 11000 + i, "temperature": 1.0, "top_p": 1.0, "max_tokens": 4} for i in range(64)]
    reqs = [{**r, "prompt_ids": [int(t) for t in r["prompt_ids"]]} for r in reqs]
    together = generate(worker, reqs)
    quarters = generate(worker, reqs, layout=[list(range(k, k + 16)) for k in range(0, 64, 16)])
    assert same(together, quarters)
    many = [{**reqs[i % 64], "request_id": f"many{i}", "seed": 12000 + i} for i in range(168)]
    message = error_of(worker, "generate", {"requests": many, "layout": [list(range(168))]})
    assert "16800 tokens" in message, message
    assert "(16384)" in message, message
    assert "--max-num-batched-tokens" in message, message
    print("measured: 64 prompts of 100 ids in one batch = four batches of 16, bit for bit; 16,800 prompt tokens "
          "refused")


def test_adapter_reload_takes_effect_without_restart(worker: WorkerClient, problems: list[Problem],
                                                     adapters: Any) -> None:
    reqs = requests([p.prompt for p in problems[:16]], temperature=1.0, seed0=400)
    base = generate(worker, reqs)
    digest_a, digest_b = canonical.tree_digest(adapters.a), canonical.tree_digest(adapters.b)
    pid = worker.identity.pid
    got = worker.call("load_adapter", {"name": "policy", "path": str(adapters.a), "digest": digest_a})
    assert got == {"name": "policy", "adapter_digest": digest_a}
    answer = worker.call("generate", {"requests": reqs, "adapter": "policy"})
    with_a = answer["outputs"]
    assert answer["adapter_digest"] == digest_a
    assert not same(base, with_a)
    worker.call("load_adapter", {"name": "policy", "path": str(adapters.b), "digest": digest_b})
    answer = worker.call("generate", {"requests": reqs, "adapter": "policy"})
    assert answer["adapter_digest"] == digest_b
    assert not same(with_a, answer["outputs"])
    worker.call("load_adapter", {"name": "policy", "path": str(adapters.a), "digest": digest_a})
    assert same(with_a, generate(worker, reqs, adapter="policy"))  # reloading A gives A's numbers back exactly
    assert same(base, generate(worker, reqs, adapter="base"))
    assert worker.identity.pid == pid


def test_reference_adapter_scores_the_sampled_tokens(worker: WorkerClient, problems: list[Problem],
                                                     adapters: Any) -> None:
    worker.call("load_adapter", {"name": "ref-a", "path": str(adapters.a), "digest": None})
    reqs = requests([p.prompt for p in problems[:8]], temperature=0.8, seed0=500)
    out = generate(worker, reqs, adapter="ref-a", reference_adapter="base")
    base_scores = worker.call("score", {"items": items(reqs, out, 0.8), "adapter": "base"})["outputs"]
    for o, s in zip(out, base_scores, strict=True):
        assert o["reference_logprobs"].tobytes() == s["logprobs"].tobytes()
    assert max_diff([o["logprobs"] for o in out], [o["reference_logprobs"] for o in out]) > 0.1
    self_ref = generate(worker, reqs, adapter="ref-a", reference_adapter="ref-a")
    diff = max_diff([o["logprobs"] for o in self_ref], [o["reference_logprobs"] for o in self_ref])
    print(f"measured: behavior vs reference log-probs under the same adapter, max |diff| {diff:.3g}")
    assert diff <= SCORE_TOLERANCE


@pytest.mark.parametrize("learner_engine", ["hf", "mlx"])
def test_an_adapter_trained_by_a_learner_scores_as_the_learner_does(
        worker: WorkerClient, problems: list[Problem], vocab: ModelTokenizer, load_params: dict[str, Any],
        model_dir: Path, learner_engine: str, tmp_path: Path) -> None:
    """vLLM samples a cycle's rollout, the learner (HF or MLX) takes one step on it and saves its adapter, vLLM
    loads that folder by its digest, and both engines then score the rollout's tokens under the new adapter."""
    hard = [p for p in problems if p.kind == "mul"][:8]  # about 1 in 5 right: groups hold both outcomes
    group = 4
    reqs = [{"request_id": f"{p.id}/{g}", "prompt": p.prompt, "prompt_ids": TOK.prompt_ids(prompt=p.prompt),
             "seed": 9000 + group * i + g, "temperature": 1.0, "top_p": 1.0, "max_tokens": BUDGET}
            for i, p in enumerate(hard) for g in range(group)]
    out = generate(worker, reqs)
    rewards = np.array([1 - score(r["prompt"], vocab.decode(o["tokens"])) for r, o in zip(reqs, out, strict=True)])
    advantages = group_advantages(rewards, group)
    assert np.count_nonzero(advantages) >= group, "the rollout needs groups with both right and wrong answers"
    samples = [{"prompt": r["prompt"], "prompt_ids": r["prompt_ids"], "tokens": o["tokens"],
                "behavior_logprobs": o["logprobs"], "advantage": float(a)}
               for r, o, a in zip(reqs, out, advantages, strict=True)]
    learner = start_worker(learner_engine, Role.LEARNER)
    try:
        learner.call("load_model", load_params)
        step = learner.call("learner_step", {
            "samples": samples, "temperature": 1.0, "seed": 11, "save_dir": str(tmp_path / "adapter"),
            "objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0},
            "optimizer": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}})
        # The learner's own reading under the adapter it just saved (null: the adapter under training).
        learned = {t: learner.call("score", {"items": items(reqs, out, t), "adapter": None})["outputs"]
                   for t in (1.0, 0.7)}
    finally:
        learner.close()
    check_adapter(step["adapter_dir"], model_dir, reported_digest=step["adapter_digest"],
                  reported_tensors=step["adapter_tensors"], base_model_digest=load_params["model_digest"])
    name = f"learned-{learner_engine}"
    loaded = worker.call("load_adapter", {"name": name, "path": step["adapter_dir"], "digest": step["adapter_digest"]})
    assert loaded["adapter_digest"] == step["adapter_digest"]
    for t, theirs in learned.items():
        ours = worker.call("score", {"items": items(reqs, out, t), "adapter": name})
        assert ours["adapter_digest"] == step["adapter_digest"]
        base = worker.call("score", {"items": items(reqs, out, t), "adapter": "base"})["outputs"]
        vllm_lp, learner_lp = [o["logprobs"] for o in ours["outputs"]], [o["logprobs"] for o in theirs]
        moved = max_diff([o["logprobs"] for o in base], learner_lp)
        diff = max_diff(vllm_lp, learner_lp)
        exact = sum(int(np.sum(a.view(np.int32) == b.view(np.int32))) for a, b in zip(vllm_lp, learner_lp,
                                                                                     strict=True))
        print(f"measured: {learner_engine} learner's adapter in vLLM vs in the learner, T={t}: "
              f"{exact}/{sum(a.size for a in vllm_lp)} bit-identical, max |diff| {diff:.3g} "
              f"(the adapter moved the learner's log-probs by up to {moved:.3g})")
        assert moved > 100 * LEARNER_ADAPTER_TOLERANCE, "the step must change the model for the check to mean much"
        assert diff <= LEARNER_ADAPTER_TOLERANCE, f"T={t}: max |diff| {diff:.3g}"


# -- bad input ------------------------------------------------------------------------------------------------------


def test_missing_model_folder_and_digest_mismatch(worker: WorkerClient, load_params: dict[str, Any],
                                                  problems: list[Problem], tmp_path: Path) -> None:
    message = error_of(worker, "load_model", {**load_params, "model_dir": str(tmp_path / "absent")})
    assert "does not exist" in message
    message = error_of(worker, "load_model", {**load_params, "model_digest": "0" * 64})
    assert "expected 0000000000000000" in message
    still_serves(worker, problems)


def test_another_model_needs_another_worker(worker: WorkerClient, adapters: Any, load_params: dict[str, Any],
                                            problems: list[Problem]) -> None:
    message = error_of(worker, "load_model", {**load_params, "model_dir": str(adapters.a), "model_digest": None})
    assert "start a new worker" in message
    still_serves(worker, problems)


def test_unknown_method(worker: WorkerClient, problems: list[Problem]) -> None:
    answer = worker.ask("learner_step", {})
    assert answer.report.error is not None
    assert answer.report.error.type == "UnknownMethod"
    still_serves(worker, problems)


def test_prompt_ids_outside_the_vocabulary_or_ill_typed(worker: WorkerClient, problems: list[Problem],
                                                        vocab: ModelTokenizer) -> None:
    """The worker runs the core's prompt ids as given: ids of another tokenizer, or no list of ids, are refused."""
    one = requests(["12+3="])[0]
    for bad in (vocab.size, -1):
        message = error_of(worker, "generate", {"requests": [{**one, "prompt_ids": [1, bad, 5]}]})
        assert (f"generate.requests[0].prompt_ids: token id {bad} is outside the model's vocabulary "
                f"[0, {vocab.size})") in message, message
    item = {"item_id": "x", "prompt": "12+3=", "prompt_ids": [1, 99], "response_tokens": np.array([5], np.int32),
            "temperature": 1.0}
    assert "score.items[0].prompt_ids: token id 99 is outside" in error_of(worker, "score", {"items": [item]})
    message = error_of(worker, "generate", {"requests": [{k: v for k, v in one.items() if k != "prompt_ids"}]})
    assert "generate.requests[0]: missing field 'prompt_ids'" in message
    message = error_of(worker, "generate", {"requests": [{**one, "prompt_ids": "12+3="}]})
    assert "generate.requests[0].prompt_ids: expected list, got str" in message
    for ids in ([], [True, False]):
        message = error_of(worker, "generate", {"requests": [{**one, "prompt_ids": ids}]})
        assert "generate.requests[0].prompt_ids: expected a non-empty list of token ids" in message
    still_serves(worker, problems)


def test_corrupt_adapter(worker: WorkerClient, adapters: Any, problems: list[Problem]) -> None:
    message = error_of(worker, "load_adapter", {"name": "broken", "path": str(adapters.corrupt), "digest": None})
    assert "the adapter is corrupt" in message
    still_serves(worker, problems)


def test_adapter_for_another_base_model(worker: WorkerClient, adapters: Any, problems: list[Problem]) -> None:
    message = error_of(worker, "load_adapter", {"name": "alien", "path": str(adapters.other_base), "digest": None})
    assert "for another base model" in message
    still_serves(worker, problems)


def test_adapter_digest_mismatch_and_unknown_adapter(worker: WorkerClient, adapters: Any,
                                                     problems: list[Problem]) -> None:
    message = error_of(worker, "load_adapter", {"name": "x", "path": str(adapters.a), "digest": "f" * 64})
    assert "the files differ" in message
    message = error_of(worker, "generate", {"requests": requests(["1+1="]), "adapter": "never-loaded"})
    assert "is not loaded" in message
    still_serves(worker, problems)


def test_request_longer_than_the_engine_maximum(worker: WorkerClient, problems: list[Problem]) -> None:
    long_prompt = "1+" * 60 + "1="  # 123 tokens with BOS
    message = error_of(worker, "generate", {"requests": requests([long_prompt], max_tokens=10)})
    assert "exceed the engine's maximum length 128" in message
    item = {"item_id": "x", "prompt": long_prompt, "prompt_ids": TOK.prompt_ids(prompt=long_prompt),
            "response_tokens": np.full(10, 5, dtype=np.int32),
            "temperature": 1.0, "vocab_steps": []}
    message = error_of(worker, "score", {"items": [item]})
    assert "maximum length 128" in message
    still_serves(worker, problems)


def test_top_p_below_one_is_refused(worker: WorkerClient, problems: list[Problem]) -> None:
    reqs = requests(["1+1="])
    reqs[0]["top_p"] = 0.9
    message = error_of(worker, "generate", {"requests": reqs})
    assert "send top_p 1.0" in message
    still_serves(worker, problems)
