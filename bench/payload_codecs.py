"""The payload codecs measured: the hand-written `from_wire`/`to_wire` of `invar.protocol.payloads` against msgspec
structs (prime-rl's choice for its wire types) doing the same job.

Both sides start from the same decoded map (what `invar.canonical.decode` gives a worker or the core) and must give
back a map whose canonical bytes are the bytes it was read from: every call and record digest is computed over those
bytes. Measured per `generate` call of 32 requests (the core's largest call on the shipped model, the walkthrough's
b32 layout) and its result (32 outputs of 5 to 64 tokens): reading the params (worker side), writing them (core
side), reading the result (core side). msgspec cannot write the result back through `to_builtins` (numpy arrays are
no builtin type, and an `enc_hook` that hands the array back recurses), so that cell is the hand-written one's alone.

    .venv/bin/python bench/payload_codecs.py [--rounds 7] [--json docs/performance/payload_codecs.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from invar import canonical  # noqa: E402
from invar.protocol.payloads import (  # noqa: E402
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
    GenerateResult,
    PayloadError,
)

# -- the msgspec structs: the same fields, with what msgspec can say of them ------------------------------------------
# An integer temperature must stay an integer on the wire (a float field would write 1 back as 1.0 and change the
# call's bytes), hence `int | float`; `top_p` is required because msgspec cannot both default a missing field on read
# and always write it (the hand-written reader defaults it to 1.0, the writer always writes it).

Seed = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Temperature = Annotated[int, msgspec.Meta(ge=0)] | Annotated[float, msgspec.Meta(ge=0)]
TopP = Annotated[int, msgspec.Meta(gt=0, le=1)] | Annotated[float, msgspec.Meta(gt=0, le=1)]


class RequestM(msgspec.Struct, frozen=True, omit_defaults=True):
    request_id: str
    prompt_ids: Annotated[list[int], msgspec.Meta(min_length=1)]
    seed: Seed
    temperature: Temperature
    top_p: TopP
    max_tokens: Positive
    prompt: str | None = None
    top_logprobs: Positive | None = None


class ParamsM(msgspec.Struct, frozen=True, omit_defaults=True):
    requests: Annotated[list[RequestM], msgspec.Meta(min_length=1)]
    adapter: str | None
    reference_adapter: str | None
    layout: list[Annotated[list[int], msgspec.Meta(min_length=1)]] | None = None

    def __post_init__(self) -> None:
        # What no annotation says: unique request ids, a layout naming every request once.
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("generate.requests: a request_id is used twice")
        if self.layout is not None and sorted(i for b in self.layout for i in b) != list(range(len(ids))):
            raise ValueError(f"generate.layout: must name every request index 0..{len(ids) - 1} exactly once")


class OutputM(msgspec.Struct, frozen=True, omit_defaults=True):
    request_id: str
    prompt_tokens: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: Literal["stop", "length"]
    reference_logprobs: np.ndarray | None = None

    def __post_init__(self) -> None:
        # The arrays' checks, as `GenerateOutput.from_wire` makes them (msgspec sees only "an ndarray").
        if self.tokens.dtype != np.int32 or self.tokens.ndim != 1:
            raise ValueError(f"{self.request_id}: tokens are not an int32 vector")
        if self.logprobs.dtype != np.float32 or self.logprobs.shape != self.tokens.shape:
            raise ValueError(f"{self.request_id}: logprobs are not a float32 vector as long as tokens")
        if self.reference_logprobs is not None and (self.reference_logprobs.dtype != np.float32
                                                    or self.reference_logprobs.shape != self.tokens.shape):
            raise ValueError(f"{self.request_id}: reference_logprobs are not a float32 vector as long as tokens")
        if self.prompt_tokens.ndim != 1 or self.prompt_tokens.dtype.kind not in "iu":
            raise ValueError(f"{self.request_id}: prompt_tokens are not an integer vector")


class ResultM(msgspec.Struct, frozen=True, omit_defaults=True):
    outputs: list[OutputM]
    model_digest: str
    adapter_digest: str | None
    patch_calls: dict[str, int] | None = None


def _array(kind: type, value: Any) -> Any:
    """msgspec's `dec_hook` for the arrays: kept as received; their dtype and shape are then checked by hand."""
    if kind is np.ndarray and isinstance(value, np.ndarray):
        return value
    raise NotImplementedError(f"cannot read {type(value).__name__} as {kind}")


