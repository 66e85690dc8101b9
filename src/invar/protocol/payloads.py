"""What travels inside a call and its report: the parameters and results of every engine method, one frozen struct
each, read and written by the core and by every worker.

Each struct's `to_wire` gives exactly the map that travels (the call digests and records are computed over it, so a
field is written as it was given: an integer temperature stays an integer, an optional field that was not given is
not written), and its `from_wire` checks a received map once, raising `PayloadError` with the field's path
(`generate.requests[3].seed: …`). A worker answers a `PayloadError` as a bad request (it is a `MethodError`); the core
reads a result through the same struct and reports it as an error of the evidence it was reading.

Decisions: unknown fields of a received map are ignored, not refused (the core sends labels the engines do not read,
such as a request's `prompt` text, and records of older workers carry fields since dropped); arrays are kept as
received (a worker widens token ids for its engine, `ScoreItem.tokens`), so what a struct holds re-encodes to the
bytes it was read from. The message texts are the workers' from before these structs, unchanged.

A training cycle's messages carry their per-sample fields as columns (`packed`: one array per field for the whole
batch, with the lengths that cut it back) instead of a map per sample: a tiny cycle's rollout, learner call and
learner report were 1,536 small arrays, whose encoding and decoding took about 8 ms of a 0.34 s cycle, and are
13. The values are the same either way, every reader takes both layouts (runs recorded before columns read
back as they were), a struct keeps the layout it was read in, and evaluation calls keep the list of maps, so their
calls and reports are the bytes they always were.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import numpy as np

from invar.errors import EvidenceError, ProtocolError
from invar.protocol.server import MethodError

_T = TypeVar("_T")
_JUST_INT = {int}


class PayloadError(MethodError, ProtocolError):
    """A call's params or a report's result that does not have its method's shape; the message names the field."""


def read_received(read: Callable[[], _T]) -> _T:
    """A `from_wire` of a worker's report as the core reads it: a result without its method's shape is an error of
    the evidence being read (`EvidenceError`, naming the field)."""
    try:
        return read()
    except PayloadError as exc:
        raise EvidenceError(str(exc)) from None


# -- reading helpers: every message is `<path>.<field>: <what is wrong>` ----------------------------------------------


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected a map")
    return value


def _get(m: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in m:
        raise PayloadError(f"{where}: missing field {name!r}")
    value = m[name]
    if isinstance(value, bool) and kind is not bool:
        raise PayloadError(f"{where}.{name}: expected {getattr(kind, '__name__', kind)}, got bool")
    if not isinstance(value, kind):
        raise PayloadError(f"{where}.{name}: expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def _optional_str(m: Mapping[str, Any], name: str, where: str, what: str) -> str | None:
    value = m.get(name)
    if value is not None and not isinstance(value, str):
        raise PayloadError(f"{where}.{name}: expected {what} or null")
    return value


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(m: Mapping[str, Any], name: str, where: str, *, default: float | None = None) -> float:
    value = m.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PayloadError(f"{where}.{name}: expected a finite number")
    return float(value)


def _list(value: Any, where: str, what: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise PayloadError(f"{where}: empty; send at least one {what}" if isinstance(value, list)
                           else f"{where}: expected a list of {what}s")
    return value


def _vector(value: Any, kinds: str, where: str, what: str) -> np.ndarray:
    """A 1-D array of one of the dtype kinds (`iu` integers, `f` floats)."""
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in kinds:
        raise PayloadError(f"{where}: expected {what}")
    return value


def prompt_ids(container: Mapping[str, Any], where: str) -> list[int]:
    """The prompt as the core tokenized it: `prompt_ids`, a non-empty list of token ids.

    Workers never tokenize prompt text: the core renders and tokenizes every prompt with the model's own tokenizer,
    so every engine runs exactly the same ids and the records say which ids were asked. A `prompt` text beside the
    ids is the core's label for people and is not read by a worker.
    """
    ids: list[int] = _get(container, "prompt_ids", list, where)
    # (The set of the items' types first: a call holds hundreds of prompts, and `_int` per id was its cost.)
    if not ids or (set(map(type, ids)) != _JUST_INT and not all(_int(t) for t in ids)):
        raise PayloadError(f"{where}.prompt_ids: expected a non-empty list of token ids (integers)")
    return ids


def _label(m: Mapping[str, Any], where: str) -> str | None:
    return _optional_str(m, "prompt", where, "the prompt's text")


def _put(m: dict[str, Any], name: str, value: Any) -> None:
    """Write an optional field only when it was given: an absent field and a null one encode differently."""
    if value is not None:
        m[name] = value


# -- load_model, load_adapter -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterRef:
    """An adapter folder a `load_model` call loads with the model."""

    path: str
    digest: str | None
    resume: bool | None = None
    """A learner continues training the adapter: it restores the optimizer state saved with it (a training
    checkpoint: `invar.formats.checkpoint`). Not written when None (the same as false)."""

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"path": self.path, "digest": self.digest}
        _put(m, "resume", self.resume)
        return m


@dataclass(frozen=True)
class LoadModelParams:
    model_dir: str
    model_digest: str | None
    dtype: str = "float32"
    quantization: str = "none"
    adapter: AdapterRef | None = None

    @property
    def adapter_resume(self) -> bool:
        return self.adapter is not None and bool(self.adapter.resume)

    def to_wire(self) -> dict[str, Any]:
        return {"model_dir": self.model_dir, "model_digest": self.model_digest, "dtype": self.dtype,
                "quantization": self.quantization,
                "adapter": None if self.adapter is None else self.adapter.to_wire()}

    @classmethod
    def from_wire(cls, params: Any) -> LoadModelParams:
        where = "load_model"
        params = _map(params, where)
        model_dir = _get(params, "model_dir", str, where)
        digest = _optional_str(params, "model_digest", where, "a hex string")
        dtype, quant = params.get("dtype", "float32"), params.get("quantization", "none")
        if not isinstance(dtype, str):
            raise PayloadError(f"{where}.dtype: expected a dtype name such as float32")
        if not isinstance(quant, str):
            raise PayloadError(f"{where}.quantization: expected a quantization name such as none")
        adapter = params.get("adapter")
        ref = None
        if adapter is not None:
            if not isinstance(adapter, dict):
                raise PayloadError(f"{where}.adapter: expected {{path, digest[, resume]}} or null")
            unknown = sorted(set(adapter) - {"path", "digest", "resume"})
            if unknown:
                raise PayloadError(f"{where}.adapter: unknown field {unknown[0]!r}; an adapter is {{path, digest, "
                                   "resume}")
            resume = adapter.get("resume")
            if resume is not None and not isinstance(resume, bool):
                raise PayloadError(f"{where}.adapter.resume: expected true or false")
            ref = AdapterRef(_get(adapter, "path", str, f"{where}.adapter"),
                             _optional_str(adapter, "digest", f"{where}.adapter", "a hex string"), resume)
        return cls(model_dir, digest, dtype, quant, ref)

    def require(self, dtypes: Sequence[str], quantizations: Sequence[str]) -> LoadModelParams:
        """These params, if the engine supports their dtype and quantization; `PayloadError` otherwise."""
        if self.dtype not in dtypes:
            raise PayloadError(f"load_model.dtype: {self.dtype!r} is not supported by this engine; use one of "
                               f"{list(dtypes)}")
        if self.quantization not in quantizations:
            raise PayloadError(f"load_model.quantization: {self.quantization!r} is not supported by this engine; "
                               f"use one of {list(quantizations)}")
        return self


@dataclass(frozen=True)
class LoadModelResult:
    model_digest: str
    adapter_digest: str | None
    vocab_size: int
    eos_token_id: int
    max_model_len: int | None
    optimizer_steps: int | None = None
    """A learner's: the optimizer steps of the adapter it continues (not written by an inference worker)."""
    effective_config: Mapping[str, Any] | None = None
    """The configuration the engine computes with, read back from the model it built
    (`invar.formats.model_config.FIELDS`; not written by a worker that reports none, so older results keep their
    bytes)."""

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"model_digest": self.model_digest, "adapter_digest": self.adapter_digest,
                             "vocab_size": self.vocab_size, "eos_token_id": self.eos_token_id,
                             "max_model_len": self.max_model_len}
        _put(m, "optimizer_steps", self.optimizer_steps)
        _put(m, "effective_config", None if self.effective_config is None else dict(self.effective_config))
        return m

    @classmethod
    def received(cls, result: Any) -> LoadModelResult:
        """`from_wire` for the core, reading a worker's report: `EvidenceError` naming the field."""
        return read_received(lambda: cls.from_wire(result))

    @classmethod
    def from_wire(cls, result: Any) -> LoadModelResult:
        where = "load_model result"
        result = _map(result, where)
        max_len, steps = result.get("max_model_len"), result.get("optimizer_steps")
        if max_len is not None and not _int(max_len):
            raise PayloadError(f"{where}.max_model_len: expected an integer or null")
        if steps is not None and not _int(steps):
            raise PayloadError(f"{where}.optimizer_steps: expected an integer")
        effective = result.get("effective_config")
        if effective is not None and not isinstance(effective, dict):
            raise PayloadError(f"{where}.effective_config: expected a map or null")
        return cls(_get(result, "model_digest", str, where),
                   _optional_str(result, "adapter_digest", where, "a hex string"),
                   _get(result, "vocab_size", int, where), _get(result, "eos_token_id", int, where), max_len, steps,
                   effective)


_ADAPTER_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


@dataclass(frozen=True)
class LoadAdapterParams:
    name: str
    path: str
    digest: str | None

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "digest": self.digest}

    @classmethod
    def from_wire(cls, params: Any) -> LoadAdapterParams:
        params = _map(params, "load_adapter")
        name, path, digest = params.get("name"), params.get("path"), params.get("digest")
        if (not isinstance(name, str) or not 1 <= len(name) <= 64 or not set(name) <= _ADAPTER_NAME_CHARS
                or name == "base"):
            raise PayloadError("load_adapter.name: expected 1-64 characters of [A-Za-z0-9_.-], not 'base' "
                               "(which names the model without an adapter)")
        if not isinstance(path, str):
            raise PayloadError("load_adapter.path: expected the adapter folder as a string")
        if digest is not None and not isinstance(digest, str):
            raise PayloadError("load_adapter.digest: expected a hex string or null")
        return cls(name, path, digest)


