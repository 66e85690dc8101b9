"""Mutated report frames through the client's own accept path: nothing escapes but `ProtocolError`, and whatever is
accepted (and so recorded) is exactly the canonical encoding of what it decodes to.

Frames are made three ways, from real reports answering a real call:
- respelled: the report's own value written with msgpack's other legal spellings (a wider integer, a float32, a
  longer header, keys out of order, a repeated key); each spells the same value, so the client must accept exactly
  the frames whose bytes are the canonical ones and refuse every other spelling;
- hostile: a node of the report replaced by another value, often one `encode` never writes (bytes keys, nesting
  past 64 levels, foreign extensions, timestamps, broken array extensions, NaN payloads, a bin where a str was),
  written canonically otherwise;
- damaged: bits flipped, bytes inserted, deleted, duplicated or cut, length fields rewritten, anywhere in the frame.

Each frame goes through `frames.read_frame` and `WorkerClient._accept`, exactly as the client's reader thread runs
them, against a client whose call is in flight (no worker process: a process would only add its pipe).
"""

from __future__ import annotations

import collections
import hashlib
import io
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from fuzz_scale import SEED, scaled

from invar import canonical
from invar.errors import ProtocolError
from invar.protocol import frames
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore
from invar.transport.client import PendingCall, WorkerClient

IDENTITY = Identity(engine="fuzz", engine_version={"invar": "test"}, role=Role.INFERENCE,
                    settings={"device": "cpu"}, methods=("generate",), pid=4242)


# --- the client, with one call in flight --------------------------------------------------------------------------


class Capture:
    """A recorder that keeps what the client records (the run store's interface, in memory)."""

    def __init__(self) -> None:
        self.reports: list[bytes] = []

    def record_worker(self, identity: Any) -> str:
        return canonical.digest(dict(identity))

    def record_call(self, payload: bytes, *, worker: str) -> str:
        return canonical.sha256(payload)

    def record_report(self, payload: bytes, *, worker: str) -> str:
        self.reports.append(payload)
        return canonical.sha256(payload)


class Harness:
    """A `WorkerClient` that was never started, fed frames as its reader thread would feed them."""

    def __init__(self, recorder: Any) -> None:
        self.client = WorkerClient(["unused"], name="fuzz", recorder=recorder)
        self.client._identity = IDENTITY
        self.client._identity_digest = IDENTITY.digest
        self.client._worker_key = recorder.record_worker(IDENTITY.to_wire())
        self.recorder = recorder
        self.next_id = 1

    def send_call(self) -> tuple[int, str]:
        """Put one call in flight (recorded first, as `submit` does); returns its id and digest."""
        call_id = self.next_id
        self.next_id += 1
        call = Call(call_id, "generate", {"requests": [{"prompt": "37+58=", "seed": call_id}]})
        parts = canonical.encode_parts(call.to_wire())
        digest = canonical.sha256_parts(parts)
        self.recorder.record_call(b"".join(parts), worker=self.client._worker_key)
        self.client._pending = {call_id: PendingCall(self.client, call, digest, None)}
        self.client._answered = set()
        return call_id, digest

    def feed(self, frame: bytes) -> str:
        """Read one frame from `frame` and accept it: "accepted", "rejected" (ProtocolError) or "empty"."""
        hasher = hashlib.sha256()
        error = ""
        try:
            payload = frames.read_frame(io.BytesIO(frame), hasher)
            if payload is None:
                return "empty"
            self.client._accept(payload, hasher.hexdigest())
        except ProtocolError as exc:
            error = str(exc)
        assert "\n" not in error
        return "rejected" if error else "accepted"


# --- reports to mutate ---------------------------------------------------------------------------------------------


