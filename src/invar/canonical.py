"""Canonical msgpack encoding and digests.

Every number Invar uses is bound to the bytes that carried it, so the encoding must be a function of the value
alone: maps are written with their keys sorted, floats always as 64-bit, and arrays as an extension holding
(dtype, shape, raw little-endian bytes) so float32 and bfloat16 bits survive exactly. Nothing is ever pickled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

ARRAY_EXT = 1
"""msgpack extension code for an array: payload is msgpack([dtype, shape, data])."""

_ALLOWED_DTYPES = frozenset({"<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"})


@dataclass(frozen=True)
class BFloat16Array:
    """A bfloat16 array kept as its raw 16-bit patterns (numpy has no bfloat16)."""

    bits: np.ndarray  # uint16, the raw patterns

    def to_float32(self) -> np.ndarray:
        """Exact widening: a bfloat16 is the top half of a float32."""
        return (self.bits.astype(np.uint32) << 16).view(np.float32)


class CanonicalError(ValueError):
    """A value that has no canonical encoding, or bytes that do not decode."""


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def _ext_header(length: int) -> bytes:
    """msgpack's own choice of extension header for a payload of `length` bytes, type ARRAY_EXT."""
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    if length in fixed:
        return bytes([fixed[length], ARRAY_EXT])
    if length < 1 << 8:
        return bytes([0xC7, length, ARRAY_EXT])
    if length < 1 << 16:
        return b"\xc8" + length.to_bytes(2, "big") + bytes([ARRAY_EXT])
    return b"\xc9" + length.to_bytes(4, "big") + bytes([ARRAY_EXT])


def _bin_header(length: int) -> bytes:
    if length < 1 << 8:
        return bytes([0xC4, length])
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def _container_header(n: int, fix: int, h16: int, h32: int) -> bytes:
    if n < 16:
        return bytes([fix | n])
    if n < 1 << 16:
        return bytes([h16]) + n.to_bytes(2, "big")
    return bytes([h32]) + n.to_bytes(4, "big")


def _array_parts(dtype: str, shape: tuple[int, ...], raw: memoryview) -> list[bytes | memoryview]:
    # The extension payload is msgpack([dtype, shape, bin]); only its small prefix is built, the data is not copied.
    prefix = b"\x93" + _pack_leaf(dtype) + _pack_leaf(list(shape)) + _bin_header(raw.nbytes)
    return [_ext_header(len(prefix) + raw.nbytes), prefix, raw]


def _pack_leaf(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, strict_types=True)  # type: ignore[no-any-return]


def _parts(obj: Any, out: list[bytes | memoryview]) -> None:
    """Append the canonical encoding of `obj` to `out` as a list of byte segments."""
    if obj is None or isinstance(obj, bool | str | bytes | float):
        out.append(_pack_leaf(obj))
    elif isinstance(obj, bytearray | memoryview):
        out.append(_pack_leaf(bytes(obj)))
    elif isinstance(obj, int):
        if not _INT_MIN <= obj <= _INT_MAX:
            raise CanonicalError(f"integer {obj} does not fit in 64 bits")
        out.append(_pack_leaf(obj))
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dt.str not in _ALLOWED_DTYPES:
            raise CanonicalError(f"array dtype {a.dtype} is not supported on the wire")
        a = a.astype(dt, copy=False)
        out.extend(_array_parts(dt.str, a.shape, a.reshape(-1).data.cast("B")))
    elif isinstance(obj, BFloat16Array):
        bits = np.ascontiguousarray(obj.bits, dtype="<u2")
        out.extend(_array_parts("bfloat16", bits.shape, bits.reshape(-1).data.cast("B")))
    elif isinstance(obj, np.generic):
        _parts(obj.item(), out)
    elif isinstance(obj, Mapping):
        keys = list(obj.keys())
        for key in keys:
            if not isinstance(key, str):
                raise CanonicalError(f"map key {key!r} is not a string")
        out.append(_container_header(len(keys), 0x80, 0xDE, 0xDF))
        for key in sorted(keys):
            out.append(_pack_leaf(key))
            _parts(obj[key], out)
    elif isinstance(obj, Sequence):
        out.append(_container_header(len(obj), 0x90, 0xDC, 0xDD))
        for v in obj:
            _parts(v, out)
    else:
        raise CanonicalError(f"type {type(obj).__name__} has no canonical encoding")


def encode_parts(obj: Any) -> list[bytes | memoryview]:
    """The canonical encoding as segments, so large arrays are written and hashed without being copied."""
    out: list[bytes | memoryview] = []
    _parts(obj, out)
    return out


def _ext_hook(code: int, data: bytes) -> Any:
    if code != ARRAY_EXT:
        raise CanonicalError(f"unknown msgpack extension {code}")
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    try:
        # Read dtype and shape from the small prefix; the data itself is viewed in place, not copied again.
        if len(data) < 1 or data[0] != 0x93:
            raise ValueError("expected a 3-element array")
        unpacker.feed(data[1:min(len(data), 4096)])
        dtype, shape = unpacker.unpack(), unpacker.unpack()
        offset = 1 + unpacker.tell()
    except Exception as exc:
        raise CanonicalError(f"malformed array extension: {exc}") from None
    if not isinstance(dtype, str) or not isinstance(shape, list):
        raise CanonicalError("malformed array extension: expected [dtype, shape, bytes]")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise CanonicalError(f"malformed array shape {shape!r}")
    marker = data[offset] if offset < len(data) else -1
    sizes = {0xC4: 1, 0xC5: 2, 0xC6: 4}
    if marker not in sizes:
        raise CanonicalError("malformed array extension: the data is not a byte string")
    width = sizes[marker]
    length = int.from_bytes(data[offset + 1:offset + 1 + width], "big")
    start = offset + 1 + width
    if start + length != len(data):
        raise CanonicalError("malformed array extension: the byte count does not match the extension")
    count = 1
    for s in shape:
        count *= s
    if dtype == "bfloat16":
        if length != 2 * count:
            raise CanonicalError("bfloat16 array: byte count does not match its shape")
        return BFloat16Array(np.frombuffer(data, dtype="<u2", count=count, offset=start).reshape(shape))
    if dtype not in _ALLOWED_DTYPES:
        raise CanonicalError(f"array dtype {dtype!r} is not supported on the wire")
    dt = np.dtype(dtype)
    if length != dt.itemsize * count:
        raise CanonicalError("array: byte count does not match its shape and dtype")
    # A read-only view of the received bytes: records are never mutated in place.
    return np.frombuffer(data, dtype=dt, count=count, offset=start).reshape(shape)


def encode(obj: Any) -> bytes:
    """Encode `obj` canonically: equal values give equal bytes."""
    return b"".join(encode_parts(obj))


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes written by `encode`; raises `CanonicalError` on anything malformed."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_ext_hook)
    except CanonicalError:
        raise
    except Exception as exc:
        raise CanonicalError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None


def sha256(data: bytes | bytearray | memoryview) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_parts(parts: list[bytes | memoryview]) -> str:
    """Hex sha256 of the concatenation of `parts`, without concatenating them."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


def digest(obj: Any) -> str:
    """Hex sha256 of the canonical encoding of `obj`."""
    return sha256(encode(obj))


def file_sha256(path: str | bytes | Any, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: str | Any) -> str:
    """Digest of a folder: sha256 of the canonical map {relative path: file sha256} over every regular file.

    Models and adapters are named by this digest, so any changed, added or removed file changes it.
    """
    import os

    files: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            files[rel] = file_sha256(full)
    if not files:
        raise CanonicalError(f"{root}: the folder is empty or missing")
    return digest(files)