@dataclass(frozen=True)
class LoadAdapterResult:
    name: str
    adapter_digest: str

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "adapter_digest": self.adapter_digest}

    @classmethod
    def received(cls, result: Any) -> LoadAdapterResult:
        """`from_wire` for the core, reading a worker's report: `EvidenceError` naming the field."""
        return read_received(lambda: cls.from_wire(result))

    @classmethod
    def from_wire(cls, result: Any) -> LoadAdapterResult:
        where = "load_adapter result"
        result = _map(result, where)
        return cls(_get(result, "name", str, where), _get(result, "adapter_digest", str, where))


# -- generate ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_ids: Sequence[int]
    seed: int
    temperature: float
    """0 is greedy."""
    max_tokens: int
    top_p: float = 1.0
    prompt: str | None = None
    """The prompt's text: the core's label for people, which no worker reads (not written when None)."""
    top_logprobs: int | None = None
    """Also report the k most likely tokens at each sampled position (`GenerateOutput.top_ids`); None: not asked,
    and not written, so a request without it stays the bytes it always was. Only an engine that reports them takes
    it (`GenerateParams.from_wire(top_logprobs=True)`); every other engine refuses it rather than drop it."""

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"request_id": self.request_id}
        _put(m, "prompt", self.prompt)
        m.update({"prompt_ids": list(self.prompt_ids), "seed": self.seed, "temperature": self.temperature,
                  "top_p": self.top_p, "max_tokens": self.max_tokens})
        _put(m, "top_logprobs", self.top_logprobs)
        return m

    @classmethod
    def from_wire(cls, r: Any, where: str, *, top_logprobs: bool = False) -> GenerateRequest:
        """A request as received; `top_logprobs`: whether the receiving engine reports top-k log-probabilities."""
        r = _map(r, where)
        top_k = None
        if "top_logprobs" in r:
            if not top_logprobs:
                raise PayloadError(f"{where}.top_logprobs: this engine does not report top-k log-probabilities; "
                                   "drop the field (the openai engine reports them)")
            top_k = _get(r, "top_logprobs", int, where)
            if top_k < 1:
                raise PayloadError(f"{where}.top_logprobs: must be ≥ 1 (leave the field out for none)")
        top_p = r.get("top_p", 1.0)
        if isinstance(top_p, bool) or not isinstance(top_p, int | float):
            raise PayloadError(f"{where}.top_p: must be in (0, 1]")
        req = cls(
            request_id=_get(r, "request_id", str, where),
            prompt_ids=prompt_ids(r, where),
            seed=_get(r, "seed", int, where),
            temperature=float(_get(r, "temperature", (int, float), where)),
            top_p=float(top_p),
            max_tokens=_get(r, "max_tokens", int, where),
            prompt=_label(r, where),
            top_logprobs=top_k,
        )
        if not 0 <= req.seed < 2**63:
            raise PayloadError(f"{where}.seed: must be in [0, 2**63)")
        if req.temperature < 0:
            raise PayloadError(f"{where}.temperature: must be ≥ 0 (0 is greedy)")
        if not 0 < req.top_p <= 1:
            raise PayloadError(f"{where}.top_p: must be in (0, 1]")
        if req.max_tokens < 1:
            raise PayloadError(f"{where}.max_tokens: must be ≥ 1")
        return req


