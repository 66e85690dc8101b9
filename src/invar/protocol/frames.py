"""Length-prefixed frames on a byte stream.

A frame is `MAGIC` + a 4-byte big-endian length + a canonical msgpack payload. The magic makes stray bytes on a
worker's stdout (a library that prints) fail at once and by name instead of being read as a huge length.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

from invar import canonical
from invar.errors import ProtocolError

MAGIC = b"INV1"
HEADER = struct.Struct(">4sI")
MAX_FRAME = (1 << 31) - 1
"""The largest payload a frame may carry (2 GiB − 1)."""


def encode_frame(payload: bytes) -> bytes:
    """Frame an already encoded payload."""
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame payload of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return HEADER.pack(MAGIC, len(payload)) + payload


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> bytes | None:
    """Read one frame's payload; None at a clean end of stream (no byte of a new frame read)."""
    header = _read_exact(stream, HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise ProtocolError(f"truncated frame header: {len(header)} of {HEADER.size} bytes before end of stream")
    magic, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"non-frame bytes on the stream: expected {MAGIC!r}, got {header[:16]!r}")
    if length > MAX_FRAME:
        raise ProtocolError(f"frame length {length} exceeds the {MAX_FRAME}-byte limit")
    payload = _read_exact(stream, length)
    if len(payload) < length:
        raise ProtocolError(f"truncated frame: {len(payload)} of {length} payload bytes before end of stream")
    return payload


def decode_payload(payload: bytes) -> dict[str, Any]:
    """Decode a frame payload into a message map; any malformation is a `ProtocolError`."""
    try:
        message = canonical.decode(payload)
    except canonical.CanonicalError as exc:
        raise ProtocolError(f"undecodable frame payload: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"frame payload is a {type(message).__name__}, expected a map")
    return message
