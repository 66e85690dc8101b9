"""The frame decoder under random and mutated input: it never hangs and raises nothing but `ProtocolError`."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar import canonical
from invar.errors import ProtocolError
from invar.protocol import frames
from invar.protocol.messages import Call, Report

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _good_stream() -> bytes:
    call = Call(7, "generate", {"requests": [{"prompt": "37+58=", "seed": 3}],
                               "arr": np.arange(6, dtype=np.float32).reshape(2, 3)})
    report = Report(7, "a" * 64, "b" * 64, result={"tokens": np.array([1, 2, 3], dtype=np.int32)})
    return b"".join(frames.encode_frame(canonical.encode(m.to_wire())) for m in (call, report))


def _drain(data: bytes) -> int:
    """Read every frame of `data` as the client does; returns how many decoded."""
    stream = io.BytesIO(data)
    n = 0
    while (payload := frames.read_frame(stream)) is not None:
        message = frames.decode_payload(payload)
        kind = message.get("kind")
        if kind == "call":
            Call.from_wire(message)
        elif kind == "report":
            Report.from_wire(message)
        n += 1
    return n


def test_good_stream_decodes() -> None:
    assert _drain(_good_stream()) == 2


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_else(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        _drain(data)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_frames_never_raise_anything_else(data: st.DataObject) -> None:
    stream = bytearray(_good_stream())
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "len"]))
        pos = data.draw(st.integers(0, len(stream) - 1))
        if op == "flip":
            stream[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del stream[pos:]
            if not stream:
                stream = bytearray(b"\x00")
        elif op == "insert":
            stream[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:  # rewrite a length field to something implausible, within the stream or huge
            stream[4:8] = data.draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
    with contextlib.suppress(ProtocolError):
        _drain(bytes(stream))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=10), _values, max_size=6))
def test_any_payload_map_decodes_or_is_rejected_cleanly(params: dict[str, object]) -> None:
    payload = canonical.encode({"kind": "report", "call_id": 1, "call_digest": "x", "identity_digest": "y",
                                "ok": True, "result": params})
    frame = frames.encode_frame(payload)
    assert _drain(frame) == 1
    assert frames.decode_payload(frames.read_frame(io.BytesIO(frame)) or b"") == canonical.decode(payload)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_arbitrary_messages_fail_only_with_protocol_error(value: object) -> None:
    with contextlib.suppress(ProtocolError):
        _drain(frames.encode_frame(canonical.encode(value)))


def test_canonical_encoding_is_order_independent() -> None:
    a = {"b": 1, "a": [1.5, {"y": 2, "x": 3}]}
    b = {"a": [1.5, {"x": 3, "y": 2}], "b": 1}
    assert canonical.encode(a) == canonical.encode(b)
    assert canonical.digest(a) == canonical.digest(b)


def test_arrays_decode_as_aligned_read_only_views_and_padding_is_checked() -> None:
    value = {"a": np.arange(3, dtype=np.int8), "b": "text", "c": np.arange(5, dtype=np.float64)}
    data = bytearray(canonical.encode(value))
    back = canonical.decode(data)
    for key in ("a", "c"):
        assert back[key].ctypes.data % 16 == 0
        assert not back[key].flags.writeable
        assert back[key].tobytes() == value[key].tobytes()
    # A non-zero padding byte (between the 3-byte array and the next) makes a second encoding of the same value.
    doc_len = int.from_bytes(data[:4], "big")
    blob_start = 4 + doc_len + (-(4 + doc_len) % 16)
    data[blob_start + 3] = 1
    with pytest.raises(canonical.CanonicalError, match="padding"):
        canonical.decode(data)
