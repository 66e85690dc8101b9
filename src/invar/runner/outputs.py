"""What the engine commands print: the implementation each states it ran, and `invar infer`'s output.

`invar.runner.infer` returns `InferOutput` and `invar infer --json` prints it as it is (one spelling); evaluate's
and score's outputs extend `EngineFields`.
"""

from __future__ import annotations

from invar.printed import Closed


class EngineFields(Closed):
    """What every engine command states about the implementation it ran (`EngineSpec.meta()`)."""

    engine: str
    model: str
    model_digest: str
    dtype: str
    quantization: str
    adapter: str | None
    adapter_digest: str | None


class InferOutputRow(Closed):
    request_id: str
    prompt: str
    seed: int
    messages: list[dict[str, str]] | None = None
    """With `--chat`: the conversation the model's chat template rendered (the prompt is its user message)."""
    prompt_ids: list[int] | None = None
    """The token ids the model read (special tokens and the rendered chat template included), as the generate call
    sent them; None only in output written before this field existed."""
    tokens: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str | None
    top_ids: list[list[int]] | None = None
    """With `--top-logprobs K`: the K most likely token ids at each response position, most likely first."""
    top_logprobs: list[list[float]] | None = None
    """With `--top-logprobs K`: their log-probabilities."""


class InferOutput(EngineFields):
    """`invar infer --json`."""

    run: str
    patches: dict[str, str] | None = None
    """Only when the worker ran with patches or kernels (`--patch`): reference → digest."""
    chain_head: str
    temperature: float
    top_p: float
    outputs: list[InferOutputRow]


__all__ = ["EngineFields", "InferOutput", "InferOutputRow"]
