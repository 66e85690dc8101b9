"""Canonical msgpack encoding and digests.

Every number Invar uses is bound to the bytes that carried it, so the encoding must be a function of the value
alone: maps are written with their keys sorted, floats always as 64-bit, integers in their shortest form. Arrays keep
their exact bits: each is an extension (code 1) in the msgpack document holding `[dtype, shape, offset, nbytes]`,
and its raw little-endian bytes follow the document, in the order the arrays appear. An encoded value is therefore

    4-byte big-endian document length | msgpack document | array bytes, each at a multiple of 16

(zero padding in between, so arrays decode as aligned views)

which lets a 64 MB array be written, hashed and read without being copied into or out of a msgpack buffer.
Nothing is ever pickled.

The mapping is one-to-one both ways: `decode` accepts only bytes that `encode` writes, so whatever is decoded and
recorded re-encodes to exactly its bytes and keeps its digest. Maps and lists nest at most `MAX_DEPTH` levels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from invar.errors import InvarError

ARRAY_EXT = 1
"""msgpack extension code for an array: payload is msgpack([dtype, shape, offset, nbytes])."""

_ALLOWED_DTYPES = frozenset({"<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1"})
_DOC_LEN = 4
_WIRE_DTYPES = {**{name: np.dtype(name) for name in _ALLOWED_DTYPES}, "bfloat16": np.dtype("<u2")}
"""What each dtype name on the wire decodes to (bfloat16 as its raw 16-bit patterns)."""


@dataclass(frozen=True)
class BFloat16Array:
    """A bfloat16 array kept as its raw 16-bit patterns (numpy has no bfloat16)."""

    bits: np.ndarray  # uint16, the raw patterns

    def to_float32(self) -> np.ndarray:
        """Exact widening: a bfloat16 is the top half of a float32."""
        return (self.bits.astype(np.uint32) << 16).view(np.float32)


class CanonicalError(ValueError):
    """A value that has no canonical encoding, or bytes that do not decode."""


class FolderError(CanonicalError, InvarError):
    """A folder `tree_digest` cannot name (missing, empty, holding a pipe or device, unreadable): one line for the
    user, wherever a model or adapter folder is digested."""


class NotCanonicalError(CanonicalError):
    """Bytes that decode, but are not the encoding `encode` gives their value: a second spelling of one value.

    Accepting one would keep bytes whose digest no later re-encoding reproduces, so they are refused like garbage.
    """


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_ALIGN = 16
"""Array bytes start at multiples of 16 from the start of the value, so arrays decode as aligned views."""

MAX_DEPTH = 64
"""The deepest nesting of maps and lists a value may have (a flat map is depth 1). Messages nest a handful of
levels; the bound keeps encoding and decoding clear of Python's recursion limit, whatever a peer sends."""

_TOO_DEEP = f"maps and lists nested deeper than {MAX_DEPTH} levels"


def show(value: Any, limit: int = 40) -> str:
    """A bounded repr for messages: a hostile value must not turn an error into megabytes of text."""
    try:
        text = repr(value)
    except Exception:  # an int past Python's digit limit, a structure past the recursion limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pad(offset: int) -> int:
    return -offset % _ALIGN


_ZEROS = memoryview(bytes(_ALIGN))
_JUST_INT = {int}
_PLAIN_DTYPES = {np.dtype(name): name for name in _ALLOWED_DTYPES}
"""Each wire dtype by its numpy dtype (a dtype equal to one of these has that `.str`): looked up by the dtype itself,
which is quicker than building its `.str` for every array."""
_new_ext: Callable[[Any, tuple[int, bytes]], msgpack.ExtType] = tuple.__new__


