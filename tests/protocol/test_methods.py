"""The method table (`invar.protocol.methods`): a method's name and its structs as one value, on both sides of the
wire, writing the bytes the hand-built maps were."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from invar import canonical
from invar.errors import EvidenceError
from invar.protocol import MethodError, Role
from invar.protocol.methods import GENERATE, LEARNER_STEP, LOAD_ADAPTER, LOAD_MODEL, METHODS, SCORE, Method, serves
from invar.protocol.payloads import (
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
    GenerateResult,
    LearnerStepParams,
    LearnerStepResult,
    LoadAdapterParams,
    LoadAdapterResult,
    LoadModelParams,
    LoadModelResult,
    PayloadError,
    ScoreParams,
    ScoreResult,
)
from invar.transport import WorkerClient

CALL = {"requests": [{"request_id": "u-0", "prompt": "1+2=", "prompt_ids": [1, 5, 9], "seed": 7, "temperature": 1,
                      "top_p": 1.0, "max_tokens": 4},
                     {"request_id": "u-1", "prompt_ids": [1, 6], "seed": 8, "temperature": 0.5, "top_p": 0.9,
                      "max_tokens": 2}],
        "layout": [[1], [0]], "adapter": None, "reference_adapter": None}
"""A generate call's params as the core writes them by hand (an integer temperature among them)."""


def _answer(call: GenerateParams) -> GenerateResult:
    return GenerateResult([GenerateOutput(r.request_id, np.array(r.prompt_ids, dtype=np.int32),
                                          np.array([3, 2], dtype=np.int32), np.array([-0.5, -0.25], dtype=np.float32),
                                          "stop") for r in call.requests], "d" * 64, None)


def test_the_table_names_every_engine_method_with_its_structs() -> None:
    assert {name: (m.params, m.result) for name, m in METHODS.items()} == {
        "load_model": (LoadModelParams, LoadModelResult), "load_adapter": (LoadAdapterParams, LoadAdapterResult),
        "generate": (GenerateParams, GenerateResult), "score": (ScoreParams, ScoreResult),
        "learner_step": (LearnerStepParams, LearnerStepResult)}
    assert [m.name for m in (LOAD_MODEL, LOAD_ADAPTER, GENERATE, SCORE, LEARNER_STEP)] == list(METHODS)


def test_a_served_method_takes_its_params_struct_and_its_result_is_written_as_before() -> None:
    received: list[GenerateParams] = []

    def generate(call: GenerateParams) -> GenerateResult:
        received.append(call)
        return _answer(call)

    wire = canonical.decode(canonical.encode(CALL))  # as the server hands it over
    out = serves(GENERATE, generate)(wire)
    (call,) = received
    assert call.requests[0] == GenerateRequest("u-0", [1, 5, 9], 7, 1.0, 4, 1.0, "1+2=")
    assert call.batches == [[1], [0]]
    # The core's struct for this call writes the bytes of the hand-built map, integer temperature and all.
    sent = GenerateParams([GenerateRequest("u-0", [1, 5, 9], 7, 1, 4, 1.0, "1+2="),
                           GenerateRequest("u-1", [1, 6], 8, 0.5, 2, 0.9)], [[1], [0]])
    assert canonical.encode(sent.to_wire()) == canonical.encode(CALL)
    assert canonical.encode(out) == canonical.encode(_answer(call).to_wire())


def test_a_malformed_call_is_refused_before_the_method_runs() -> None:
    def generate(call: GenerateParams) -> GenerateResult:
        raise AssertionError("the method ran on a malformed call")

    bad = {**CALL, "requests": [{**CALL["requests"][0], "seed": -1}, CALL["requests"][1]]}
    with pytest.raises(MethodError, match=r"^generate\.requests\[0\]\.seed: must be in \[0, 2\*\*63\)$"):
        serves(GENERATE, generate)(bad)
    top = {**CALL, "requests": [{**CALL["requests"][0], "top_logprobs": 2}, CALL["requests"][1]]}
    with pytest.raises(PayloadError, match="this engine does not report top-k log-probabilities"):
        serves(GENERATE, generate)(top)
    # An engine that reports them says so with its own reader.
    read = functools.partial(GenerateParams.from_wire, top_logprobs=True)
    seen: list[GenerateParams] = []
    serves(GENERATE, lambda c: (seen.append(c), _answer(c))[1], read=read)(top)
    assert seen[0].requests[0].top_logprobs == 2


@dataclass(frozen=True)
class Echo:
    """The echo worker's params, which it sends back as its result."""

    text: str

    def to_wire(self) -> dict[str, Any]:
        return {"text": self.text}

    @classmethod
    def from_wire(cls, raw: Any) -> Echo:
        if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
            raise PayloadError("echo: missing field 'text'")
        return cls(raw["text"])


@dataclass(frozen=True)
class Counted:
    """A result shape the echo worker does not answer with."""

    count: int

    def to_wire(self) -> dict[str, Any]:
        return {"count": self.count}

    @classmethod
    def from_wire(cls, raw: Any) -> Counted:
        if not isinstance(raw, dict) or not isinstance(raw.get("count"), int):
            raise PayloadError("echo: missing field 'count'")
        return cls(raw["count"])


def test_the_client_sends_the_struct_and_returns_the_result_struct() -> None:
    client = WorkerClient([sys.executable, "-m", "invar.workers.echo"], name="echo", expected_role=Role.INFERENCE)
    with client:
        assert client.call(Method("echo", Echo, Echo), Echo("37+58=")) == Echo("37+58=")
        answer = client.ask(Method("echo", Echo, Echo), Echo("x"))
        assert answer.call.method == "echo"
        assert answer.call.params == {"text": "x"}
        with pytest.raises(EvidenceError, match=r"^echo: missing field 'count'$"):
            client.call(Method("echo", Echo, Counted), Echo("x"))
        assert client.call("echo", {"text": "a map"}) == {"text": "a map"}  # a name with a map: the map back