@dataclass(frozen=True)
class GenerateParams:
    requests: Sequence[GenerateRequest]
    layout: Sequence[Sequence[int]] | None
    """Batches of request indices, every request exactly once; None: one batch of all (not written)."""
    adapter: str | None = None
    """The adapter to sample from: a loaded name, "base" for the base model, null for the model as loaded."""
    reference_adapter: str | None = None
    """Also score each response under this adapter (`reference_logprobs`); null: no reference."""
    packed: bool = False
    """Answer with the outputs as columns (`GenerateResult.packed`), as a training cycle asks; False: as a list of
    maps, and the call is the bytes it always was (not written)."""

    @property
    def batches(self) -> list[list[int]]:
        return [list(range(len(self.requests)))] if self.layout is None else [list(b) for b in self.layout]

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"requests": [r.to_wire() for r in self.requests]}
        _put(m, "layout", None if self.layout is None else [list(b) for b in self.layout])
        m.update({"adapter": self.adapter, "reference_adapter": self.reference_adapter})
        if self.packed:
            m["packed"] = True
        return m

    @classmethod
    def from_wire(cls, params: Any, *, top_logprobs: bool = False) -> GenerateParams:
        """The call as received; `top_logprobs`: whether the receiving engine reports top-k log-probabilities (a
        request asking for them is refused otherwise)."""
        params = _map(params, "generate")
        raw = _get(params, "requests", list, "generate")
        if not raw:
            raise PayloadError("generate.requests: empty; send at least one request")
        requests = []
        seen: set[str] = set()
        for i, r in enumerate(raw):
            req = GenerateRequest.from_wire(r, f"generate.requests[{i}]", top_logprobs=top_logprobs)
            if req.request_id in seen:
                raise PayloadError(f"generate.requests[{i}].request_id: {req.request_id!r} is used twice")
            seen.add(req.request_id)
            requests.append(req)
        layout = params.get("layout")
        packed = params.get("packed", False)
        if packed is not True and "packed" in params:
            raise PayloadError("generate.packed: expected true, or leave the field out for a list of outputs")
        return cls(tuple(requests), None if layout is None else parse_layout(layout, len(requests)),
                   _optional_str(params, "adapter", "generate", "an adapter name"),
                   _optional_str(params, "reference_adapter", "generate", "an adapter name"), packed)


def parse_layout(layout: Any, n: int) -> list[list[int]]:
    """A batch layout: a list of batches of request indices, every request exactly once."""
    if not isinstance(layout, list) or not all(isinstance(b, list) and b for b in layout):
        raise PayloadError("generate.layout: expected a list of non-empty lists of request indices")
    flat = [i for b in layout for i in b]
    if not all(_int(i) for i in flat) or sorted(flat) != list(range(n)):
        raise PayloadError(f"generate.layout: must name every request index 0..{n - 1} exactly once")
    return [list(b) for b in layout]


_I64, _F64 = np.dtype(np.int64), np.dtype(np.float64)


def _lengths(value: Any, where: str, *, size: int | None = None, least: int = 1) -> np.ndarray:
    """An int64 vector of lengths, each ≥ `least` (and `size` of them when given)."""
    if not isinstance(value, np.ndarray) or value.dtype != _I64 or value.ndim != 1 or (
            size is not None and value.size != size) or (value.size and int(value.min()) < least):
        raise PayloadError(f"{where}: expected an int64 vector of {'' if size is None else f'{size} '}lengths, each "
                           f"≥ {least}")
    return value


def _bounds(lengths: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of consecutive pieces of `lengths`."""
    ends = np.cumsum(lengths).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _cut(values: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """`values` cut into consecutive pieces of `lengths` (views: the arrays stay those received)."""
    return [values[a:b] for a, b in _bounds(lengths)]


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerateOutput:
    """One request's response: the prompt ids the engine ran, the tokens it drew and their log-probabilities."""

    request_id: str
    prompt_tokens: np.ndarray
    """int [P]: the prompt ids as the engine ran them (int32 from every worker)."""
    tokens: np.ndarray
    """int32 [T]: the response, ending with an end-of-sequence id when it stopped."""
    logprobs: np.ndarray
    """float32 [T]: each token's log-probability at the request's temperature (at 1 for a greedy request)."""
    finish_reason: FinishReason
    reference_logprobs: np.ndarray | None = None
    """float32 [T]: the tokens under the call's reference adapter (only when one was named)."""
    attempts: int | None = None
    """An endpoint worker's: how many requests to its server this response took."""
    top_ids: np.ndarray | None = None
    """int32 [T, k]: the k most likely tokens at each position, most likely first (only when the request asked
    `top_logprobs` = k)."""
    top_logprobs: np.ndarray | None = None
    """float32 [T, k]: their log-probabilities."""

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"request_id": self.request_id, "prompt_tokens": self.prompt_tokens,
                             "tokens": self.tokens, "logprobs": self.logprobs, "finish_reason": self.finish_reason}
        _put(m, "top_ids", self.top_ids)
        _put(m, "top_logprobs", self.top_logprobs)
        _put(m, "reference_logprobs", self.reference_logprobs)
        _put(m, "attempts", self.attempts)
        return m

    @classmethod
    def from_wire(cls, o: Any, where: str) -> GenerateOutput:
        o = _map(o, where)
        request_id = _get(o, "request_id", str, where)
        at = f"{where} ({request_id})"
        tokens = o.get("tokens")
        if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32 or tokens.ndim != 1:
            raise PayloadError(f"{at}: tokens are not an int32 vector")
        lps = o.get("logprobs")
        if not isinstance(lps, np.ndarray) or lps.dtype != np.float32 or lps.shape != tokens.shape:
            raise PayloadError(f"{at}: logprobs are not a float32 vector as long as tokens")
        ref = o.get("reference_logprobs")
        if ref is not None and (not isinstance(ref, np.ndarray) or ref.dtype != np.float32
                                or ref.shape != tokens.shape):
            raise PayloadError(f"{at}: reference_logprobs are not a float32 vector as long as tokens")
        finish = o.get("finish_reason")
        if finish not in ("stop", "length"):
            raise PayloadError(f"{at}: finish_reason {finish!r} is neither stop nor length")
        attempts = o.get("attempts")
        if attempts is not None and not _int(attempts):
            raise PayloadError(f"{at}: attempts is not an integer")
        top_ids, top_lps = o.get("top_ids"), o.get("top_logprobs")
        if (top_ids is None) != (top_lps is None):
            raise PayloadError(f"{at}: top_ids and top_logprobs come together or not at all")
        if top_ids is not None:
            if (not isinstance(top_ids, np.ndarray) or top_ids.dtype != np.int32 or top_ids.ndim != 2
                    or top_ids.shape[0] != tokens.size):
                raise PayloadError(f"{at}: top_ids are not an int32 [tokens, k] matrix")
            if not isinstance(top_lps, np.ndarray) or top_lps.dtype != np.float32 or top_lps.shape != top_ids.shape:
                raise PayloadError(f"{at}: top_logprobs are not a float32 matrix shaped as top_ids")
        return cls(request_id, _vector(o.get("prompt_tokens"), "iu", f"{at}.prompt_tokens",
                                       "the prompt ids the engine ran, an integer vector"),
                   tokens, lps, cast(FinishReason, finish), ref, attempts, top_ids, top_lps)


