"""The canonical encoder's quick paths (plain arrays and scalars taken inside a map without a call each, one packer
per encoding for the array headers) write the very bytes of the encoding as specified: a plain reference encoder,
written from canonical.py's description, against `canonical.encode` over many documents."""

from __future__ import annotations

import enum
from typing import Any

import msgpack
import numpy as np

from invar import canonical
from invar.canonical import BFloat16Array

DTYPES = ["<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"]
INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, -1, -32, -33, -128, -129,
        -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]


class Key(enum.StrEnum):
    """A str subclass as a map key (written as the plain string it is)."""

    A = "alpha"
    B = "beta"


def reference_encode(obj: Any) -> bytes:
    """The canonical encoding as canonical.py describes it, one value at a time and nothing taken early: maps with
    sorted string keys, floats as float64, integers in msgpack's shortest form, each array an extension (code 1)
    holding msgpack([dtype, shape, offset, nbytes]) with its little-endian bytes after the document, each at a
    multiple of 16."""
    blobs: list[bytes] = []  # with any array, even an empty one, the document is padded to 16
    offset = 0

    def array(name: str, a: np.ndarray) -> msgpack.ExtType:
        nonlocal offset
        pad = -offset % 16
        blobs.append(bytes(pad))
        offset += pad
        raw = a.tobytes(order="C")
        ext = msgpack.ExtType(1, msgpack.packb([name, list(a.shape), offset, len(raw)]))
        blobs.append(raw)
        offset += len(raw)
        return ext

    def norm(o: Any) -> Any:
        if isinstance(o, BFloat16Array):
            return array("bfloat16", np.asarray(o.bits, dtype="<u2"))
        if isinstance(o, np.ndarray):
            dt = o.dtype.newbyteorder("<") if o.dtype.byteorder == ">" else o.dtype
            return array(dt.str, np.asarray(o, dtype=dt))
        if isinstance(o, dict):
            return {str.__str__(k): norm(o[k]) for k in sorted(o)}
        if isinstance(o, list | tuple):
            return [norm(v) for v in o]
        if isinstance(o, np.generic):
            return norm(o.item())
        if isinstance(o, bool) or o is None:
            return o
        if isinstance(o, int):
            return int.__int__(o)
        if isinstance(o, float):
            return float.__float__(o)
        if isinstance(o, str):
            return str.__str__(o)
        if isinstance(o, bytes):
            return bytes(o)
        raise AssertionError(f"no reference encoding for {type(o).__name__}")

    doc: bytes = msgpack.packb(norm(obj), use_bin_type=True, strict_types=True)
    head = len(doc).to_bytes(4, "big") + doc
    if not blobs:
        return head
    return head + bytes(-len(head) % 16) + b"".join(blobs)


def random_array(rng: np.random.Generator) -> Any:
    name = DTYPES[int(rng.integers(len(DTYPES)))]
    kind = int(rng.integers(9))
    shape: tuple[int, ...]
    if kind == 0:
        shape = ()
    elif kind == 1:
        shape = (0,)
    elif kind == 2:
        shape = tuple(int(x) for x in rng.integers(0, 4, int(rng.integers(2, 5))))
    elif kind == 3:
        shape = (1,) * int(rng.integers(15, 21))  # past msgpack's fixarray of dimensions
    elif kind == 4:
        shape = (int(rng.integers(20_000, 70_000)),)  # offsets past 2**16 and 2**32 bits
    else:
        shape = (int(rng.integers(1, 40)),)
    a = rng.integers(0, 256, int(np.prod(shape)) * np.dtype(name).itemsize, dtype=np.uint8).view(name).reshape(shape)
    if name == "|b1":
        a = a.view(np.uint8) % 2 == 1
    which = int(rng.integers(6))
    if which == 0 and a.ndim == 1 and a.size > 2:
        return a[::2]  # not contiguous
    if which == 1 and a.ndim >= 2:
        return a.T  # Fortran order
    if which == 2:
        return a.astype(a.dtype.newbyteorder(">"))  # big-endian: written little-endian
    if which == 3 and name == "<u2":
        return BFloat16Array(a)
    if which == 4 and a.ndim == 1 and a.size:
        return np.frombuffer(a.tobytes(), dtype=a.dtype)  # read-only, as a decoded array is
    return a


def random_value(rng: np.random.Generator, depth: int) -> Any:
    kind = int(rng.integers(14 if depth < 4 else 10))
    if kind == 0:
        return random_array(rng)
    if kind == 1:
        return INTS[int(rng.integers(len(INTS)))]
    if kind == 2:
        return float(rng.standard_normal()) * 10.0 ** int(rng.integers(-300, 300))
    if kind == 3:
        return [None, True, False, "", "é∑", b"", b"\x00\xff"][int(rng.integers(7))]
    if kind == 4:
        return [int(x) for x in rng.integers(0, 50_000, int(rng.integers(0, 20)))]  # token ids
    if kind == 5:
        return [np.float32(0.5), np.int64(-3), np.uint8(200), np.bool_(True), np.float64(1e300)][int(rng.integers(5))]
    if kind == 6:
        return random_array(rng)
    if kind == 7:
        return "x" * int(rng.integers(0, 300))
    if kind == 8:
        return Key.A
    if kind == 9:
        return float(rng.integers(-5, 5))
    if kind in (10, 11):
        keys = [f"k{int(x)}" for x in rng.integers(0, 30, int(rng.integers(0, 8)))]
        out: dict[Any, Any] = {k: random_value(rng, depth + 1) for k in keys}
        if rng.integers(4) == 0:
            out[Key.B] = random_value(rng, depth + 1)
        return out
    items = [random_value(rng, depth + 1) for _ in range(int(rng.integers(0, 6)))]
    return tuple(items) if kind == 12 else items


def test_the_encoder_writes_the_reference_bytes_over_many_documents() -> None:
    rng = np.random.default_rng(49)
    arrays = 0
    for _ in range(400):
        doc = {"samples": [random_value(rng, 1) for _ in range(int(rng.integers(1, 6)))],
               "more": random_value(rng, 0)}
        want = reference_encode(doc)
        assert canonical.encode(doc) == want
        assert canonical.sha256_parts(canonical.encode_parts(doc)) == canonical.sha256(want)
        assert canonical.encode(canonical.decode(want)) == want  # and what decodes re-encodes to its bytes
        arrays += want.count(b"\xd4\x01") + want.count(b"\xc7")  # at least some documents carry arrays
    assert arrays > 100


def test_a_learner_call_shaped_document_is_the_reference_bytes() -> None:
    # The shape the quick paths are for: hundreds of maps of plain scalars, token ids and float32/int32 arrays.
    rng = np.random.default_rng(5)
    samples = [{"advantage": float(rng.standard_normal()), "behavior_logprobs": -rng.random(n, dtype=np.float32),
                "prompt": "12*3=", "prompt_ids": [int(x) for x in rng.integers(0, 20, 8)],
                "tokens": rng.integers(0, 20, n).astype(np.int32), "reference": None, "seed": 2**63 + int(n)}
               for n in rng.integers(1, 6, 256)]
    doc = {"kind": "call", "call_id": 3, "method": "learner_step", "params": {"samples": samples, "seed": 7}}
    assert canonical.encode(doc) == reference_encode(doc)
