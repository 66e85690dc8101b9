"""What each protocol method answers, as types: a worker method registered under a name must return that name's
result (docs/protocol.md), checked by mypy where the method table is written (`method(...)`).

At run time a result is a dict and the core checks every field when it reads a report; this catches a handler
wired to the wrong method name before it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypedDict, overload

from invar.protocol.server import Method

Params = dict[str, Any]


class GeneratedOutput(TypedDict):
    request_id: str
    prompt_tokens: Any
    tokens: Any
    """int32[T]."""
    logprobs: Any
    """float32[T]."""
    finish_reason: Literal["stop", "length"]


class GenerateResult(TypedDict):
    outputs: list[GeneratedOutput]


class ScoredItem(TypedDict):
    item_id: str
    logprobs: Any
    """float32[T]."""
    vocab_logprobs: Any
    """float32[len(vocab_steps), V]."""


class ScoreResult(TypedDict):
    outputs: list[ScoredItem]


class LoadModelResult(TypedDict):
    model_digest: str


@overload
def method(name: Literal["generate"], handler: Callable[[Params], GenerateResult]) -> tuple[str, Method]: ...


@overload
def method(name: Literal["score"], handler: Callable[[Params], ScoreResult]) -> tuple[str, Method]: ...


@overload
def method(name: Literal["load_model"], handler: Callable[[Params], LoadModelResult]) -> tuple[str, Method]: ...


def method(name: str, handler: Callable[[Params], Any]) -> tuple[str, Method]:
    """One entry of a worker's method table (`dict(method(...), ...)` → `Server(methods=...)`), typed by name."""
    def serve(params: Params) -> dict[str, Any]:
        return dict(handler(params))

    return name, serve