def _patch_calls(result: Mapping[str, Any], where: str) -> dict[str, int] | None:
    calls = result.get("patch_calls")
    if calls is not None and (not isinstance(calls, dict) or not all(_int(v) for v in calls.values())):
        raise PayloadError(f"{where}.patch_calls: expected a map of patch names to call counts")
    return calls


_OPTIONAL_OUTPUT_FIELDS = ("reference_logprobs", "attempts", "top_ids", "top_logprobs")


def _pack_outputs(outputs: Sequence[GenerateOutput]) -> dict[str, Any] | None:
    """The outputs as columns (`outputs_batch`): each field of every output concatenated in request order, with the
    lengths that cut it back; None where they do not all have the same fields (and prompt dtype, and top-k width),
    which only the list of maps can say. A training cycle's rollout is hundreds of outputs: as maps, 768 small arrays
    whose encoding in the worker and decoding in the core took about 4 ms of a tiny cycle."""
    if not outputs:
        return None
    def shape(o: GenerateOutput) -> tuple[Any, ...]:
        """What every output must share to be columns: its optional fields, its prompt dtype, its top-k width."""
        return (tuple(name for name in _OPTIONAL_OUTPUT_FIELDS if getattr(o, name) is not None),
                o.prompt_tokens.dtype, None if o.top_ids is None else o.top_ids.shape[1:])

    first = shape(outputs[0])
    if any(shape(o) != first for o in outputs):
        return None
    given = first[0]
    m: dict[str, Any] = {
        "finish_reasons": [o.finish_reason for o in outputs],
        "lengths": np.array([o.tokens.size for o in outputs], _I64),
        "logprobs": np.concatenate([o.logprobs for o in outputs]),
        "prompt_lengths": np.array([o.prompt_tokens.size for o in outputs], _I64),
        "prompt_tokens": np.concatenate([o.prompt_tokens for o in outputs]),
        "request_ids": [o.request_id for o in outputs],
        "tokens": np.concatenate([o.tokens for o in outputs]),
    }
    for name in given:
        values = [getattr(o, name) for o in outputs]
        m[name] = np.array(values, _I64) if name == "attempts" else np.concatenate(values)
    return m


def _unpack_outputs(batch: Any, where: str) -> tuple[GenerateOutput, ...]:
    """The outputs of an `outputs_batch` (`_pack_outputs`), each field checked once for the batch, as
    `GenerateOutput.from_wire` checks it for one output."""
    where = f"{where}.outputs_batch"
    b = _map(batch, where)
    ids, finish = b.get("request_ids"), b.get("finish_reasons")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise PayloadError(f"{where}.request_ids: expected a non-empty list of request ids")
    n = len(ids)
    if not isinstance(finish, list) or len(finish) != n or not all(f in ("stop", "length") for f in finish):
        raise PayloadError(f"{where}.finish_reasons: expected {n}, each stop or length")
    lengths = _lengths(b.get("lengths"), f"{where}.lengths", size=n, least=0)
    total = int(lengths.sum())
    tokens, lps, ref = b.get("tokens"), b.get("logprobs"), b.get("reference_logprobs")
    if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32 or tokens.shape != (total,):
        raise PayloadError(f"{where}.tokens: expected an int32 vector of the lengths' sum ({total})")
    if not isinstance(lps, np.ndarray) or lps.dtype != np.float32 or lps.shape != tokens.shape:
        raise PayloadError(f"{where}.logprobs: expected a float32 vector as long as tokens")
    if ref is not None and (not isinstance(ref, np.ndarray) or ref.dtype != np.float32 or ref.shape != tokens.shape):
        raise PayloadError(f"{where}.reference_logprobs: expected a float32 vector as long as tokens")
    prompt_lengths = _lengths(b.get("prompt_lengths"), f"{where}.prompt_lengths", size=n, least=0)
    prompts = _vector(b.get("prompt_tokens"), "iu", f"{where}.prompt_tokens",
                      "the prompt ids the engine ran, an integer vector")
    if prompts.size != int(prompt_lengths.sum()):
        raise PayloadError(f"{where}.prompt_tokens: {prompts.size} ids for prompt lengths summing to "
                           f"{int(prompt_lengths.sum())}")
    attempts = b.get("attempts")
    if attempts is not None and (not isinstance(attempts, np.ndarray) or attempts.dtype != _I64
                                 or attempts.shape != (n,)):
        raise PayloadError(f"{where}.attempts: expected an int64 vector of {n} counts")
    top_ids, top_lps = b.get("top_ids"), b.get("top_logprobs")
    if (top_ids is None) != (top_lps is None):
        raise PayloadError(f"{where}: top_ids and top_logprobs come together or not at all")
    if top_ids is not None and (
            not isinstance(top_ids, np.ndarray) or top_ids.dtype != np.int32 or top_ids.ndim != 2
            or top_ids.shape[0] != total or not isinstance(top_lps, np.ndarray) or top_lps.dtype != np.float32
            or top_lps.shape != top_ids.shape):
        raise PayloadError(f"{where}: top_ids and top_logprobs are not int32 and float32 [tokens, k] matrices")
    none: list[Any] = [None] * n
    return tuple(GenerateOutput(*fields) for fields in zip(
        ids, _cut(prompts, prompt_lengths), _cut(tokens, lengths), _cut(lps, lengths),
        cast(list[FinishReason], finish), none if ref is None else _cut(ref, lengths),
        none if attempts is None else attempts.tolist(), none if top_ids is None else _cut(top_ids, lengths),
        none if top_lps is None else _cut(top_lps, lengths), strict=True))


