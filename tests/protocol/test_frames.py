"""The frame decoder under random and mutated input: it never hangs and raises nothing but `ProtocolError`."""

from __future__ import annotations

import contextlib
import enum
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
    """Read every frame of `data` as the client does; returns how many decoded.

    Whatever decodes must be exactly the canonical encoding of what it decodes to: that is what is recorded.
    """
    stream = io.BytesIO(data)
    n = 0
    while (payload := frames.read_frame(stream)) is not None:
        message = frames.decode_payload(payload)
        assert canonical.encode(message) == payload
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


def _value(doc: bytes) -> bytes:
    """An encoded value made of a hand-written msgpack document and no arrays."""
    return len(doc).to_bytes(4, "big") + doc


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (b"\x82\xa1b\x01\xa1a\x02", "keys out of order"),
        (b"\x82\xa1a\x01\xa1a\x02", "a repeated key"),
        (b"\x81\xa1a\xcc\x05", "5 as a uint8"),
        (b"\x81\xa1a\xd0\x05", "5 as an int8"),
        (b"\x81\xa1a\xd1\xff\xff", "-1 as an int16"),
        (b"\x81\xa1a\xcf" + (2**20).to_bytes(8, "big"), "2**20 as a uint64"),
        (b"\x81\xa1a\xca\x3f\x00\x00\x00", "0.5 as a float32"),
        (b"\x81\xd9\x01a\x01", "a key with a str8 header"),
        (b"\x81\xa1a\xc5\x00\x01z", "bytes with a bin16 header"),
        (b"\xdc\x00\x01\x01", "a list with an array16 header"),
        (b"\xde\x00\x01\xa1a\x01", "a map with a map16 header"),
    ],
)
def test_second_spellings_of_a_value_do_not_decode(doc: bytes, why: str) -> None:
    # Every one of these decodes with plain msgpack: recording one would keep bytes no re-encoding reproduces.
    with pytest.raises(canonical.NotCanonicalError, match="not in canonical form"):
        canonical.decode(_value(doc))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"\xd7\x01", b"\xc7\x08\x01"),  # the extension's fixext8 header written as ext8
        # the array's offset 0 written as a uint8 inside the extension (whose header then says 9 bytes)
        (b"\xd7\x01\x94\xa3|u1\x90\x00\x01", b"\xc7\x09\x01\x94\xa3|u1\x90\xcc\x00\x01"),
    ],
)
def test_array_extension_spelled_twice_does_not_decode(old: bytes, new: bytes) -> None:
    data = canonical.encode({"a": np.array(7, dtype=np.uint8)})
    doc_len = int.from_bytes(data[:4], "big")
    doc = data[4:4 + doc_len]
    assert doc.count(old) == 1
    doc = doc.replace(old, new)
    blob = data[4 + doc_len + (-(4 + doc_len) % 16):]
    respelled = _value(doc) + bytes(-(4 + len(doc)) % 16) + blob
    assert canonical.decode(data)["a"] == 7
    with pytest.raises(canonical.NotCanonicalError, match="not in canonical form"):
        canonical.decode(respelled)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (b"\x81\xc4\x01k\x01", "map key b'k' is not a string"),
        (b"\x81\x01\x01", "malformed msgpack"),
        (b"\xd6\xff\x00\x00\x00\x01", r"unknown msgpack extension -1 \(a timestamp\)"),
        (b"\x91" * 64 + b"\x90", "nested deeper than 64 levels"),
        (b"\x91" * 500 + b"\x90", "nested deeper than 64 levels"),
        (b"\x91" * 5000 + b"\x90", "nested deeper than 64 levels"),
        (b"\x81\xa1a" * 300 + b"\xc0", "nested deeper than 64 levels"),
    ],
)
def test_what_encode_never_writes_does_not_decode(doc: bytes, message: str) -> None:
    with pytest.raises(canonical.CanonicalError, match=message):
        canonical.decode(_value(doc))


