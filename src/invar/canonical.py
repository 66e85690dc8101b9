"""Canonical msgpack encoding and digests.

Every number Invar uses is bound to the bytes that carried it, so the encoding must be a function of the value
alone: maps are written with their keys sorted, floats always as 64-bit, integers in their shortest form. Arrays keep
their exact bits: each is an extension (code 1) in the msgpack document holding `[dtype, shape, offset, nbytes]`,
and its raw little-endian bytes follow the document, in the order the arrays appear. An encoded value is therefore

    4-byte big-endian document length | msgpack document | array bytes, each at a multiple of 16

(zero padding in between, so arrays decode as aligned views)

which lets a 64 MB array be written, hashed and read without being copied into or out of a msgpack buffer.
Nothing is ever pickled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

ARRAY_EXT = 1
"""msgpack extension code for an array: payload is msgpack([dtype, shape, offset, nbytes])."""

_ALLOWED_DTYPES = frozenset({"<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"})
_DOC_LEN = 4


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
_ALIGN = 16
"""Array bytes start at multiples of 16 from the start of the value, so arrays decode as aligned views."""


def _pad(offset: int) -> int:
    return -offset % _ALIGN


class _Encoder:
    def __init__(self) -> None:
        self.blobs: list[memoryview] = []
        self.offset = 0

    def array(self, dtype: str, shape: tuple[int, ...], raw: memoryview) -> msgpack.ExtType:
        pad = _pad(self.offset)
        if pad:
            self.blobs.append(memoryview(bytes(pad)))
            self.offset += pad
        ext = msgpack.ExtType(ARRAY_EXT, msgpack.packb([dtype, list(shape), self.offset, raw.nbytes]))
        self.blobs.append(raw)
        self.offset += raw.nbytes
        return ext

    def normalize(self, obj: Any) -> Any:
        if obj is None or isinstance(obj, bool | str | bytes | float):
            return obj
        if isinstance(obj, int):
            if not _INT_MIN <= obj <= _INT_MAX:
                raise CanonicalError(f"integer {obj} does not fit in 64 bits")
            return obj
        if isinstance(obj, bytearray | memoryview):
            return bytes(obj)
        if isinstance(obj, np.ndarray):
            a = np.ascontiguousarray(obj)
            dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
            if dt.str not in _ALLOWED_DTYPES:
                raise CanonicalError(f"array dtype {a.dtype} is not supported on the wire")
            a = a.astype(dt, copy=False)
            return self.array(dt.str, a.shape, a.reshape(-1).data.cast("B"))
        if isinstance(obj, BFloat16Array):
            bits = np.ascontiguousarray(obj.bits, dtype="<u2")
            return self.array("bfloat16", bits.shape, bits.reshape(-1).data.cast("B"))
        if isinstance(obj, np.generic):
            return self.normalize(obj.item())
        if isinstance(obj, Mapping):
            for key in obj:
                if not isinstance(key, str):
                    raise CanonicalError(f"map key {key!r} is not a string")
            # Sorted before the values are visited, so array bytes follow in the same (canonical) order.
            return {key: self.normalize(obj[key]) for key in sorted(obj)}
        if isinstance(obj, Sequence):
            return [self.normalize(v) for v in obj]
        raise CanonicalError(f"type {type(obj).__name__} has no canonical encoding")


def encode_parts(obj: Any) -> list[bytes | memoryview]:
    """The canonical encoding as segments: the document, then each array's bytes in place (not copied)."""
    enc = _Encoder()
    doc = msgpack.packb(enc.normalize(obj), use_bin_type=True, strict_types=True)
    if len(doc) >= 1 << 32:
        raise CanonicalError("the msgpack document exceeds 4 GiB")
    if not enc.blobs:
        return [len(doc).to_bytes(_DOC_LEN, "big"), doc]
    return [len(doc).to_bytes(_DOC_LEN, "big"), doc, bytes(_pad(_DOC_LEN + len(doc))), *enc.blobs]


def encode(obj: Any) -> bytes:
    """Encode `obj` canonically: equal values give equal bytes."""
    return b"".join(encode_parts(obj))


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes written by `encode`; raises `CanonicalError` on anything malformed.

    Arrays come back as read-only views of `data` (records are never changed in place).
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    if len(view) < _DOC_LEN:
        raise CanonicalError("encoded value shorter than its 4-byte document length")
    doc_len = int.from_bytes(view[:_DOC_LEN], "big")
    doc_end = _DOC_LEN + doc_len
    if doc_end > len(view):
        raise CanonicalError(f"document length {doc_len} runs past the end of the {len(view)}-byte value")
    # Array bytes, if any, begin at the next multiple of 16; the padding is zeros (one encoding per value).
    blob_start = doc_end if doc_end == len(view) else doc_end + _pad(doc_end)
    if blob_start > len(view) or any(view[doc_end:blob_start]):
        raise CanonicalError("malformed padding between the document and the array bytes")
    blob_len = len(view) - blob_start
    expected = [0]  # the next array must start where the previous one ended

    def ext_hook(code: int, payload: bytes) -> Any:
        if code != ARRAY_EXT:
            raise CanonicalError(f"unknown msgpack extension {code}")
        try:
            dtype, shape, offset, nbytes = msgpack.unpackb(payload, raw=False)
        except Exception as exc:
            raise CanonicalError(f"malformed array extension: {exc}") from None
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise CanonicalError("malformed array extension: expected [dtype, shape, offset, nbytes]")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in [*shape, offset, nbytes]):
            raise CanonicalError(f"malformed array extension: shape {shape!r}, offset {offset!r}, nbytes {nbytes!r}")
        gap = _pad(expected[0])
        if offset != expected[0] + gap or offset + nbytes > blob_len:
            raise CanonicalError("array bytes out of place: arrays must follow the document in order, each at the "
                                 "next multiple of 16")
        if any(view[blob_start + expected[0]:blob_start + offset]):
            raise CanonicalError("malformed padding between arrays")
        expected[0] = offset + nbytes
        count = 1
        for x in shape:
            count *= x
        start = blob_start + offset
        if dtype == "bfloat16":
            if nbytes != 2 * count:
                raise CanonicalError("bfloat16 array: byte count does not match its shape")
            bits = np.frombuffer(view, dtype="<u2", count=count, offset=start).reshape(shape)
            bits.flags.writeable = False
            return BFloat16Array(bits)
        if dtype not in _ALLOWED_DTYPES:
            raise CanonicalError(f"array dtype {dtype!r} is not supported on the wire")
        dt = np.dtype(dtype)
        if nbytes != dt.itemsize * count:
            raise CanonicalError("array: byte count does not match its shape and dtype")
        arr = np.frombuffer(view, dtype=dt, count=count, offset=start).reshape(shape)
        arr.flags.writeable = False
        return arr

    try:
        value = msgpack.unpackb(view[_DOC_LEN:doc_end], raw=False, strict_map_key=True, ext_hook=ext_hook)
    except CanonicalError:
        raise
    except Exception as exc:
        raise CanonicalError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
    if expected[0] != blob_len:
        raise CanonicalError(f"{blob_len - expected[0]} bytes after the last array belong to no array")
    return value


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