@dataclass(frozen=True)
class GenerateResult:
    outputs: Sequence[GenerateOutput]
    """One per request, in request order."""
    model_digest: str
    adapter_digest: str | None
    """The adapter sampled from (null: the base model)."""
    patch_calls: Mapping[str, int] | None = None
    """A patched worker's: how often each patch's replaced operations ran during the call."""
    packed: bool = False
    """The outputs travel as columns (`outputs_batch`), as a worker answers a call that asks it
    (`GenerateParams.packed`) whenever its outputs all have the same fields; False: as a list of maps (`outputs`)."""

    def to_wire(self) -> dict[str, Any]:
        columns = _pack_outputs(self.outputs) if self.packed else None
        m: dict[str, Any] = {"outputs": [o.to_wire() for o in self.outputs]} if columns is None else \
            {"outputs_batch": columns}
        m.update({"model_digest": self.model_digest, "adapter_digest": self.adapter_digest})
        _put(m, "patch_calls", None if self.patch_calls is None else dict(self.patch_calls))
        return m

    @classmethod
    def received(cls, result: Any, where: str = "generate") -> GenerateResult:
        """`from_wire` for the core, reading a worker's report: `EvidenceError` naming the field."""
        return read_received(lambda: cls.from_wire(result, where))

    @classmethod
    def from_wire(cls, result: Any, where: str = "generate") -> GenerateResult:
        result = _map(result, where)
        outputs = result.get("outputs")
        packed = "outputs_batch" in result
        if packed:
            if outputs is not None:
                raise PayloadError(f"{where}: both outputs and outputs_batch; a report gives its outputs one way")
            read = _unpack_outputs(result["outputs_batch"], where)
        elif not isinstance(outputs, list):
            raise PayloadError(f"{where}: the report has no outputs")
        else:
            read = tuple(GenerateOutput.from_wire(o, f"{where}: output {i}") for i, o in enumerate(outputs))
        return cls(read, _get(result, "model_digest", str, where),
                   _optional_str(result, "adapter_digest", where, "a hex string"), _patch_calls(result, where),
                   packed)


# -- score ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreItem:
    """A response to read under the model: its per-token log-probabilities, and the whole distribution at the
    `vocab_steps`."""

    item_id: str
    prompt_ids: Sequence[int]
    response_tokens: np.ndarray
    """Integer [T], as the core sends it (int32)."""
    temperature: float
    vocab_steps: Sequence[int] = ()
    prompt: str | None = None
    """The prompt's text, a label no worker reads (not written when None)."""

    @property
    def tokens(self) -> np.ndarray:
        """int64 [T]: the response as an engine indexes with it."""
        return self.response_tokens.astype(np.int64)

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"item_id": self.item_id}
        _put(m, "prompt", self.prompt)
        m.update({"prompt_ids": list(self.prompt_ids), "response_tokens": self.response_tokens,
                  "temperature": self.temperature, "vocab_steps": list(self.vocab_steps)})
        return m

    @classmethod
    def from_wire(cls, it: Any, where: str) -> ScoreItem:
        it = _map(it, where)
        tokens = _get(it, "response_tokens", np.ndarray, where)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu" or tokens.size == 0:
            raise PayloadError(f"{where}.response_tokens: expected a non-empty 1-D integer array")
        temperature = float(_get(it, "temperature", (int, float), where))
        if temperature <= 0:
            raise PayloadError(f"{where}.temperature: must be > 0 to score")
        steps = it.get("vocab_steps", [])
        if not isinstance(steps, list) or not all(_int(s) and 0 <= s < tokens.size for s in steps):
            raise PayloadError(f"{where}.vocab_steps: must be indices into response_tokens (0..{tokens.size - 1})")
        return cls(_get(it, "item_id", str, where), prompt_ids(it, where), tokens, temperature, steps,
                   _label(it, where))


@dataclass(frozen=True)
class ScoreParams:
    items: Sequence[ScoreItem]
    adapter: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"items": [it.to_wire() for it in self.items], "adapter": self.adapter}

    @classmethod
    def from_wire(cls, params: Any) -> ScoreParams:
        params = _map(params, "score")
        raw = _get(params, "items", list, "score")
        if not raw:
            raise PayloadError("score.items: empty; send at least one item")
        return cls(tuple(ScoreItem.from_wire(it, f"score.items[{i}]") for i, it in enumerate(raw)),
                   _optional_str(params, "adapter", "score", "an adapter name"))


@dataclass(frozen=True)
class ScoreOutput:
    item_id: str
    logprobs: np.ndarray
    """float32 [T]: each response token's log-probability at the item's temperature."""
    vocab_logprobs: np.ndarray
    """float32 [len(vocab_steps), V]: the whole distribution at each captured step."""

    def to_wire(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "logprobs": self.logprobs, "vocab_logprobs": self.vocab_logprobs}

    @classmethod
    def from_wire(cls, o: Any, where: str) -> ScoreOutput:
        o = _map(o, where)
        iid = _get(o, "item_id", str, where)
        lp, vocab = o.get("logprobs"), o.get("vocab_logprobs")
        if not isinstance(lp, np.ndarray) or lp.dtype != np.float32 or lp.ndim != 1:
            raise PayloadError(f"{where} ({iid}): logprobs are not a float32 vector")
        if not isinstance(vocab, np.ndarray) or vocab.ndim != 2 or vocab.dtype != np.float32:
            raise PayloadError(f"{where} ({iid}): vocab_logprobs are not a float32 matrix [steps, V]")
        return cls(iid, lp, vocab)


@dataclass(frozen=True)
class ScoreResult:
    outputs: Sequence[ScoreOutput]
    """One per item, in item order."""
    model_digest: str
    adapter_digest: str | None
    patch_calls: Mapping[str, int] | None = None

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {"outputs": [o.to_wire() for o in self.outputs], "model_digest": self.model_digest,
                             "adapter_digest": self.adapter_digest}
        _put(m, "patch_calls", None if self.patch_calls is None else dict(self.patch_calls))
        return m

    @classmethod
    def received(cls, result: Any, where: str = "score") -> ScoreResult:
        """`from_wire` for the core, reading a worker's report: `EvidenceError` naming the field."""
        return read_received(lambda: cls.from_wire(result, where))

    @classmethod
    def from_wire(cls, result: Any, where: str = "score") -> ScoreResult:
        result = _map(result, where)
        outputs = result.get("outputs")
        if not isinstance(outputs, list):
            raise PayloadError(f"{where}: the report has no outputs")
        return cls(tuple(ScoreOutput.from_wire(o, f"{where}: output {i}") for i, o in enumerate(outputs)),
                   _get(result, "model_digest", str, where),
                   _optional_str(result, "adapter_digest", where, "a hex string"), _patch_calls(result, where))


# -- learner_step (docs/objective.md) ---------------------------------------------------------------------------------