class _Encoder:
    def __init__(self) -> None:
        self.blobs: list[memoryview] = []
        self.offset = 0
        self._pack_header: Callable[[Any], bytes] | None = None

    def header(self, fields: list[Any]) -> bytes:
        """`msgpack.packb(fields)` by one packer per encoding (made at its first array): a call or report holds
        hundreds of arrays, and making a packer for each header cost more than packing it."""
        if self._pack_header is None:
            self._pack_header = msgpack.Packer(use_bin_type=True, strict_types=True).pack
        return self._pack_header(fields)

    def array(self, dtype: str, shape: tuple[int, ...], raw: memoryview) -> msgpack.ExtType:
        pad = _pad(self.offset)
        if pad:
            self.blobs.append(_ZEROS[:pad])
            self.offset += pad
        # An ExtType built as the tuple it is (its checking constructor costs more than the payload; the code and
        # the payload's type are right by construction).
        ext = _new_ext(msgpack.ExtType, (ARRAY_EXT, self.header([dtype, list(shape), self.offset, raw.nbytes])))
        self.blobs.append(raw)
        self.offset += raw.nbytes
        return ext

    def normalize(self, obj: Any, depth: int = 0) -> Any:
        """`obj` as plain msgpack types (exact str, int, float, …), maps sorted, arrays as extensions."""
        t = type(obj)
        # Exact types first: they are all a decoded value holds, and decode re-encodes every document.
        if obj is None or t is str or t is float or t is bool or t is bytes:
            return obj
        if t is np.ndarray and (name := _PLAIN_DTYPES.get(obj.dtype)) is not None and obj.flags.c_contiguous:
            # A plain array of a wire dtype in C order (every array of a call or report): its bytes as they are.
            return self.array(name, obj.shape, obj.reshape(-1).data.cast("B"))
        if t is int:
            if not _INT_MIN <= obj <= _INT_MAX:
                raise CanonicalError(f"integer {show(obj)} does not fit in 64 bits")
            return obj
        if t is list or t is tuple:  # before the Mapping check, whose isinstance on an ABC costs more
            if depth >= MAX_DEPTH:
                raise CanonicalError(_TOO_DEEP)
            # A list of plain ints (a prompt's token ids) checked at once rather than one call per item.
            if obj and set(map(type, obj)) == _JUST_INT and min(obj) >= _INT_MIN and max(obj) <= _INT_MAX:
                return obj if t is list else list(obj)
            return [self.normalize(v, depth + 1) for v in obj]
        if t is dict or isinstance(obj, Mapping):
            if depth >= MAX_DEPTH:
                raise CanonicalError(_TOO_DEEP)
            for key in obj:
                if not isinstance(key, str):
                    raise CanonicalError(f"map key {show(key)} is not a string")
            # Sorted before the values are visited, so array bytes follow in the same (canonical) order. A str
            # subclass (an enum member) is written as the plain string it is. The values a message's maps mostly
            # hold (plain scalars, plain arrays) are taken here, as `normalize` would take them, without a call
            # each: a learner call is hundreds of such maps.
            out = {}
            normalize, array, plain = self.normalize, self.array, _PLAIN_DTYPES
            for key in sorted(obj):
                v = obj[key]
                tv = type(v)
                if v is None or tv is str or tv is float or tv is bool or tv is bytes \
                        or (tv is int and _INT_MIN <= v <= _INT_MAX):
                    pass
                elif tv is np.ndarray and (name := plain.get(v.dtype)) is not None and v.flags.c_contiguous:
                    v = array(name, v.shape, v.reshape(-1).data.cast("B"))
                else:
                    v = normalize(v, depth + 1)
                out[key if type(key) is str else str.__str__(key)] = v
            return out
        if isinstance(obj, np.ndarray):
            a = np.asarray(obj, order="C")  # not ascontiguousarray, which turns a 0-d array into shape (1,)
            dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
            if dt.str not in _ALLOWED_DTYPES:
                raise CanonicalError(f"array dtype {a.dtype} is not supported on the wire")
            a = a.astype(dt, copy=False)
            return self.array(dt.str, a.shape, a.reshape(-1).data.cast("B"))
        if isinstance(obj, BFloat16Array):
            bits = np.asarray(obj.bits, dtype="<u2", order="C")
            return self.array("bfloat16", bits.shape, bits.reshape(-1).data.cast("B"))
        # Subclasses of the plain types (enum members, numpy's float64) are written as the value they hold.
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, bytes | bytearray | memoryview):
            return bytes(obj)
        if isinstance(obj, int):
            return self.normalize(int.__int__(obj), depth)
        if isinstance(obj, float):
            return float.__float__(obj)
        if isinstance(obj, np.generic):
            return self.normalize(obj.item(), depth)
        if isinstance(obj, Sequence):
            if depth >= MAX_DEPTH:
                raise CanonicalError(_TOO_DEEP)
            return [self.normalize(v, depth + 1) for v in obj]
        raise CanonicalError(f"type {type(obj).__name__} has no canonical encoding")

    def pack(self, obj: Any) -> bytes:
        """The msgpack document of `obj`; its arrays' bytes are left in `blobs`."""
        normal = self.normalize(obj)
        try:
            return msgpack.packb(normal, use_bin_type=True, strict_types=True)  # type: ignore[no-any-return]
        except (ValueError, TypeError, OverflowError) as exc:  # a lone surrogate in a str, a str over 4 GiB
            raise CanonicalError(f"no canonical encoding: {type(exc).__name__}: {exc}") from None


