"""The method table: every engine method's name with the struct of its params and the struct of its result.

A method name and its structs are one value (`GENERATE` is `Method("generate", GenerateParams, GenerateResult)`),
so neither side spells a method as a string beside a map it hopes has the right shape. The core calls
`client.call(GENERATE, params) -> GenerateResult` (`invar.transport.client`). A worker's method takes and returns
the structs (`generate(self, call: GenerateParams) -> GenerateResult`) and is served as
`{GENERATE.name: serves(GENERATE, engine.generate)}`: the params are read (`from_wire`, a bad field answered as a
bad request naming it) before the method runs and its result written (`to_wire`) after, here, once for every engine.

Decision: the table adds no encoding of its own. What travels is still each struct's `to_wire` map, encoded by
`invar.canonical`, so every call digest and record is byte for byte what it was when the maps were built by hand
(docs/protocol.md, "Typed calls").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar, cast

from invar.protocol.payloads import (
    GenerateParams,
    GenerateResult,
    LearnerStepParams,
    LearnerStepResult,
    LoadAdapterParams,
    LoadAdapterResult,
    LoadModelParams,
    LoadModelResult,
    ScoreParams,
    ScoreResult,
    read_received,
)
from invar.protocol.server import Handler


class Wire(Protocol):
    """A payload struct: written as the map that travels (`to_wire`)."""

    def to_wire(self) -> dict[str, Any]: ...


class Readable(Wire, Protocol):
    """A payload struct that is also read back from the map alone (`PayloadError` naming the field)."""

    @classmethod
    def from_wire(cls, raw: Any, /) -> Self: ...


P = TypeVar("P", bound=Wire)
R = TypeVar("R", bound=Readable)


@dataclass(frozen=True)
class Method(Generic[P, R]):
    """One engine method: its name on the wire and the structs of its params and result."""

    name: str
    """The method name a call carries (docs/protocol.md)."""
    params: type[P]
    """The struct of its params."""
    result: type[R]
    """The struct of its result."""

    def received(self, result: Any) -> R:
        """A worker's result as the core reads it: `EvidenceError` naming the field when it is not this method's."""
        return read_received(lambda: self.result.from_wire(result))


LOAD_MODEL = Method("load_model", LoadModelParams, LoadModelResult)
LOAD_ADAPTER = Method("load_adapter", LoadAdapterParams, LoadAdapterResult)
GENERATE = Method("generate", GenerateParams, GenerateResult)
SCORE = Method("score", ScoreParams, ScoreResult)
LEARNER_STEP = Method("learner_step", LearnerStepParams, LearnerStepResult)

METHODS: dict[str, Method[Any, Any]] = {m.name: m for m in (LOAD_MODEL, LOAD_ADAPTER, GENERATE, SCORE, LEARNER_STEP)}
"""Every engine method by name."""


def serves(method: Method[P, R], function: Callable[[P], R], *, read: Callable[[Any], P] | None = None) -> Handler:
    """`function` as a worker's `Server` runs it under `method.name`: the handler reads the call's params into
    `method.params` (with `read` where an engine takes an option the default reader does not, such as the
    reductions a learner computes), runs `function` and writes its result."""
    # Every params struct has `from_wire(raw)`; a learner's also takes the reductions it computes, so its workers
    # pass `read` (the type of `params` cannot say which, hence the cast).
    reader = cast(Callable[[Any], P], getattr(method.params, "from_wire")) if read is None else read  # noqa: B009

    def handle(params: dict[str, Any]) -> dict[str, Any]:
        return function(reader(params)).to_wire()

    return handle