def _logprob_vector(value: Any, length: int, where: str, *, values: bool = True) -> np.ndarray:
    """`values`: also check each is finite and ≤ 0 (False: the caller checks a whole batch's at once)."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.shape != (length,):
        raise PayloadError(f"{where}: expected a float32 array of {length} log-probabilities (one per token)")
    if values and (not np.all(np.isfinite(value)) or np.any(value > 0)):
        raise PayloadError(f"{where}: log-probabilities must be finite and ≤ 0")
    return value


@dataclass(frozen=True)
class LearnerSample:
    """One sampled response: the engine's tokens and their behavior log-probabilities, the core's advantage."""

    prompt_ids: Sequence[int]
    tokens: np.ndarray
    """Integer [T], as the core sends it (int32)."""
    behavior_logprobs: np.ndarray
    """float32 [T]: the tokens' log-probabilities under the policy that sampled them, at the step's temperature."""
    advantage: float
    reference_logprobs: np.ndarray | None = None
    """float32 [T]: the tokens under the reference policy (needed when `objective.kl_coef` is not 0; not written
    when None)."""
    prompt: str | None = None
    """The prompt's text, a label no worker reads (not written when None)."""

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {}
        _put(m, "prompt", self.prompt)
        m.update({"prompt_ids": list(self.prompt_ids), "tokens": self.tokens,
                  "behavior_logprobs": self.behavior_logprobs, "advantage": self.advantage})
        _put(m, "reference_logprobs", self.reference_logprobs)
        return m

    @classmethod
    def from_wire(cls, s: Any, where: str, *, values: bool = True) -> LearnerSample:
        """`values`: also check the log-probabilities' values (False: `LearnerStepParams` checks the batch's at
        once)."""
        if not isinstance(s, dict):
            raise PayloadError(f"{where}: expected a map with prompt_ids, tokens, behavior_logprobs, advantage")
        tokens = s.get("tokens")
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu" or not tokens.size:
            raise PayloadError(f"{where}.tokens: expected a non-empty 1-D integer array")
        ids = prompt_ids(s, where)
        behavior = _logprob_vector(s.get("behavior_logprobs"), tokens.size, f"{where}.behavior_logprobs",
                                   values=values)
        advantage = _num(s, "advantage", where)
        ref = s.get("reference_logprobs")
        return cls(ids, tokens, behavior, advantage,
                   None if ref is None else _logprob_vector(ref, tokens.size, f"{where}.reference_logprobs",
                                                            values=values),
                   _label(s, where))


def _learner_samples(raw: list[Any], where: str) -> tuple[LearnerSample, ...]:
    """`LearnerSample.from_wire` of every sample, their log-probabilities' values checked as one concatenated array
    (a call holds hundreds of samples, and two numpy reductions per array were most of a learner's reading of it).
    At any failure the samples are read again one by one, so the message names the first bad field as it always
    did."""
    try:
        samples = tuple(LearnerSample.from_wire(s, f"{where}.samples[{i}]", values=False) for i, s in enumerate(raw))
    except PayloadError:
        pass
    else:
        joined = np.concatenate([s.behavior_logprobs for s in samples]
                                + [s.reference_logprobs for s in samples if s.reference_logprobs is not None])
        if bool(np.isfinite(joined).all()) and not bool((joined > 0).any()):
            return samples
    return tuple(LearnerSample.from_wire(s, f"{where}.samples[{i}]") for i, s in enumerate(raw))


def _pack_samples(samples: Sequence[LearnerSample]) -> dict[str, Any]:
    """The batch as columns (`learner_step.batch`): each field of every sample concatenated in sample order, with the
    lengths that cut it back. One array per field instead of one per sample and field: a cycle's call was hundreds
    of small arrays, and their encoding and reading were most of what the call cost on both sides."""
    if not samples:
        raise ValueError("a learner_step call holds at least one sample")
    first = samples[0]
    if any((s.reference_logprobs is None) != (first.reference_logprobs is None) or (s.prompt is None) != (
            first.prompt is None) or s.tokens.dtype != first.tokens.dtype for s in samples):
        raise ValueError("a batch travels as columns only when every sample has the same fields and token dtype")
    m: dict[str, Any] = {
        "advantages": np.array([s.advantage for s in samples], _F64),
        "behavior_logprobs": np.concatenate([s.behavior_logprobs for s in samples]),
        "lengths": np.array([s.tokens.size for s in samples], _I64),
        "prompt_ids": np.fromiter(itertools.chain.from_iterable(s.prompt_ids for s in samples), _I64),
        "prompt_lengths": np.array([len(s.prompt_ids) for s in samples], _I64),
        "tokens": np.concatenate([s.tokens for s in samples]),
    }
    if first.prompt is not None:
        m["prompts"] = [s.prompt for s in samples]
    if first.reference_logprobs is not None:
        m["reference_logprobs"] = np.concatenate([s.reference_logprobs for s in samples
                                                  if s.reference_logprobs is not None])
    return m


def _unpack_samples(batch: Any, where: str) -> tuple[LearnerSample, ...]:
    """The samples of a `learner_step.batch` (`_pack_samples`), each field's values checked once for the batch."""
    where = f"{where}.batch"
    b = _map(batch, where)
    lengths = _lengths(b.get("lengths"), f"{where}.lengths")
    n = lengths.size
    if not n:
        raise PayloadError(f"{where}.lengths: empty; send at least one sample")
    tokens = b.get("tokens")
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu" or \
            tokens.size != int(lengths.sum()):
        raise PayloadError(f"{where}.tokens: expected a 1-D integer array of the lengths' sum ({int(lengths.sum())})")
    prompt_lengths = _lengths(b.get("prompt_lengths"), f"{where}.prompt_lengths", size=n)
    ids = b.get("prompt_ids")
    if not isinstance(ids, np.ndarray) or ids.dtype != _I64 or ids.ndim != 1 or \
            ids.size != int(prompt_lengths.sum()):
        raise PayloadError(f"{where}.prompt_ids: expected an int64 vector of the prompt lengths' sum "
                           f"({int(prompt_lengths.sum())})")
    behavior = _logprob_vector(b.get("behavior_logprobs"), tokens.size, f"{where}.behavior_logprobs")
    ref = b.get("reference_logprobs")
    if ref is not None:
        ref = _logprob_vector(ref, tokens.size, f"{where}.reference_logprobs")
    advantages = b.get("advantages")
    if not isinstance(advantages, np.ndarray) or advantages.dtype != _F64 or advantages.shape != (n,) or \
            not bool(np.isfinite(advantages).all()):
        raise PayloadError(f"{where}.advantages: expected a float64 vector of {n} finite advantages")
    prompts = b.get("prompts")
    if prompts is not None and (not isinstance(prompts, list) or len(prompts) != n
                                or not all(isinstance(t, str) for t in prompts)):
        raise PayloadError(f"{where}.prompts: expected a list of {n} prompt texts or none")
    all_ids = ids.tolist()  # one conversion, then a list per sample
    refs: list[np.ndarray | None] = [None] * n if ref is None else list(_cut(ref, lengths))
    return tuple(LearnerSample(all_ids[lo:hi], t, lp, adv, r, None if prompts is None else prompts[i])
                 for i, ((lo, hi), t, lp, adv, r) in enumerate(zip(
                     _bounds(prompt_lengths), _cut(tokens, lengths), _cut(behavior, lengths), advantages.tolist(),
                     refs, strict=True)))