def encode_parts(obj: Any) -> list[bytes | memoryview]:
    """The canonical encoding as segments: the document, then each array's bytes in place (not copied)."""
    enc = _Encoder()
    doc = enc.pack(obj)
    if len(doc) >= 1 << 32:
        raise CanonicalError("the msgpack document exceeds 4 GiB")
    if not enc.blobs:
        return [len(doc).to_bytes(_DOC_LEN, "big"), doc]
    return [len(doc).to_bytes(_DOC_LEN, "big"), doc, bytes(_pad(_DOC_LEN + len(doc))), *enc.blobs]


def encode(obj: Any) -> bytes:
    """Encode `obj` canonically: equal values give equal bytes."""
    return b"".join(encode_parts(obj))


def _check_maps_and_depth(node: dict[Any, Any] | list[Any], depth: int = 1) -> None:
    """Refuse a decoded container holding a map key that is not a string, keys out of order, or nesting past
    MAX_DEPTH. Recursion is safe: it stops at MAX_DEPTH levels."""
    if type(node) is dict:
        keys = [*node]
        try:
            in_order = keys == sorted(keys)
        except TypeError:  # str and bytes keys together (msgpack decodes no other key types here)
            in_order = False
        if not in_order or (keys and type(keys[0]) is not str):
            bad = next((k for k in keys if type(k) is not str), None)
            if bad is not None:
                raise CanonicalError(f"map key {show(bad)} is not a string")
            raise NotCanonicalError(f"not in canonical form: map keys {show(keys, 80)} are not sorted")
        children: Any = node.values()
    else:
        children = node
    for child in children:
        if type(child) is dict or type(child) is list:
            if depth == MAX_DEPTH:
                raise CanonicalError(_TOO_DEEP)
            _check_maps_and_depth(child, depth + 1)


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes written by `encode`; raises `CanonicalError` on anything else.

    Only `encode`'s own output decodes: bytes that are malformed, hold what `encode` never writes (a map key that
    is not a string, an unknown extension, nesting deeper than `MAX_DEPTH`) or spell a value other than the one
    way `encode` does (unsorted or repeated keys, a wider integer, a float32: `NotCanonicalError`) are refused,
    so a value's digest is always the digest of its bytes. Arrays come back as read-only views of `data`
    (records are never changed in place).
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
    exts: dict[int, msgpack.ExtType] = {}  # id of each decoded array → its extension, to re-encode the document

    readonly = view.readonly  # arrays of a bytes value are read-only views already
    # One packer for the extensions' re-packing (`packb` makes a packer per call, which cost as much as the packing).
    unpack, pack, frombuffer, new_tuple, ext_type = msgpack.unpackb, msgpack.Packer().pack, np.frombuffer, \
        tuple.__new__, msgpack.ExtType

    def ext_hook(code: int, payload: bytes) -> Any:
        # Runs once per array (thousands in a generate report), so it checks with plain loops and cached dtypes.
        if code != ARRAY_EXT:
            raise CanonicalError(f"unknown msgpack extension {code}")
        try:
            dtype, shape, offset, nbytes = unpack(payload, raw=False)
        except Exception as exc:
            raise CanonicalError(f"malformed array extension: {exc}") from None
        dt = _WIRE_DTYPES.get(dtype) if type(dtype) is str else None
        if type(shape) is not list or dt is None:
            raise CanonicalError(f"malformed array extension: dtype {show(dtype)} is not supported on the wire"
                                 if type(shape) is list else "malformed array extension: expected "
                                 "[dtype, shape, offset, nbytes]")
        if len(shape) == 1 and type(shape[0]) is int and shape[0] >= 0:  # the common case, without the loop
            count = shape[0]
        else:
            count = 1
            for x in shape:
                if type(x) is not int or x < 0:
                    raise CanonicalError(f"malformed array extension: shape {show(shape)}")
                count *= x
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise CanonicalError(f"malformed array extension: offset {show(offset)}, nbytes {show(nbytes)}")
        end = expected[0]
        if offset != end + -end % _ALIGN or offset + nbytes > blob_len:
            raise CanonicalError("array bytes out of place: arrays must follow the document in order, each at the "
                                 "next multiple of 16")
        if offset != end and any(view[blob_start + end:blob_start + offset]):
            raise CanonicalError("malformed padding between arrays")
        expected[0] = offset + nbytes
        if nbytes != dt.itemsize * count:
            raise CanonicalError(f"array: {nbytes} bytes do not hold shape {show(shape)} of {dtype}")
        arr = frombuffer(view, dtype=dt, count=count, offset=blob_start + offset)
        if len(shape) != 1:
            arr = arr.reshape(shape)
        if not readonly:
            arr.flags.writeable = False
        value = BFloat16Array(arr) if dtype == "bfloat16" else arr
        # Re-packed from its fields, so a payload spelled in a wider form fails the document comparison.
        # (An ExtType built as the tuple it is: its checking constructor costs more than the rest of this hook.)
        exts[id(value)] = new_tuple(ext_type, (ARRAY_EXT, pack([dtype, shape, offset, nbytes])))
        return value

    def array_ext(obj: Any) -> msgpack.ExtType:
        ext = exts.get(id(obj))
        if ext is None:  # only a msgpack timestamp decodes to anything else (a datetime)
            raise CanonicalError("unknown msgpack extension -1 (a timestamp)")
        return ext

    doc = view[_DOC_LEN:doc_end]
    try:
        value = msgpack.unpackb(doc, raw=False, strict_map_key=True, ext_hook=ext_hook, timestamp=3)
    except CanonicalError:
        raise
    except msgpack.StackError:
        raise CanonicalError(_TOO_DEEP) from None
    except Exception as exc:
        raise CanonicalError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
    if expected[0] != blob_len:
        raise CanonicalError(f"{blob_len - expected[0]} bytes after the last array belong to no array")
    # One value, one encoding: the document must be exactly what encode writes for the value it decodes to. Maps
    # are checked for string keys in sorted order (msgpack keeps a map's wire order); the rest is re-packed in C
    # and compared. The array bytes need no second look: their places, sizes and padding were fixed above, and
    # each array's extension is part of the document compared here.
    if type(value) is dict or type(value) is list:
        _check_maps_and_depth(value)
    try:
        again = msgpack.packb(value, use_bin_type=True, strict_types=True, default=array_ext)
    except CanonicalError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise CanonicalError(f"no canonical encoding: {type(exc).__name__}: {exc}") from None
    if again != doc:
        at = next((i for i, (a, b) in enumerate(zip(again, doc, strict=False)) if a != b), min(len(again), doc_len))
        raise NotCanonicalError(
            f"not in canonical form: the {doc_len}-byte document departs from the canonical encoding of its value "
            f"at byte {at} (canonical: keys sorted and unrepeated, integers in their shortest form, floats as "
            "float64, strings as str and bytes as bin, each with its shortest header)"
        )
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
    import stat

    files: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            # Opened without blocking and checked before reading: a pipe in the folder would wait forever for a
            # writer, a device (a link to /dev/zero) would never end.
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                raise FolderError(f"{full}: cannot be read ({exc.strerror}); every file of a model or adapter folder "
                                  "must be readable") from None
            with open(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise FolderError(f"{full}: not a regular file (a pipe, device or socket); a model or adapter "
                                      "folder holds files and folders only")
                h = hashlib.sha256()
                while block := f.read(1 << 20):
                    h.update(block)
            files[rel] = h.hexdigest()
    if not files:
        raise FolderError(f"{root}: the folder is empty or missing; pass the folder that holds the model's (or the "
                          "adapter's) files")
    return digest(files)
