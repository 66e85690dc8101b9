"""Calls the HF worker tests make, and how they compare arrays (bit for bit, or the largest difference)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from invar.engines import DEFAULT_MODEL
from invar.tasks import MAX_ANSWER_CHARS, ModelTokenizer, Problem
from invar.transport import WorkerClient

TOK = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
"""The shipped model's tokenizer, as the core runs it: requests carry its `prompt_ids` (workers never tokenize)."""


def prompt_ids(prompt: str) -> list[int]:
    """The token ids the core sends for a plain text prompt (BOS in front, as the shipped tokenizer encodes it)."""
    return TOK.prompt_ids(prompt=prompt)


def load_params(model_dir: Path, digest: str, quantization: str = "none") -> dict[str, Any]:
    return {"model_dir": str(model_dir), "model_digest": digest, "dtype": "float32", "quantization": quantization,
            "adapter": None}


def make_requests(problems: list[Problem], *, seed: int = 0, temperature: float = 1.0, top_p: float = 1.0,
                  max_tokens: int = MAX_ANSWER_CHARS + 1) -> list[dict[str, Any]]:
    return [{"request_id": p.id, "prompt": p.prompt, "prompt_ids": prompt_ids(p.prompt), "seed": seed + i,
             "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens} for i, p in enumerate(problems)]


def generate(worker: WorkerClient, requests: list[dict[str, Any]], layout: list[list[int]] | None = None,
             **extra: Any) -> list[dict[str, Any]]:
    params = {"requests": requests, "layout": layout if layout is not None else [list(range(len(requests)))],
              "adapter": None, "reference_adapter": None, **extra}
    outputs: list[dict[str, Any]] = worker.call("generate", params)["outputs"]
    for r, o in zip(requests, outputs, strict=True):  # the worker ran exactly the ids asked
        assert o["prompt_tokens"].dtype == np.int32, r
        assert o["prompt_tokens"].tolist() == r["prompt_ids"], r
    return outputs


def score(worker: WorkerClient, requests: list[dict[str, Any]], outputs: list[dict[str, Any]],
          temperature: float | None = None, vocab_steps: list[int] | None = None,
          adapter: str | None = None) -> list[dict[str, Any]]:
    """Teacher-forced log-probabilities of each output's tokens, as one score batch in request order."""
    items = [{"item_id": r["request_id"], "prompt": r["prompt"], "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"],
              "temperature": temperature if temperature is not None else (r["temperature"] or 1.0),
              "vocab_steps": vocab_steps if vocab_steps is not None else []}
             for r, o in zip(requests, outputs, strict=True)]
    result: list[dict[str, Any]] = worker.call("score", {"items": items, "adapter": adapter})["outputs"]
    return result


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
               for x, y in zip(a, b, strict=True))


def bit_identical(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Same length, and every array the same dtype and the same bytes."""
    if len(a) != len(b):
        return False
    return all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