def reports(call_id: int, call_digest: str) -> list[dict[str, Any]]:
    """Real reports answering the call: a generate result, a result of every kind of value, an error."""
    rng = np.random.default_rng(call_id)
    generate = {"outputs": [{"request_id": f"u-{i:06d}", "prompt_tokens": rng.integers(0, 20, 6, dtype=np.int32),
                             "tokens": rng.integers(0, 20, 5, dtype=np.int32),
                             "logprobs": -rng.random(5, dtype=np.float32), "finish_reason": "stop"} for i in range(3)],
                "model_digest": "c" * 64, "adapter_digest": None}
    kinds = {"n": 300, "neg": -40000, "big": 2**40, "huge": 2**64 - 1, "low": -(2**63), "x": 0.1, "half": 0.5,
             "inf": float("inf"), "nz": -0.0, "flag": True, "none": None, "blob": b"\x00\x01\xff", "text": "37+58=é",
             "nested": {"a": [1, [2, {"b": "ü", "c": []}]], "d": {}}, "bf": canonical.BFloat16Array(
                 np.array([[0x3F80, 0xBF80]], dtype=np.uint16)), "scalar": np.array(7, dtype=np.uint8),
             "bools": np.array([True, False]), "f64": np.arange(3, dtype=np.float64) / 3}
    common = Report(call_id, call_digest, IDENTITY.digest)
    return [
        Report(common.call_id, common.call_digest, common.identity_digest, result=generate).to_wire(),
        Report(common.call_id, common.call_digest, common.identity_digest, result=kinds).to_wire(),
        {**common.to_wire(), "ok": False, "error": {"type": "ValueError", "message": "bad input"}, "result": None},
    ]


@dataclass(frozen=True)
class Template:
    """A report's canonical payload, its document as msgpack values (arrays as their extensions), and the bytes
    that follow the document (padding and array bytes)."""

    payload: bytes
    skeleton: Any
    tail_blobs: bytes
    paths: list[tuple[Any, ...]]
    """Every node below the top: what a mutation may replace or respell."""


def template(report: dict[str, Any]) -> Template:
    if report.get("ok") is False:
        report = {k: v for k, v in report.items() if k != "result"}
    payload = canonical.encode(report)
    doc_len = int.from_bytes(payload[:4], "big")
    doc = payload[4:4 + doc_len]
    skeleton = msgpack.unpackb(doc, raw=False, ext_hook=msgpack.ExtType)
    blobs = payload[4 + doc_len + (-(4 + doc_len) % 16):]
    return Template(payload, skeleton, blobs, _paths(skeleton)[1:])


def assemble(doc: bytes, blobs: bytes) -> bytes:
    """A payload: document length, document, zero padding to 16, then the array bytes (offsets are relative)."""
    if not blobs:
        return len(doc).to_bytes(4, "big") + doc
    return len(doc).to_bytes(4, "big") + doc + bytes(-(4 + len(doc)) % 16) + blobs


# --- writing a node in another legal spelling -----------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are (a hostile node, or one respelled)."""

    data: bytes


def _pack(v: Any) -> bytes:
    """The canonical document bytes of a skeleton value (its maps are already in sorted order)."""
    return msgpack.packb(v, use_bin_type=True)  # type: ignore[no-any-return]


def _header(n: int, fix: tuple[int, int] | None, codes: tuple[int, int, int]) -> list[bytes]:
    """Every legal header for a length-`n` item, shortest first: fix (base, limit), then 8/16/32-bit lengths."""
    options: list[bytes] = []
    if fix is not None and n < fix[1]:
        options.append(bytes([fix[0] | n]))
    for code, width in zip(codes, (1, 2, 4), strict=True):
        if code and n < 1 << (8 * width):
            options.append(bytes([code]) + n.to_bytes(width, "big"))
    return options


_INT_FORMS = ((0xCC, ">B", 0, 2**8), (0xCD, ">H", 0, 2**16), (0xCE, ">I", 0, 2**32), (0xCF, ">Q", 0, 2**64),
              (0xD0, ">b", -(2**7), 2**7), (0xD1, ">h", -(2**15), 2**15), (0xD2, ">i", -(2**31), 2**31),
              (0xD3, ">q", -(2**63), 2**63))