@dataclass(frozen=True)
class LearnerObjective:
    """The objective's settings (`invar.loop.objective.ObjectiveSettings`), as the learner takes them."""

    clip_low: float
    clip_high: float
    kl_coef: float = 0.0
    importance: str = "none"
    """`none`, `truncate` (w ← min(w, cap)) or `mask` (w ← 0 where w > cap): `invar.loop.objective`."""
    importance_cap: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"clip_low": self.clip_low, "clip_high": self.clip_high, "kl_coef": self.kl_coef,
                "importance": self.importance, "importance_cap": self.importance_cap}

    @classmethod
    def from_wire(cls, o: Any, where: str) -> LearnerObjective:
        o = _map(o, where)
        importance = o.get("importance", "none")
        if importance not in ("none", "truncate", "mask"):
            raise PayloadError(f"{where}.importance: {importance!r}; use none, truncate or mask")
        cap = o.get("importance_cap")
        if (importance == "none") != (cap is None):
            raise PayloadError(f"{where}.importance_cap: give a cap exactly when importance is truncate or mask")
        objective = cls(_num(o, "clip_low", where), _num(o, "clip_high", where),
                        _num(o, "kl_coef", where, default=0.0), str(importance),
                        None if cap is None else _num(o, "importance_cap", where))
        if not 0 <= objective.clip_low < 1 or objective.clip_high < 0 or objective.kl_coef < 0:
            raise PayloadError(f"{where}: need 0 ≤ clip_low < 1, clip_high ≥ 0, kl_coef ≥ 0")
        if objective.importance_cap is not None and objective.importance_cap <= 1:
            raise PayloadError(f"{where}.importance_cap: must be above 1 (weights of 1 are never cut)")
        return objective