def call_and_result() -> tuple[dict[str, Any], dict[str, Any]]:
    """A 32-request generate call as the core writes it and a result as a worker writes it, each decoded from its
    canonical bytes (so arrays are the views a receiver holds)."""
    rng = np.random.default_rng(0)
    requests = [{"request_id": f"u-{i:06d}", "prompt": f"{i}+{i}=", "prompt_ids": [int(t) for t in
                 rng.integers(4, 60, 12)], "seed": int(rng.integers(0, 2**62)), "temperature": 1.0, "top_p": 1.0,
                 "max_tokens": 64} for i in range(32)]
    params = {"requests": requests, "layout": [list(range(16)), list(range(16, 32))], "adapter": None,
              "reference_adapter": None}
    outputs = []
    for i, r in enumerate(requests):
        n = 5 if i % 4 else 64
        outputs.append({"request_id": r["request_id"], "prompt_tokens": np.array(r["prompt_ids"], dtype=np.int32),
                        "tokens": rng.integers(4, 60, n).astype(np.int32),
                        "logprobs": -rng.random(n).astype(np.float32), "finish_reason": "stop"})
    result = {"outputs": outputs, "model_digest": "0" * 64, "adapter_digest": None}
    return canonical.decode(canonical.encode(params)), canonical.decode(canonical.encode(result))


def _median_us(fn: Callable[[], object], rounds: int, number: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times) * 1e6


def measure(rounds: int, number: int) -> dict[str, Any]:
    params, result = call_and_result()
    p_hand, r_hand = GenerateParams.from_wire(params), GenerateResult.from_wire(result)
    p_ms = msgspec.convert(params, ParamsM)
    r_ms = msgspec.convert(result, ResultM, dec_hook=_array)
    # The bytes every digest depends on: both writers must give back the bytes that were read.
    same: dict[str, bool | str] = {
        "params_hand": canonical.encode(p_hand.to_wire()) == canonical.encode(params),
        "params_msgspec": canonical.encode(msgspec.to_builtins(p_ms)) == canonical.encode(params),
        "result_hand": canonical.encode(r_hand.to_wire()) == canonical.encode(result),
    }
    try:
        msgspec.to_builtins(r_ms, enc_hook=lambda a: a)
        same["result_msgspec"] = True
    except (RecursionError, TypeError) as exc:
        same["result_msgspec_error"] = f"{type(exc).__name__}: {exc}"
    bad = {**params, "requests": [{**params["requests"][0], "seed": -1}, *params["requests"][1:]]}
    messages = {}
    try:
        GenerateParams.from_wire(bad)
    except PayloadError as exc:
        messages["hand"] = str(exc)
    try:
        msgspec.convert(bad, ParamsM)
    except msgspec.ValidationError as exc:
        messages["msgspec"] = str(exc)
    us = {
        "read_params": {"hand": _median_us(lambda: GenerateParams.from_wire(params), rounds, number),
                        "msgspec": _median_us(lambda: msgspec.convert(params, ParamsM), rounds, number)},
        "write_params": {"hand": _median_us(p_hand.to_wire, rounds, number),
                         "msgspec": _median_us(lambda: msgspec.to_builtins(p_ms), rounds, number)},
        "read_result": {"hand": _median_us(lambda: GenerateResult.from_wire(result), rounds, number),
                        "msgspec": _median_us(lambda: msgspec.convert(result, ResultM, dec_hook=_array), rounds,
                                              number)},
        "write_result": {"hand": _median_us(r_hand.to_wire, rounds, number), "msgspec": None},
        "canonical_encode_call": {"hand": _median_us(lambda: canonical.encode(params), rounds, number)},
    }
    hand_lines = sum(len(inspect.getsource(c).splitlines()) for c in (GenerateRequest, GenerateParams, GenerateOutput,
                                                                       GenerateResult))
    msgspec_lines = sum(len(inspect.getsource(c).splitlines()) for c in (RequestM, ParamsM, OutputM, ResultM))
    lines = {"hand": hand_lines, "msgspec": msgspec_lines,
             "what": "source lines of the four generate structs (hand: with docstrings and both directions; msgspec: "
                     "reading only, the result's writer still to be written by hand)"}
    return {"us_per_call": us, "bytes_unchanged": same, "bad_seed_message": messages, "lines": lines,
            "msgspec": msgspec.__version__, "python": platform.python_version(), "rounds": rounds, "number": number}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out = measure(args.rounds, args.number)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