def test_nesting_up_to_the_limit_round_trips_and_beyond_it_is_refused_both_ways() -> None:
    value: object = []
    for _ in range(canonical.MAX_DEPTH - 1):
        value = [value]
    assert canonical.decode(canonical.encode(value)) == value
    with pytest.raises(canonical.CanonicalError, match="nested deeper than 64 levels"):
        canonical.encode([value])
    deep: object = {}
    for _ in range(2000):  # past Python's recursion limit: still one clear error
        deep = {"a": deep}
    with pytest.raises(canonical.CanonicalError, match="nested deeper than 64 levels"):
        canonical.encode(deep)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(canonical.CanonicalError, match="nested deeper than 64 levels"):
        canonical.encode(loop)


class _Colour(enum.StrEnum):
    RED = "red"


class _Size(enum.IntEnum):
    BIG = 3


def test_encode_refuses_what_has_no_encoding_with_canonical_error_only() -> None:
    for value, message in [
        ("\ud800", "UnicodeEncodeError"),
        ({"\udfff": 1}, "UnicodeEncodeError"),
        ({1: "a"}, "map key 1 is not a string"),
        (2**64, "does not fit in 64 bits"),
        (-(2**63) - 1, "does not fit in 64 bits"),
        (object(), "type object has no canonical encoding"),
        (np.array(["a"]), "dtype <U1 is not supported"),
    ]:
        with pytest.raises(canonical.CanonicalError, match=message):
            canonical.encode(value)


def test_subclasses_of_plain_types_encode_as_the_value_they_hold() -> None:
    value = {_Colour.RED: [_Colour.RED, _Size.BIG, np.float64(0.25), np.float32(0.5), np.int16(-2), np.bool_(True)]}
    plain = {"red": ["red", 3, 0.25, 0.5, -2, True]}
    assert canonical.encode(value) == canonical.encode(plain)
    back = canonical.decode(canonical.encode(value))
    assert back == plain
    assert [type(x) for x in back["red"]] == [str, int, float, float, int, bool]


def test_zero_dimensional_arrays_keep_their_shape() -> None:
    for value in (np.array(7, dtype=np.uint8), np.array(2.5, dtype=np.float32),
                  canonical.BFloat16Array(np.array(0x3F80, dtype=np.uint16))):
        back = canonical.decode(canonical.encode({"a": value}))["a"]
        bits = back.bits if isinstance(back, canonical.BFloat16Array) else back
        assert bits.shape == ()
        assert bits.tobytes() == (value.bits if isinstance(value, canonical.BFloat16Array) else value).tobytes()


def test_a_length_that_lies_costs_the_bytes_that_came_not_the_length_announced() -> None:
    """A frame announcing 1.5 GiB that delivers 8 MiB and ends: refused as truncated, having taken memory for what
    arrived (the reader once allocated, and zero-filled, the whole announced length)."""
    import subprocess
    import sys

    script = (
        "import io, resource\n"
        "from invar.errors import ProtocolError\n"
        "from invar.protocol import frames\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "stream = io.BytesIO(frames.HEADER.pack(frames.MAGIC, 3 << 29) + b'x' * (8 << 20))\n"
        "try:\n"
        "    frames.read_frame(stream)\n"
        "except ProtocolError as exc:\n"
        "    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    message, grown_mib = out.stdout.splitlines()
    assert message == f"truncated frame: {8 << 20} of {3 << 29} payload bytes before end of stream"
    assert int(grown_mib) < 64  # the 8 MiB that came (and the 8 MiB stream itself), not 1.5 GiB


def test_a_large_frame_round_trips_through_its_lazy_buffer() -> None:
    arr = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: past the first megabyte read into a bytearray
    payload = canonical.encode({"kind": "report", "a": arr})
    got = frames.read_frame(io.BytesIO(frames.encode_frame(payload)))
    assert got is not None
    assert bytes(got) == payload
    back = frames.decode_payload(got)["a"]
    assert back.tobytes() == arr.tobytes()
    assert not back.flags.writeable