def respell(v: Any, rng: random.Random) -> bytes | None:
    """`v` written in one legal spelling other than the canonical one (its children canonical), or None if it has
    no other: a wider integer or header, a float32 that holds the same value, keys out of order, a repeated key."""
    options: list[bytes] = []
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        options = [bytes([code]) + struct.pack(fmt, v) for code, fmt, lo, hi in _INT_FORMS if lo <= v < hi]
    elif isinstance(v, float):
        single = struct.pack(">f", v)
        if struct.unpack(">f", single)[0] == v or v != v:
            options = [b"\xca" + single]
    elif isinstance(v, str | bytes):
        data = v.encode() if isinstance(v, str) else v
        heads = (_header(len(data), (0xA0, 32), (0xD9, 0xDA, 0xDB)) if isinstance(v, str)
                 else _header(len(data), None, (0xC4, 0xC5, 0xC6)))
        options = [h + data for h in heads]
    elif isinstance(v, msgpack.ExtType):
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        heads = ([bytes([fixed[len(v.data)]])] if len(v.data) in fixed else []) + [
            bytes([code]) + len(v.data).to_bytes(width, "big")
            for code, width in ((0xC7, 1), (0xC8, 2), (0xC9, 4)) if len(v.data) < 1 << (8 * width)]
        options = [h + bytes([v.code]) + v.data for h in heads]
    elif isinstance(v, list):
        body = b"".join(_pack(x) for x in v)
        options = [h + body for h in _header(len(v), (0x90, 16), (0, 0xDC, 0xDD))]
    elif isinstance(v, dict):
        pairs = [_pack(k) + _pack(x) for k, x in v.items()]
        options = [h + b"".join(pairs) for h in _header(len(pairs), (0x80, 16), (0, 0xDE, 0xDF))]
        if len(pairs) > 1:
            shuffled = pairs[:]
            while shuffled == pairs:
                rng.shuffle(shuffled)
            options.append(_header(len(pairs), (0x80, 16), (0, 0xDE, 0xDF))[0] + b"".join(shuffled))
        if pairs:
            doubled = pairs[:]
            doubled.insert(rng.randrange(len(pairs) + 1), rng.choice(pairs))
            options.append(_header(len(doubled), (0x80, 16), (0, 0xDE, 0xDF))[0] + b"".join(doubled))
    canonical_form = _pack(v)
    options = [o for o in options if o != canonical_form]
    return rng.choice(options) if options else None


def write_with(skeleton: Any, nodes: dict[tuple[Any, ...], bytes]) -> bytes:
    """The skeleton's document, with the node at each path written as the given bytes instead."""
    value = skeleton
    marks: dict[bytes, bytes] = {}
    for i, (path, data) in enumerate(nodes.items()):
        mark = f"\x00invar-fuzz-node-{i}\x00"
        value = _replaced(value, path, mark)
        marks[_pack(mark)] = data
    doc = _pack(value)
    for mark_bytes, data in marks.items():
        assert doc.count(mark_bytes) == 1
        doc = doc.replace(mark_bytes, data)
    return doc


# --- the three ways to make a frame --------------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out.extend(_paths(child, (*prefix, i)))
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    if isinstance(value, dict):
        return {k: (_replaced(v, path[1:], new) if k == path[0] else v) for k, v in value.items()}
    return [(_replaced(v, path[1:], new) if i == path[0] else v) for i, v in enumerate(value)]


