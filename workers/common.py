"""What every engine worker checks the same way: request schemas, batch layouts, model and adapter digests.

The engines differ in how they run a model; they must not differ in what a request means. Every worker parses its
params through these functions, so a malformed request gets the same message from each engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from invar import canonical
from invar.protocol import MethodError


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of the named packages (the engine part of a worker's identity)."""
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _get(params: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in params:
        raise MethodError(f"{where}: missing field {name!r}")
    value = params[name]
    if isinstance(value, bool) and kind is not bool:
        raise MethodError(f"{where}.{name}: expected {getattr(kind, '__name__', kind)}, got bool")
    if not isinstance(value, kind):
        raise MethodError(f"{where}.{name}: expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def verify_dir(path: str, digest: str | None, what: str) -> str:
    """Check that `path` is a folder whose tree digest is `digest` (if given); returns the digest."""
    if not os.path.isdir(path):
        raise MethodError(f"{what} folder {path!r} does not exist; pass the folder that holds it")
    actual = canonical.tree_digest(path)
    if digest is not None and actual != digest:
        raise MethodError(f"{what} folder {path!r} has digest {actual[:16]}…, expected {digest[:16]}…: "
                          "the files differ from the ones the call names")
    return actual


@dataclass(frozen=True)
class LoadModel:
    model_dir: str
    model_digest: str | None
    dtype: str
    quantization: str
    adapter_path: str | None
    adapter_digest: str | None


def parse_load_model(params: dict[str, Any], dtypes: tuple[str, ...], quantizations: tuple[str, ...]) -> LoadModel:
    where = "load_model"
    model_dir = _get(params, "model_dir", str, where)
    digest = params.get("model_digest")
    if digest is not None and not isinstance(digest, str):
        raise MethodError(f"{where}.model_digest: expected a hex string or null")
    dtype = params.get("dtype", "float32")
    if dtype not in dtypes:
        raise MethodError(f"{where}.dtype: {dtype!r} is not supported by this engine; use one of {list(dtypes)}")
    quant = params.get("quantization", "none")
    if quant not in quantizations:
        raise MethodError(f"{where}.quantization: {quant!r} is not supported by this engine; "
                          f"use one of {list(quantizations)}")
    adapter = params.get("adapter")
    a_path = a_digest = None
    if adapter is not None:
        if not isinstance(adapter, dict):
            raise MethodError(f"{where}.adapter: expected {{path, digest}} or null")
        a_path = _get(adapter, "path", str, f"{where}.adapter")
        a_digest = adapter.get("digest")
    return LoadModel(model_dir, digest, dtype, quant, a_path, a_digest)


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt: str
    seed: int
    temperature: float
    top_p: float
    max_tokens: int


def parse_generate(params: dict[str, Any]) -> tuple[list[Request], list[list[int]]]:
    """The requests and the batch layout of a `generate` call (docs/protocol.md)."""
    raw = _get(params, "requests", list, "generate")
    if not raw:
        raise MethodError("generate.requests: empty; send at least one request")
    requests = []
    seen: set[str] = set()
    for i, r in enumerate(raw):
        where = f"generate.requests[{i}]"
        if not isinstance(r, dict):
            raise MethodError(f"{where}: expected a map")
        req = Request(
            request_id=_get(r, "request_id", str, where),
            prompt=_get(r, "prompt", str, where),
            seed=_get(r, "seed", int, where),
            temperature=float(_get(r, "temperature", (int, float), where)),
            top_p=float(r.get("top_p", 1.0)),
            max_tokens=_get(r, "max_tokens", int, where),
        )
        if req.request_id in seen:
            raise MethodError(f"{where}.request_id: {req.request_id!r} is used twice")
        seen.add(req.request_id)
        if not 0 <= req.seed < 2**63:
            raise MethodError(f"{where}.seed: must be in [0, 2**63)")
        if req.temperature < 0:
            raise MethodError(f"{where}.temperature: must be ≥ 0 (0 is greedy)")
        if not 0 < req.top_p <= 1:
            raise MethodError(f"{where}.top_p: must be in (0, 1]")
        if req.max_tokens < 1:
            raise MethodError(f"{where}.max_tokens: must be ≥ 1")
        requests.append(req)
    layout = params.get("layout")
    if layout is None:
        return requests, [list(range(len(requests)))]
    return requests, parse_layout(layout, len(requests))


def parse_layout(layout: Any, n: int) -> list[list[int]]:
    """A batch layout: a list of batches of request indices, every request exactly once."""
    if not isinstance(layout, list) or not all(isinstance(b, list) and b for b in layout):
        raise MethodError("generate.layout: expected a list of non-empty lists of request indices")
    flat = [i for b in layout for i in b]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in flat) or sorted(flat) != list(range(n)):
        raise MethodError(f"generate.layout: must name every request index 0..{n - 1} exactly once")
    return [list(b) for b in layout]


@dataclass(frozen=True)
class ScoreItem:
    item_id: str
    prompt: str
    response_tokens: np.ndarray
    temperature: float
    vocab_steps: list[int]


def parse_score(params: dict[str, Any]) -> list[ScoreItem]:
    raw = _get(params, "items", list, "score")
    if not raw:
        raise MethodError("score.items: empty; send at least one item")
    items = []
    for i, it in enumerate(raw):
        where = f"score.items[{i}]"
        if not isinstance(it, dict):
            raise MethodError(f"{where}: expected a map")
        tokens = _get(it, "response_tokens", np.ndarray, where)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu" or tokens.size == 0:
            raise MethodError(f"{where}.response_tokens: expected a non-empty 1-D integer array")
        temperature = float(_get(it, "temperature", (int, float), where))
        if temperature <= 0:
            raise MethodError(f"{where}.temperature: must be > 0 to score")
        steps = it.get("vocab_steps", [])
        if not isinstance(steps, list) or not all(isinstance(s, int) and 0 <= s < tokens.size for s in steps):
            raise MethodError(f"{where}.vocab_steps: must be indices into response_tokens (0..{tokens.size - 1})")
        items.append(ScoreItem(_get(it, "item_id", str, where), _get(it, "prompt", str, where),
                               tokens.astype(np.int64), temperature, steps))
    return items


def check_tokens(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise MethodError(f"{where}: token ids must be in [0, {vocab_size})")


def check_prompt_chars(prompt: str, vocab: dict[str, int], where: str) -> None:
    """Character-level vocabularies: name the first character the model cannot read."""
    for pos, ch in enumerate(prompt):
        if ch not in vocab:
            raise MethodError(f"{where}: character {ch!r} at position {pos} is not in the model's vocabulary; "
                              "remove it from the prompt")
