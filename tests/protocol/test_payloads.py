"""The typed payloads of every engine method: each struct writes exactly the map that travelled before it (same
digest), reads back what it wrote, and refuses a malformed map with one message naming the field."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest

from invar import canonical
from invar.errors import ProtocolError
from invar.protocol import MethodError
from invar.protocol.payloads import (
    AdapterRef,
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
    GenerateResult,
    LearnerObjective,
    LearnerOptimizer,
    LearnerSample,
    LearnerStepParams,
    LearnerStepResult,
    LoadAdapterParams,
    LoadAdapterResult,
    LoadModelParams,
    LoadModelResult,
    LoraParams,
    PayloadError,
    Schedule,
    ScoreItem,
    ScoreOutput,
    ScoreParams,
    ScoreResult,
)

DIGEST = "ab" * 32


def _request(**changes: Any) -> GenerateRequest:
    return GenerateRequest(**{"request_id": "u1", "prompt": "1+1=", "prompt_ids": [5, 6, 7], "seed": 3,
                              "temperature": 1, "top_p": 1.0, "max_tokens": 4, **changes})


def test_generate_params_write_the_map_the_core_built_by_hand() -> None:
    # The dict every builder wrote before the struct (contract/plan.py, loop/cycle.py, runner/evaluate.py,
    # cli/infer.py): an integer temperature stays an integer, the prompt label travels, the layout is as given.
    by_hand = {"requests": [{"request_id": "u1", "prompt": "1+1=", "prompt_ids": [5, 6, 7], "seed": 3,
                             "temperature": 1, "top_p": 1.0, "max_tokens": 4}],
               "layout": [[0]], "adapter": None, "reference_adapter": None}
    typed = GenerateParams([_request()], [[0]], None, None).to_wire()
    assert canonical.encode(typed) == canonical.encode(by_hand)
    assert canonical.digest(GenerateParams([_request(temperature=1.0)], [[0]]).to_wire()) != canonical.digest(by_hand)


def test_score_and_load_params_write_the_map_the_core_built_by_hand() -> None:
    tokens = np.array([4, 5, 2], dtype=np.int32)
    by_hand = {"items": [{"item_id": "u1", "prompt": "p", "prompt_ids": [1, 2], "response_tokens": tokens,
                          "temperature": 1.0, "vocab_steps": [0, 2]}], "adapter": None}
    typed = ScoreParams([ScoreItem("u1", [1, 2], tokens, 1.0, [0, 2], prompt="p")]).to_wire()
    assert canonical.encode(typed) == canonical.encode(by_hand)
    load = {"model_dir": "/m", "model_digest": DIGEST, "dtype": "float32", "quantization": "none",
            "adapter": {"path": "/a", "digest": DIGEST, "resume": True}}
    assert LoadModelParams("/m", DIGEST, "float32", "none", AdapterRef("/a", DIGEST, True)).to_wire() == load
    assert LoadModelParams("/m", DIGEST).to_wire() == {**load, "adapter": None}
    assert "resume" not in AdapterRef("/a", DIGEST).to_wire()
    assert LoadAdapterParams("policy", "/a", DIGEST).to_wire() == {"name": "policy", "path": "/a", "digest": DIGEST}


def _output(**changes: Any) -> GenerateOutput:
    return GenerateOutput(**{"request_id": "u1", "prompt_tokens": np.array([5, 6, 7], np.int32),
                             "tokens": np.array([9, 2], np.int32), "logprobs": np.array([-0.5, -0.25], np.float32),
                             "finish_reason": "stop", **changes})


REDUCTIONS = ("float64-sequence", "float32-microbatch")


def _sample(**changes: Any) -> LearnerSample:
    return LearnerSample(**{"prompt": "1+1=", "prompt_ids": [5, 6, 7], "tokens": np.array([9, 2], np.int32),
                            "behavior_logprobs": np.array([-0.5, -0.25], np.float32), "advantage": 1.0, **changes})


def _step(**changes: Any) -> LearnerStepParams:
    return LearnerStepParams(**{
        "samples": [_sample(), _sample(advantage=-1.0, reference_logprobs=np.array([-1.0, -2.0], np.float32))],
        "temperature": 1.0, "objective": LearnerObjective(0.2, 0.28, 0.0, "truncate", 2.0),
        "optimizer": LearnerOptimizer(1e-3, (0.9, 0.999), 1e-8, 0.0, 1.0),
        "lora": LoraParams(8, 16.0, ["q_proj", "v_proj"]), "seed": 7, "save_dir": "/run/cycle-000000", **changes})


def _learner_result(**changes: Any) -> LearnerStepResult:
    return LearnerStepResult(**{
        "proximal_logprobs": [np.array([-0.5, -0.25], np.float32), np.array([-1.0], np.float32)],
        "loss": 0.125, "policy": 0.125, "kl": 0.0, "importance_weight_mean": 1.0, "tokens": 3, "grad_norm": 0.5,
        "adapter_dir": "/run/cycle-000000", "adapter_digest": DIGEST,
        "adapter_tensors": {"base_model.model.q_proj.lora_A.weight": {"shape": [8, 576], "dtype": "float32"}},
        "start_adapter_digest": None, "optimizer_steps": 1, "model_digest": DIGEST, **changes})


def test_learner_step_params_write_the_map_the_core_built_by_hand() -> None:
    # The dict loop/cycle.learner_params and runner/train.learner_step_params wrote before the struct.
    tokens, behavior = np.array([9, 2], np.int32), np.array([-0.5, -0.25], np.float32)
    reference = np.array([-1.0, -2.0], np.float32)
    by_hand: dict[str, Any] = {
        "samples": [{"prompt": "1+1=", "prompt_ids": [5, 6, 7], "tokens": tokens, "behavior_logprobs": behavior,
                     "advantage": 1.0},
                    {"prompt": "1+1=", "prompt_ids": [5, 6, 7], "tokens": tokens, "behavior_logprobs": behavior,
                     "advantage": -1.0, "reference_logprobs": reference}],
        "temperature": 1.0,
        "objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "importance": "truncate",
                      "importance_cap": 2.0},
        "optimizer": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0},
        "lora": {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}, "seed": 7,
        "save_dir": "/run/cycle-000000"}
    assert canonical.encode(_step().to_wire()) == canonical.encode(by_hand)
    # A schedule travels only when the configuration names one, so a call without it keeps its bytes.
    assert "schedule" not in _step().to_wire()
    scheduled = {**by_hand, "schedule": {"micro_batch": None, "reduction": "float64-sequence"}}
    assert canonical.encode(_step(schedule=Schedule(None, "float64-sequence")).to_wire()) == \
        canonical.encode(scheduled)
    # What the core sent is what a learner reads back, the arrays as they travelled.
    wire = canonical.decode(canonical.encode(scheduled))
    step = LearnerStepParams.from_wire(wire, reductions=REDUCTIONS)
    assert canonical.encode(step.to_wire()) == canonical.encode(wire)
    assert step.samples[0].tokens.dtype == np.int32
    assert step.samples[1].reference_logprobs is not None
    assert step.samples[0].reference_logprobs is None
    assert step.schedule is not None
    assert step.schedule.split(2) == (2, "float64-sequence")
    assert Schedule(4, "float32-microbatch").split(2) == (2, "float32-microbatch")
    assert Schedule(1, "float32-microbatch").split(2) == (1, "float32-microbatch")


def test_a_learner_step_takes_its_defaults() -> None:
    wire = {"samples": [_sample().to_wire()], "temperature": 0.7, "objective": {"clip_low": 0.2, "clip_high": 0.28},
            "optimizer": {"lr": 1e-3}, "lora": None, "save_dir": "/out"}
    step = LearnerStepParams.from_wire(wire, reductions=REDUCTIONS)
    assert step.objective == LearnerObjective(0.2, 0.28)
    assert step.optimizer == LearnerOptimizer(1e-3)
    assert (step.lora, step.seed, step.schedule) == (None, 0, None)
    assert LearnerStepParams.from_wire({**wire, "schedule": {"micro_batch": 2}},
                                       reductions=REDUCTIONS).schedule == Schedule(2, "float64-sequence")


def test_results_read_back_to_the_same_bytes() -> None:
    results: list[tuple[Any, Any]] = [
        (GenerateResult, GenerateResult([_output(), _output(request_id="u2", reference_logprobs=np.zeros(2, np.float32),
                                                            attempts=2)], DIGEST, None, {"matmul": 3})),
        (ScoreResult, ScoreResult([ScoreOutput("u1", np.array([-1.0], np.float32), np.zeros((1, 7), np.float32))],
                                  DIGEST, DIGEST)),
        (LoadModelResult, LoadModelResult(DIGEST, None, 18, 2, 64, optimizer_steps=3)),
        (LoadAdapterResult, LoadAdapterResult("policy", DIGEST)),
        (LearnerStepResult, _learner_result()),
        (LearnerStepResult, _learner_result(start_adapter_digest=DIGEST, tokens=3, loss=0)),
    ]
    for kind, result in results:
        wire = canonical.decode(canonical.encode(result.to_wire()))
        assert canonical.encode(kind.from_wire(wire).to_wire()) == canonical.encode(wire)
    # The optional fields are written only when given: the maps of workers without them do not move.
    assert set(_output().to_wire()) == {"request_id", "prompt_tokens", "tokens", "logprobs", "finish_reason"}
    assert "optimizer_steps" not in LoadModelResult(DIGEST, None, 18, 2, 64).to_wire()
    assert "patch_calls" not in GenerateResult([_output()], DIGEST, None).to_wire()


def test_params_read_what_the_core_writes() -> None:
    call = GenerateParams.from_wire(GenerateParams([_request(), _request(request_id="u2")], [[1], [0]]).to_wire())
    assert call.batches == [[1], [0]]
    assert [r.request_id for r in call.requests] == ["u1", "u2"]
    assert call.requests[0].prompt == "1+1="
    assert GenerateParams.from_wire({"requests": [_request().to_wire()]}).batches == [[0]]
    sent = ScoreParams([ScoreItem("u1", [1], np.array([3, 4], np.int32), 2.0)]).to_wire()
    item = ScoreParams.from_wire(sent).items[0]
    assert item.tokens.dtype == np.int64  # what an engine indexes with
    assert item.response_tokens.dtype == np.int32  # what travelled
    assert list(item.vocab_steps) == []


def _learn(change: dict[str, Any]) -> LearnerStepParams:
    """A learner's reading of the core's call with `change` made to it."""
    return LearnerStepParams.from_wire({**_step().to_wire(), **change}, reductions=REDUCTIONS)


@pytest.mark.parametrize(("read", "wire", "message"), [
    (GenerateParams.from_wire, {"requests": []}, "generate.requests: empty; send at least one request"),
    (GenerateParams.from_wire, {"requests": [{**_request().to_wire(), "seed": True}]},
     "generate.requests[0].seed: expected int, got bool"),
    (GenerateParams.from_wire, {"requests": [_request().to_wire(), _request().to_wire()]},
     "generate.requests[1].request_id: 'u1' is used twice"),
    (GenerateParams.from_wire, {"requests": [_request().to_wire()], "layout": [[0, 0]]},
     "generate.layout: must name every request index 0..0 exactly once"),
    (GenerateParams.from_wire, {"requests": [_request().to_wire()], "adapter": 5},
     "generate.adapter: expected an adapter name or null"),
    (ScoreParams.from_wire, {"items": [{"item_id": "a", "prompt_ids": [1], "response_tokens": np.array([1, 2]),
                                        "temperature": 1.0, "vocab_steps": [2]}]},
     "score.items[0].vocab_steps: must be indices into response_tokens (0..1)"),
    (LoadModelParams.from_wire, {"model_dir": "/m", "adapter": {"path": "/a", "rank": 2}},
     "load_model.adapter: unknown field 'rank'"),
    (LoadAdapterParams.from_wire, {"name": "base", "path": "/a"}, "load_adapter.name: expected 1-64 characters"),
    (GenerateResult.from_wire, {"outputs": [_output().to_wire()]}, "generate: missing field 'model_digest'"),
    (GenerateResult.from_wire, {"outputs": [_output(tokens=np.array([9, 2], np.int64)).to_wire()],
                                "model_digest": DIGEST}, "generate: output 0 (u1): tokens are not an int32 vector"),
    (GenerateResult.from_wire, {"outputs": [{**_output().to_wire(), "finish_reason": "abort"}],
                                "model_digest": DIGEST}, "finish_reason 'abort' is neither stop nor length"),
    (GenerateResult.from_wire, {"outputs": [_output(logprobs=np.zeros(3, np.float32)).to_wire()],
                                "model_digest": DIGEST}, "logprobs are not a float32 vector as long as tokens"),
    (ScoreResult.from_wire, {"outputs": [{"item_id": "a", "logprobs": np.zeros(2, np.float32),
                                          "vocab_logprobs": np.zeros(3, np.float32)}], "model_digest": DIGEST},
     "score: output 0 (a): vocab_logprobs are not a float32 matrix"),
    (LoadModelResult.from_wire, {"model_digest": DIGEST, "vocab_size": 18, "eos_token_id": 2, "max_model_len": "x"},
     "load_model result.max_model_len: expected an integer or null"),
    (_learn, {"samples": []}, "learner_step.samples: expected a non-empty list of samples"),
    (_learn, {"samples": [_sample(tokens=np.array([1.0, 2.0])).to_wire()]},
     "learner_step.samples[0].tokens: expected a non-empty 1-D integer array"),
    (_learn, {"samples": [_sample().to_wire(), _sample(behavior_logprobs=np.zeros(3, np.float32)).to_wire()]},
     "learner_step.samples[1].behavior_logprobs: expected a float32 array of 2 log-probabilities (one per token)"),
    (_learn, {"samples": [_sample(reference_logprobs=np.array([-1.0, 0.5], np.float32)).to_wire()]},
     "learner_step.samples[0].reference_logprobs: log-probabilities must be finite and ≤ 0"),
    (_learn, {"temperature": 0}, "learner_step.temperature: must be > 0"),
    (_learn, {"objective": {"clip_low": 0.2, "clip_high": 0.28, "importance": "truncate"}},
     "learner_step.objective.importance_cap: give a cap exactly when importance is truncate or mask"),
    (_learn, {"objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.1}},
     "learner_step: objective.kl_coef is not 0, so every sample needs reference_logprobs"),
    (_learn, {"optimizer": {"lr": 1e-3, "betas": [0.9, 1.0]}},
     "learner_step.optimizer.betas: expected two numbers in [0, 1)"),
    (_learn, {"optimizer": "adamw"}, "learner_step.optimizer: expected a map"),
    (_learn, {"lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj"]}},
     "learner_step.lora.dropout: must be 0"),
    (_learn, {"lora": {"r": True, "alpha": 8, "target_modules": ["q_proj"]}},
     "learner_step.lora.r: expected an integer"),
    (_learn, {"seed": -1}, "learner_step.seed: expected an integer in [0, 2**63)"),
    (_learn, {"save_dir": ""}, "learner_step.save_dir: expected the folder to write the updated adapter to"),
    (_learn, {"schedule": {"micro_batch": 0, "reduction": "float64-sequence"}},
     "learner_step.schedule.micro_batch: 0; expected an integer ≥ 1, or null for the whole batch"),
    (_learn, {"schedule": {"micro_batch": 2, "reduction": "float32-sequence"}},
     "learner_step.schedule.reduction: 'float32-sequence'; choose one of ['float64-sequence', 'float32-microbatch']"),
    (_learn, {"schedule": {"size": 2}}, "learner_step.schedule: expected a map with micro_batch"),
    (LearnerStepResult.from_wire, {**_learner_result().to_wire(), "loss": float("nan")},
     "learner_step: loss must be a finite number, got nan"),
    (LearnerStepResult.from_wire, {**_learner_result().to_wire(), "proximal_logprobs": [np.zeros(2)]},
     "learner_step.proximal_logprobs[0]: expected a float32 vector of log-probabilities"),
    (LearnerStepResult.from_wire, {k: v for k, v in _learner_result().to_wire().items() if k != "adapter_digest"},
     "learner_step: missing field 'adapter_digest'"),
    (LearnerStepResult.from_wire, {**_learner_result().to_wire(), "tokens": 3.0},
     "learner_step.tokens: expected int, got float"),
])
def test_a_malformed_map_is_one_error_naming_the_field(read: Any, wire: dict[str, Any], message: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(message)) as caught:
        read(wire)
    # A worker answers it as a bad request; the core reads it as a protocol error of the evidence.
    assert isinstance(caught.value, MethodError)
    assert isinstance(caught.value, ProtocolError)


def test_an_engine_refuses_a_dtype_it_does_not_run() -> None:
    params = LoadModelParams.from_wire({"model_dir": "/m", "dtype": "bfloat16"})
    assert params.require(("float32", "bfloat16"), ("none",)) is params
    with pytest.raises(PayloadError, match=r"load_model\.dtype: 'bfloat16' is not supported by this engine"):
        params.require(("float32",), ("none",))


def _one_by_one(wire: dict[str, Any]) -> Any:
    """`LearnerStepParams.from_wire`'s samples read one at a time, each checking its own values: what the batch's
    joint check must agree with (the samples read, or the message of the first bad field)."""
    try:
        return tuple(LearnerSample.from_wire(s, f"learner_step.samples[{i}]") for i, s in enumerate(wire["samples"]))
    except PayloadError as exc:
        return str(exc)


_NAN = np.array([-1.0, np.nan], np.float32)


@pytest.mark.parametrize("faults", [
    {},
    {3: {"behavior_logprobs": _NAN}},
    {3: {"behavior_logprobs": np.array([-1.0, 0.5], np.float32)}, 5: {"advantage": float("inf")}},
    {5: {"behavior_logprobs": np.array([-1.0, np.inf], np.float32)}, 3: {"advantage": float("nan")}},
    {2: {"reference_logprobs": _NAN}, 4: {"tokens": np.zeros(0, np.int32)}},
    {4: {"prompt_ids": [5, True]}},
    {1: {"prompt_ids": [5, 2**64]}},  # an integer, if not one a token can be: read as before
    {6: {"behavior_logprobs": np.array([-1.0, -0.0], np.float32)}},  # -0 is ≤ 0: read
])
def test_a_batchs_values_checked_at_once_read_as_sample_by_sample(faults: dict[int, dict[str, Any]]) -> None:
    samples = [_sample(advantage=float(i), reference_logprobs=np.array([-1.0, -2.0], np.float32) if i % 2 else None)
               for i in range(8)]
    wire = _step(samples=samples).to_wire()
    for i, change in faults.items():
        wire["samples"][i] = {**wire["samples"][i], **change}
    expected = _one_by_one(wire)
    try:
        got: Any = LearnerStepParams.from_wire(wire, reductions=REDUCTIONS).samples
    except PayloadError as exc:
        got = str(exc)
    if isinstance(expected, str):
        assert got == expected
        assert f"samples[{min(faults)}]" in got  # the first bad sample, whichever field comes first
    else:
        assert len(got) == len(expected) == 8
        for a, b in zip(got, expected, strict=True):
            assert a.tokens is b.tokens  # the arrays as received
            assert a.behavior_logprobs is b.behavior_logprobs
            assert (a.prompt_ids, a.advantage, a.prompt) == (b.prompt_ids, b.advantage, b.prompt)
            assert a.reference_logprobs is b.reference_logprobs


def _batch_step(**changes: Any) -> LearnerStepParams:
    samples = [_sample(prompt_ids=[5, 6, 7][: 1 + i % 3], tokens=np.array([9, 2, 4][: 1 + i % 2], np.int32),
                       behavior_logprobs=np.array([-0.5, -0.25, -1][: 1 + i % 2], np.float32), advantage=i / 3,
                       reference_logprobs=np.array([-1.0, -2.0, -3][: 1 + i % 2], np.float32))
               for i in range(5)]
    return _step(samples=samples, packed=True, **changes)


def test_a_batch_travels_as_columns_and_reads_back_to_the_same_samples_and_bytes() -> None:
    step = _batch_step()
    wire = step.to_wire()
    assert "samples" not in wire
    assert sorted(wire["batch"]) == ["advantages", "behavior_logprobs", "lengths", "prompt_ids", "prompt_lengths",
                                     "prompts", "reference_logprobs", "tokens"]
    assert wire["batch"]["tokens"].tolist() == [9, 9, 2, 9, 9, 2, 9]
    assert wire["batch"]["lengths"].tolist() == [1, 2, 1, 2, 1]
    assert wire["batch"]["prompt_ids"].tolist() == [5, 5, 6, 5, 6, 7, 5, 5, 6]
    data = canonical.encode(wire)
    read = LearnerStepParams.from_wire(canonical.decode(data), reductions=REDUCTIONS)
    assert read.packed
    assert canonical.encode(read.to_wire()) == data  # what a learner holds re-encodes to the bytes it read
    # The same samples as the list of maps gives them, field by field.
    listed = LearnerStepParams.from_wire(canonical.decode(canonical.encode(_step(samples=step.samples).to_wire())),
                                         reductions=REDUCTIONS)
    assert not listed.packed
    for a, b in zip(read.samples, listed.samples, strict=True):
        assert (a.prompt, a.prompt_ids, a.advantage) == (b.prompt, b.prompt_ids, b.advantage)
        assert type(a.advantage) is float
        assert all(x is not None and y is not None and x.dtype == y.dtype and x.tobytes() == y.tobytes()
                   for x, y in ((a.tokens, b.tokens), (a.behavior_logprobs, b.behavior_logprobs),
                                (a.reference_logprobs, b.reference_logprobs)))
    # Without references or prompt texts, the columns leave them out, as the maps do.
    bare = _step(samples=[_sample(prompt=None)], packed=True).to_wire()["batch"]
    assert "prompts" not in bare
    assert "reference_logprobs" not in bare
    one = LearnerStepParams.from_wire(canonical.decode(canonical.encode(_step(
        samples=[_sample(prompt=None)], packed=True).to_wire())), reductions=REDUCTIONS).samples[0]
    assert (one.prompt, one.reference_logprobs) == (None, None)


def test_a_batch_of_mixed_samples_does_not_travel_as_columns() -> None:
    with pytest.raises(ValueError, match="same fields and token dtype"):
        _step(packed=True).to_wire()  # one sample with a reference, one without


def test_a_learner_answers_in_the_layout_asked() -> None:
    result = _learner_result(packed=True)
    wire = result.to_wire()
    assert "proximal_logprobs" not in wire
    assert wire["proximal_batch"]["lengths"].tolist() == [2, 1]
    data = canonical.encode(wire)
    read = LearnerStepResult.from_wire(canonical.decode(data))
    assert read.packed
    assert [p.tolist() for p in read.proximal_logprobs] == [[-0.5, -0.25], [-1.0]]
    assert canonical.encode(read.to_wire()) == data


def _read_step(wire: dict[str, Any]) -> LearnerStepParams:
    return LearnerStepParams.from_wire(wire, reductions=REDUCTIONS)


def _batch(change: dict[str, Any], drop: str | None = None) -> dict[str, Any]:
    wire = _batch_step().to_wire()
    batch = {k: v for k, v in {**wire["batch"], **change}.items() if k != drop}
    return {**wire, "batch": batch}


@pytest.mark.parametrize(("read", "wire", "message"), [
    (_learn, {"batch": _batch({})["batch"]}, "learner_step: both samples and batch; send the samples one way"),
    (_learn, {"samples": None, "batch": []}, "learner_step.batch: expected a map"),
    (_read_step, _batch({"lengths": np.zeros(0, np.int64), "advantages": np.zeros(0)}),
     "learner_step.batch.lengths: empty; send at least one sample"),
    (_read_step, _batch({"lengths": np.array([1, 2, 1, 2, 1], np.int32)}),
     "learner_step.batch.lengths: expected an int64 vector of lengths, each ≥ 1"),
    (_read_step,
     _batch({"lengths": np.array([1, 2, 1, 2, 0], np.int64)}),
     "learner_step.batch.lengths: expected an int64 vector of lengths, each ≥ 1"),
    (_read_step,
     _batch({"lengths": np.array([1, 2, 1, 2, 2], np.int64)}),
     "learner_step.batch.tokens: expected a 1-D integer array of the lengths' sum (8)"),
    (_read_step,
     _batch({"prompt_lengths": np.array([1, 2, 3], np.int64)}),
     "learner_step.batch.prompt_lengths: expected an int64 vector of 5 lengths, each ≥ 1"),
    (_read_step,
     _batch({"prompt_ids": np.arange(9, dtype=np.int32)}),
     "learner_step.batch.prompt_ids: expected an int64 vector of the prompt lengths' sum (9)"),
    (_read_step,
     _batch({"behavior_logprobs": np.array([-1, -1, 0.5, -1, -1, -1, -1], np.float32)}),
     "learner_step.batch.behavior_logprobs: log-probabilities must be finite and ≤ 0"),
    (_read_step, _batch({}, drop="behavior_logprobs"),
     "learner_step.batch.behavior_logprobs: expected a float32 array of 7 log-probabilities"),
    (_read_step,
     _batch({"reference_logprobs": np.full(7, np.nan, np.float32)}),
     "learner_step.batch.reference_logprobs: log-probabilities must be finite and ≤ 0"),
    (_read_step,
     _batch({"advantages": np.array([0, 1, np.inf, 0, 0])}),
     "learner_step.batch.advantages: expected a float64 vector of 5 finite advantages"),
    (_read_step, _batch({"prompts": ["1+1="] * 4}),
     "learner_step.batch.prompts: expected a list of 5 prompt texts or none"),
    (_read_step,
     {**_batch({}, drop="reference_logprobs"), "objective": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.1}},
     "learner_step: objective.kl_coef is not 0, so every sample needs reference_logprobs"),
    (LearnerStepResult.from_wire, {**_learner_result(packed=True).to_wire(),
                                   "proximal_batch": {"lengths": np.array([2, 2], np.int64),
                                                      "logprobs": np.zeros(3, np.float32)}},
     "learner_step.proximal_batch.logprobs: expected a float32 vector of the lengths' sum (4)"),
    (LearnerStepResult.from_wire, {**_learner_result(packed=True).to_wire(), "proximal_batch": {"lengths": [2, 1]}},
     "learner_step.proximal_batch.lengths: expected an int64 vector of lengths, each ≥ 0"),
])
def test_a_malformed_batch_is_one_error_naming_the_field(read: Any, wire: dict[str, Any], message: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(message)):
        read(wire)


def _outputs(**changes: Any) -> list[GenerateOutput]:
    return [_output(request_id=f"u{i}", prompt_tokens=np.arange(1 + i % 3, dtype=np.int32),
                    tokens=np.arange(i % 3, dtype=np.int32), logprobs=-np.arange(i % 3, dtype=np.float32),
                    finish_reason="length" if i % 2 else "stop", **changes) for i in range(5)]


def test_outputs_travel_as_columns_when_asked_and_read_back_to_the_same_outputs_and_bytes() -> None:
    assert "packed" not in GenerateParams([_request()], None).to_wire()  # an evaluation's call: the bytes as before
    call = GenerateParams.from_wire(GenerateParams([_request()], None, packed=True).to_wire())
    assert call.packed
    top = {"top_ids": np.zeros((2, 3), np.int32), "top_logprobs": np.full((2, 3), -1, np.float32)}
    for outputs in (_outputs(), _outputs(attempts=1), [_output(**top), _output(request_id="u2", **top)],
                    _outputs(reference_logprobs=None)):
        if outputs[0].top_ids is None:
            outputs = [dataclasses.replace(o, reference_logprobs=o.logprobs * 2) for o in outputs]
        listed = GenerateResult(outputs, DIGEST, None, {"matmul": 3})
        wire = dataclasses.replace(listed, packed=True).to_wire()
        assert "outputs" not in wire
        data = canonical.encode(wire)
        read = GenerateResult.from_wire(canonical.decode(data))
        assert read.packed
        assert canonical.encode(read.to_wire()) == data
        again = GenerateResult.from_wire(canonical.decode(canonical.encode(listed.to_wire())))
        assert not again.packed
        for a, b in zip(read.outputs, again.outputs, strict=True):
            assert canonical.encode(a.to_wire()) == canonical.encode(b.to_wire())
    batch = dataclasses.replace(GenerateResult(_outputs(), DIGEST, None), packed=True).to_wire()["outputs_batch"]
    assert batch["lengths"].tolist() == [0, 1, 2, 0, 1]
    assert batch["request_ids"] == ["u0", "u1", "u2", "u3", "u4"]
    assert sorted(batch) == ["finish_reasons", "lengths", "logprobs", "prompt_lengths", "prompt_tokens",
                             "request_ids", "tokens"]


def test_outputs_of_different_fields_travel_as_a_list_even_when_asked() -> None:
    for outputs in ([_output(), _output(request_id="u2", attempts=2)],
                    [_output(), _output(request_id="u2", prompt_tokens=np.array([1], np.int64))],
                    [_output(top_ids=np.zeros((2, 1), np.int32), top_logprobs=np.zeros((2, 1), np.float32)),
                     _output(request_id="u2", top_ids=np.zeros((2, 2), np.int32),
                             top_logprobs=np.zeros((2, 2), np.float32))],
                    []):
        wire = GenerateResult(outputs, DIGEST, None, packed=True).to_wire()
        assert "outputs_batch" not in wire
        assert canonical.encode(wire) == canonical.encode(GenerateResult(outputs, DIGEST, None).to_wire())


def _outputs_batch(change: dict[str, Any], drop: str | None = None) -> dict[str, Any]:
    wire = GenerateResult(_outputs(), DIGEST, None, packed=True).to_wire()
    return {**wire, "outputs_batch": {k: v for k, v in {**wire["outputs_batch"], **change}.items() if k != drop}}


@pytest.mark.parametrize(("wire", "message"), [
    ({**_outputs_batch({}), "outputs": []}, "generate: both outputs and outputs_batch"),
    (_outputs_batch({"request_ids": []}), "generate.outputs_batch.request_ids: expected a non-empty list"),
    (_outputs_batch({"finish_reasons": ["stop"] * 4 + ["abort"]}),
     "generate.outputs_batch.finish_reasons: expected 5, each stop or length"),
    (_outputs_batch({"lengths": np.array([0, 1, 2, 0, 2], np.int64)}),
     "generate.outputs_batch.tokens: expected an int32 vector of the lengths' sum (5)"),
    (_outputs_batch({"lengths": np.array([0, 1, 2, 0, 1], np.int32)}),
     "generate.outputs_batch.lengths: expected an int64 vector of 5 lengths, each ≥ 0"),
    (_outputs_batch({"logprobs": np.zeros(4, np.float64)}),
     "generate.outputs_batch.logprobs: expected a float32 vector as long as tokens"),
    (_outputs_batch({"reference_logprobs": np.zeros(3, np.float32)}),
     "generate.outputs_batch.reference_logprobs: expected a float32 vector as long as tokens"),
    (_outputs_batch({"prompt_tokens": np.zeros(8, np.int32)}),
     "generate.outputs_batch.prompt_tokens: 8 ids for prompt lengths summing to 9"),
    (_outputs_batch({"attempts": np.ones(5, np.int32)}),
     "generate.outputs_batch.attempts: expected an int64 vector of 5 counts"),
    (_outputs_batch({"top_ids": np.zeros((4, 2), np.int32)}),
     "generate.outputs_batch: top_ids and top_logprobs come together or not at all"),
    ({"requests": [_request().to_wire()], "packed": False}, "generate.packed: expected true"),
])
def test_malformed_outputs_as_columns_are_one_error_naming_the_field(wire: dict[str, Any], message: str) -> None:
    read = GenerateParams.from_wire if "requests" in wire else GenerateResult.from_wire
    with pytest.raises(PayloadError, match=re.escape(message)):
        read(wire)