def _hostile(rng: random.Random) -> bytes:
    depth = rng.choice([63, 64, 65, 100, 1023, 1100, 3000])
    nan_bits = struct.pack(">Q", 0x7FF0000000000000 | rng.randrange(1, 1 << 52))
    raw = rng.choice([
        b"\x81\xc4\x01k\x01", b"\x82\xa1a\x01\xc4\x01b\x02", b"\x81\x01\x01", b"\x81\xc0\x01", b"\x81\xc3\x01",
        b"\x91" * depth + b"\xc0", b"\x81\xa1a" * depth + b"\xc0", b"\xd6\xff\x00\x00\x00\x01",
        b"\xc7\x0c\xff" + bytes(12), b"\xd4\x05x", b"\xc7\x05\x01\x94\xa3<f4", b"\xd4\x01\xc1",
        b"\xcb" + nan_bits, b"\xcb\x80" + bytes(7), b"\xa2\xff\xfe", b"\xc1", b"\xd9\x05abc",
        b"\xa3\xed\xa0\x80", b"\xc4\x08generate", b"\xc4\x06report", b"\xcf" + bytes([0xFF] * 8),
        b"\xd3\x80" + bytes(7), b"\x90", b"\x80", b"\xa0", b"\xc2", b"\xc3", b"\xc0",
        _pack("x" * rng.choice([31, 32, 255, 256, 65536])),
    ])
    ext_fields = rng.choice([["<f4", [1], 0, 4], ["<U1", [1], 0, 4], ["<f4", [-1], 0, 4], ["<f4", [1], 0, 3],
                             ["<f4", [1], 16, 4], ["bfloat16", [3], 0, 4], ["<f4", [2**40, 0], 0, 0], [1, 2, 3]])
    return rng.choice([raw, raw, raw, _pack(msgpack.ExtType(1, _pack(ext_fields)))])


def respelled(t: Template, rng: random.Random) -> tuple[bytes, bool]:
    """The report with 0-3 of its nodes respelled; True when its bytes are still the canonical ones."""
    chosen: dict[tuple[Any, ...], bytes] = {}
    for path in rng.sample(t.paths, rng.choice([0, 0, 1, 1, 1, 2, 3])):
        if any(path[:len(p)] == p or p[:len(path)] == path for p in chosen):
            continue  # one inside another: the outer one's children are written canonically
        data = respell(_at(t.skeleton, path), rng)
        if data is not None:
            chosen[path] = data
    payload = assemble(write_with(t.skeleton, chosen), t.tail_blobs)
    assert (payload == t.payload) == (not chosen)
    return payload, not chosen


def hostile(t: Template, rng: random.Random) -> bytes:
    return assemble(write_with(t.skeleton, {rng.choice(t.paths): _hostile(rng)}), t.tail_blobs)


def damaged(frame: bytes, rng: random.Random) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(["flip", "flip", "set", "insert", "delete", "duplicate", "cut", "length"])
        pos = rng.randrange(len(data)) if data else 0
        if op == "flip" and data:
            data[pos] ^= 1 << rng.randrange(8)
        elif op == "set" and data:
            data[pos] = rng.randrange(256)
        elif op == "insert":
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == "delete":
            del data[pos:pos + rng.randint(1, 8)]
        elif op == "duplicate":
            data[pos:pos] = data[pos:pos + rng.randint(1, 32)]
        elif op == "cut":
            del data[pos:]
        elif len(data) >= 12:  # rewrite the frame's or the document's length
            at = rng.choice([4, 8])
            data[at:at + 4] = rng.choice([0, 1, len(data), len(data) - 8, 2**31 - 1, 2**32 - 1,
                                          rng.randrange(2**32)]).to_bytes(4, "big")
    return bytes(data)


# --- the run -------------------------------------------------------------------------------------------------------


def _independently_canonical(payload: bytes) -> bool:
    """The document re-written by plain msgpack with sorted string keys: the canonical form, computed apart from
    `invar.canonical`, so the check does not trust the code it checks."""
    doc_len = int.from_bytes(payload[:4], "big")
    value = msgpack.unpackb(payload[4:4 + doc_len], raw=False, strict_map_key=False, ext_hook=msgpack.ExtType)

    def sort(v: Any) -> Any:
        if isinstance(v, dict):
            assert all(type(k) is str for k in v)
            return {k: sort(v[k]) for k in sorted(v)}
        return [sort(x) for x in v] if isinstance(v, list) else v

    return msgpack.packb(sort(value), use_bin_type=True) == payload[4:4 + doc_len]  # type: ignore[no-any-return]


