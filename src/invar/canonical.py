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


def _normalize(obj: Any) -> Any:
    if obj is None or isinstance(obj, bool | str | bytes):
        return obj
    if isinstance(obj, int):
        if not -(2**63) <= obj < 2**64:
            raise CanonicalError(f"integer {obj} does not fit in 64 bits")
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(ARRAY_EXT, _pack_array(obj))
    if isinstance(obj, BFloat16Array):
        payload = msgpack.packb(
            ["bfloat16", list(obj.bits.shape), np.ascontiguousarray(obj.bits, dtype="<u2").tobytes()],
            use_bin_type=True,
        )
        return msgpack.ExtType(ARRAY_EXT, payload)
    if isinstance(obj, np.generic):
        return _normalize(obj.item())
    if isinstance(obj, Mapping):
        items = []
        for key, value in obj.items():
            if not isinstance(key, str):
                raise CanonicalError(f"map key {key!r} is not a string")
            items.append((key, _normalize(value)))
        items.sort(key=lambda kv: kv[0])
        return dict(items)
    if isinstance(obj, Sequence):
        return [_normalize(v) for v in obj]
    raise CanonicalError(f"type {type(obj).__name__} has no canonical encoding")


def _pack_array(arr: np.ndarray) -> bytes:
    a = np.ascontiguousarray(arr)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    if dt.str not in _ALLOWED_DTYPES:
        raise CanonicalError(f"array dtype {a.dtype} is not supported on the wire")
    a = a.astype(dt, copy=False)
    return msgpack.packb([dt.str, list(a.shape), a.tobytes()], use_bin_type=True)  # type: ignore[no-any-return]


def _ext_hook(code: int, data: bytes) -> Any:
    if code != ARRAY_EXT:
        raise CanonicalError(f"unknown msgpack extension {code}")
    try:
        dtype, shape, raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise CanonicalError(f"malformed array extension: {exc}") from None
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(raw, bytes):
        raise CanonicalError("malformed array extension: expected [dtype, shape, bytes]")
    if not all(isinstance(s, int) and s >= 0 for s in shape):
        raise CanonicalError(f"malformed array shape {shape!r}")
    count = 1
    for s in shape:
        count *= s
    if dtype == "bfloat16":
        if len(raw) != 2 * count:
            raise CanonicalError("bfloat16 array: byte count does not match its shape")
        return BFloat16Array(np.frombuffer(raw, dtype="<u2").reshape(shape).copy())
    if dtype not in _ALLOWED_DTYPES:
        raise CanonicalError(f"array dtype {dtype!r} is not supported on the wire")
    dt = np.dtype(dtype)
    if len(raw) != dt.itemsize * count:
        raise CanonicalError("array: byte count does not match its shape and dtype")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def encode(obj: Any) -> bytes:
    """Encode `obj` canonically: equal values give equal bytes."""
    return msgpack.packb(_normalize(obj), use_bin_type=True, strict_types=True)  # type: ignore[no-any-return]


def decode(data: bytes) -> Any:
    """Decode bytes written by `encode`; raises `CanonicalError` on anything malformed."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_ext_hook)
    except CanonicalError:
        raise
    except Exception as exc:
        raise CanonicalError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None


def sha256(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


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