@dataclass(frozen=True)
class LearnerOptimizer:
    """AdamW's settings for this step (the state itself stays with the learner across steps)."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = None
    """Clip the gradient's norm to this; None: no clipping (written as null)."""

    def to_wire(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay,
                "max_grad_norm": self.max_grad_norm}

    @classmethod
    def from_wire(cls, p: Any, where: str) -> LearnerOptimizer:
        p = _map(p, where)
        betas = p.get("betas", [0.9, 0.999])
        if (not isinstance(betas, list) or len(betas) != 2
                or not all(isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            raise PayloadError(f"{where}.betas: expected two numbers in [0, 1)")
        mgn = p.get("max_grad_norm")
        optimizer = cls(lr=_num(p, "lr", where), betas=(float(betas[0]), float(betas[1])),
                        eps=_num(p, "eps", where, default=1e-8),
                        weight_decay=_num(p, "weight_decay", where, default=0.0),
                        max_grad_norm=None if mgn is None else _num(p, "max_grad_norm", where))
        if optimizer.lr <= 0 or optimizer.eps <= 0 or optimizer.weight_decay < 0 or (
                optimizer.max_grad_norm is not None and optimizer.max_grad_norm <= 0):
            raise PayloadError(f"{where}: need lr > 0, eps > 0, weight_decay ≥ 0, max_grad_norm > 0 or null")
        return optimizer


@dataclass(frozen=True)
class LoraParams:
    """The shape of a fresh adapter (a learner refuses other settings for the adapter it already trains)."""

    r: int
    alpha: float
    target_modules: Sequence[str]
    dropout: float = 0.0
    """Always 0: dropout would make the first step's ratio differ from 1 (current ≠ proximal)."""

    def to_wire(self) -> dict[str, Any]:
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout, "target_modules": list(self.target_modules)}

    @classmethod
    def from_wire(cls, lo: Any, where: str) -> LoraParams:
        lo = _map(lo, where)
        r, targets = lo.get("r"), lo.get("target_modules")
        if not _int(r) or r < 1:
            raise PayloadError(f"{where}.r: expected an integer ≥ 1")
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            raise PayloadError(f"{where}.target_modules: expected a non-empty list of module names")
        dropout = _num(lo, "dropout", where, default=0.0)
        if dropout != 0:
            raise PayloadError(f"{where}.dropout: must be 0; dropout would make the first step's ratio differ from 1 "
                               "(current ≠ proximal)")
        alpha = _num(lo, "alpha", where)
        if alpha <= 0:
            raise PayloadError(f"{where}.alpha: must be > 0")
        return cls(r, alpha, [str(t) for t in targets], dropout)


@dataclass(frozen=True)
class Schedule:
    """How the step is computed (docs/training.md, "Reproducible schedules"), so that runs scheduled differently
    publish the same policy."""

    micro_batch: int | None
    """Sequences per forward/backward pass; None: the whole batch (written as null)."""
    reduction: str
    """How per-sequence gradients are summed: one of the learner's reductions."""

    def split(self, rows: int) -> tuple[int, str]:
        """(sequences per micro-batch, reduction) for a batch of `rows` sequences."""
        return (rows if self.micro_batch is None else min(self.micro_batch, rows)), self.reduction

    def to_wire(self) -> dict[str, Any]:
        return {"micro_batch": self.micro_batch, "reduction": self.reduction}

    @classmethod
    def from_wire(cls, raw: Any, reductions: Sequence[str]) -> Schedule:
        """`reductions`: the ones the receiving learner computes."""
        if not isinstance(raw, dict) or set(raw) - {"micro_batch", "reduction"}:
            raise PayloadError("learner_step.schedule: expected a map with micro_batch (integer ≥ 1 or null) and "
                               f"reduction (one of {list(reductions)})")
        size, reduction = raw.get("micro_batch"), raw.get("reduction", "float64-sequence")
        if size is not None and (not _int(size) or size < 1):
            raise PayloadError(f"learner_step.schedule.micro_batch: {size!r}; expected an integer ≥ 1, or null for "
                               "the whole batch")
        if reduction not in reductions:
            raise PayloadError(f"learner_step.schedule.reduction: {reduction!r}; choose one of {list(reductions)}")
        return cls(size, str(reduction))


@dataclass(frozen=True)
class LearnerStepParams:
    """One update of the adapter under training: the batch, the objective and optimizer settings, the folder to
    save the updated adapter (a training checkpoint) to."""

    samples: Sequence[LearnerSample]
    temperature: float
    """The rollout temperature the behavior log-probabilities were drawn at."""
    objective: LearnerObjective
    optimizer: LearnerOptimizer
    lora: LoraParams | None
    """A fresh adapter's shape; null: continue the adapter under training."""
    seed: int
    """Seeds a fresh adapter's initialisation."""
    save_dir: str
    schedule: Schedule | None = None
    """None: the learner's own default (not written)."""
    packed: bool = False
    """The samples travel as columns (`batch`, one array per field); False: as a list of maps (`samples`), as
    every call did before, which a learner still reads."""

    def to_wire(self) -> dict[str, Any]:
        batch: dict[str, Any] = {"batch": _pack_samples(self.samples)} if self.packed else \
            {"samples": [s.to_wire() for s in self.samples]}
        m: dict[str, Any] = {**batch, "temperature": self.temperature,
                             "objective": self.objective.to_wire(), "optimizer": self.optimizer.to_wire(),
                             "lora": None if self.lora is None else self.lora.to_wire(), "seed": self.seed,
                             "save_dir": self.save_dir}
        _put(m, "schedule", None if self.schedule is None else self.schedule.to_wire())
        return m

    @classmethod
    def from_wire(cls, params: Any, *, reductions: Sequence[str]) -> LearnerStepParams:
        """The call as received; `reductions`: the schedule reductions the receiving learner computes."""
        where = "learner_step"
        params = _map(params, where)
        raw, packed = params.get("samples"), "batch" in params
        if packed:
            if raw is not None:
                raise PayloadError(f"{where}: both samples and batch; send the samples one way")
            samples = _unpack_samples(params["batch"], where)
        elif not isinstance(raw, list) or not raw:
            raise PayloadError(f"{where}.samples: expected a non-empty list of samples")
        else:
            samples = _learner_samples(raw, where)
        temperature = _num(params, "temperature", where)
        if temperature <= 0:
            raise PayloadError(f"{where}.temperature: must be > 0 (the rollout temperature the behavior was drawn at)")
        objective = LearnerObjective.from_wire(params.get("objective"), f"{where}.objective")
        if objective.kl_coef != 0 and any(s.reference_logprobs is None for s in samples):
            raise PayloadError(f"{where}: objective.kl_coef is not 0, so every sample needs reference_logprobs")
        optimizer = LearnerOptimizer.from_wire(params.get("optimizer"), f"{where}.optimizer")
        lora = None if params.get("lora") is None else LoraParams.from_wire(params["lora"], f"{where}.lora")
        seed = params.get("seed", 0)
        if not _int(seed) or not 0 <= seed < 2**63:
            raise PayloadError(f"{where}.seed: expected an integer in [0, 2**63)")
        save_dir = params.get("save_dir")
        if not isinstance(save_dir, str) or not save_dir:
            raise PayloadError(f"{where}.save_dir: expected the folder to write the updated adapter to")
        schedule = params.get("schedule")
        return cls(samples, temperature, objective, optimizer, lora, seed, save_dir,
                   None if schedule is None else Schedule.from_wire(schedule, reductions), packed)


@dataclass(frozen=True)
class LearnerStepResult:
    """What the learner reports for one update: its own reading of the batch at the start weights, the objective's
    terms (means over the batch's tokens), and the checkpoint it saved."""

    proximal_logprobs: Sequence[np.ndarray]
    """float32 [T_i] per sample: the tokens under the start weights, at the step's temperature."""
    loss: float
    policy: float
    kl: float
    importance_weight_mean: float
    tokens: int
    """N, the batch's token count the means divide by."""
    grad_norm: float
    """The gradient's norm before clipping."""
    adapter_dir: str
    adapter_digest: str
    """The saved folder's tree digest."""
    adapter_tensors: Mapping[str, Any]
    """{tensor name: {shape, dtype}} of the saved adapter's weights."""
    start_adapter_digest: str | None
    """The adapter the update started from; None for a fresh one."""
    optimizer_steps: int
    model_digest: str
    packed: bool = False
    """The proximal log-probabilities travel as columns (`proximal_batch`: the lengths and one array), as a learner
    answers a call whose batch did; False: one array per sample (`proximal_logprobs`)."""

    def to_wire(self) -> dict[str, Any]:
        proximal: dict[str, Any] = {"proximal_batch": {
            "lengths": np.array([p.size for p in self.proximal_logprobs], _I64),
            "logprobs": np.concatenate([np.zeros(0, np.float32), *self.proximal_logprobs])}} if self.packed else \
            {"proximal_logprobs": list(self.proximal_logprobs)}
        return {**proximal, "loss": self.loss, "policy": self.policy,
                "kl": self.kl, "importance_weight_mean": self.importance_weight_mean, "tokens": self.tokens,
                "grad_norm": self.grad_norm, "adapter_dir": self.adapter_dir, "adapter_digest": self.adapter_digest,
                "adapter_tensors": dict(self.adapter_tensors), "start_adapter_digest": self.start_adapter_digest,
                "optimizer_steps": self.optimizer_steps, "model_digest": self.model_digest}

    @classmethod
    def received(cls, result: Any, where: str = "learner_step") -> LearnerStepResult:
        """`from_wire` for the core, reading a worker's report: `EvidenceError` naming the field."""
        return read_received(lambda: cls.from_wire(result, where))

    @classmethod
    def from_wire(cls, result: Any, where: str = "learner_step") -> LearnerStepResult:
        result = _map(result, where)
        packed = "proximal_batch" in result
        if packed:
            batch = _map(result["proximal_batch"], f"{where}.proximal_batch")
            lengths = _lengths(batch.get("lengths"), f"{where}.proximal_batch.lengths", least=0)
            values = batch.get("logprobs")
            if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.shape != (
                    int(lengths.sum()),):
                raise PayloadError(f"{where}.proximal_batch.logprobs: expected a float32 vector of the lengths' sum "
                                   f"({int(lengths.sum())})")
            proximal = _cut(values, lengths)
        else:
            proximal = _get(result, "proximal_logprobs", list, where)
            for i, p in enumerate(proximal):
                if not isinstance(p, np.ndarray) or p.dtype != np.float32 or p.ndim != 1:
                    raise PayloadError(f"{where}.proximal_logprobs[{i}]: expected a float32 vector of "
                                       "log-probabilities")

        def number(name: str) -> float:
            value = result.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise PayloadError(f"{where}: {name} must be a finite number, got {value!r}")
            return value

        return cls(proximal, number("loss"), number("policy"), number("kl"), number("importance_weight_mean"),
                   _get(result, "tokens", int, where), number("grad_norm"), _get(result, "adapter_dir", str, where),
                   _get(result, "adapter_digest", str, where), _get(result, "adapter_tensors", dict, where),
                   _optional_str(result, "start_adapter_digest", where, "a hex string"),
                   _get(result, "optimizer_steps", int, where), _get(result, "model_digest", str, where), packed)