def fuzz(count: int, seed: int, harness: Harness | None = None) -> collections.Counter[str]:
    """Feed `count` mutated frames through the accept path; returns outcomes counted by how each frame was made."""
    rng = random.Random(seed)
    capture = Capture()
    h = harness or Harness(capture)
    call_id, call_digest = h.send_call()
    templates = [template(r) for r in reports(call_id, call_digest)]
    outcomes: collections.Counter[str] = collections.Counter()
    makers: list[tuple[str, Callable[[Template], tuple[bytes, bool | None]]]] = [
        ("respelled", lambda t: respelled(t, rng)),
        ("hostile", lambda t: (hostile(t, rng), None)),
        ("damaged", lambda t: (damaged(frames.encode_frame(t.payload), rng), None)),
        ("damaged-respelled", lambda t: (damaged(frames.encode_frame(respelled(t, rng)[0]), rng), None)),
    ]
    for i in range(count):
        if harness is not None and i:  # a real store needs a new call for every report it keeps
            call_id, call_digest = h.send_call()
            templates = [template(r) for r in reports(call_id, call_digest)]
        else:
            h.client._pending = {call_id: h.client._pending.get(call_id) or PendingCall(
                h.client, Call(call_id, "generate", {}), call_digest, None)}
            h.client._answered = set()
        name, make = makers[i % len(makers)] if i % 8 else makers[0]
        data, is_canonical = make(rng.choice(templates))
        frame = data if name.startswith("damaged") else frames.encode_frame(data)
        before = len(capture.reports)
        outcome = h.feed(frame)
        outcomes[f"{name} {outcome}"] += 1
        if is_canonical is not None:  # respelled: accepted exactly when the bytes are the canonical ones
            assert (outcome == "accepted") == is_canonical, (i, seed, outcome)
        if outcome == "accepted" and harness is None:
            kept = capture.reports[before]
            assert canonical.encode(canonical.decode(kept)) == kept, (i, seed)
            assert _independently_canonical(kept), (i, seed)
    return outcomes


def _report(outcomes: collections.Counter[str], count: int, seconds: float) -> None:
    print(f"\n{count:,} frames in {seconds:.1f} s ({count / seconds:,.0f}/s): "
          + ", ".join(f"{k}: {v:,}" for k, v in sorted(outcomes.items())))


def _run(count: int) -> None:
    t0 = time.perf_counter()
    outcomes = fuzz(count, SEED)
    _report(outcomes, count, time.perf_counter() - t0)
    assert sum(outcomes.values()) == count
    # Every way of making a frame was exercised, and canonical frames were accepted, not merely everything refused.
    for name in ("respelled", "hostile", "damaged", "damaged-respelled"):
        assert outcomes[f"{name} rejected"] > 0, name
    assert outcomes["respelled accepted"] > count // 20
    assert outcomes["damaged accepted"] > 0  # a changed value that is still canonical is a report like any other


def test_mutated_frames_are_refused_or_canonical() -> None:
    _run(scaled(6_000))


@pytest.mark.slow
def test_mutated_frames_are_refused_or_canonical_at_scale() -> None:
    _run(scaled(120_000))


def test_accepted_frames_verify_in_a_real_store(tmp_path: Path) -> None:
    # The finding this guards: a non-canonical report was accepted, recorded, and the store failed verification.
    store = RunStore.create(tmp_path / "run")
    harness = Harness(store)
    outcomes = fuzz(scaled(300), SEED + 1, harness)
    accepted = sum(v for k, v in outcomes.items() if k.endswith(" accepted"))
    assert accepted > 0
    v = store.verify()
    assert (v.workers, v.calls, v.reports) == (1, harness.next_id - 1, accepted)


def test_a_kind_that_is_an_array_is_refused_not_a_crash() -> None:
    # Found by the fuzzer: comparing an array with "report" is elementwise, and its truth value raised ValueError.
    harness = Harness(Capture())
    call_id, digest = harness.send_call()
    report = Report(call_id, digest, IDENTITY.digest, result={}).to_wire()
    for kind in (np.zeros(0, dtype=np.float32), np.array([1, 2], dtype=np.int8)):
        frame = frames.encode_frame(canonical.encode({**report, "kind": kind}))
        with pytest.raises(ProtocolError, match=r"expected a report, got kind array\("):
            harness.client._accept(bytearray(frame[8:]), "")
