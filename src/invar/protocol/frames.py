"""Length-prefixed frames on a byte stream.

A frame is `MAGIC` + a 4-byte big-endian length + a canonical msgpack payload. The magic makes stray bytes on a
worker's stdout (a library that prints) fail at once and by name instead of being read as a huge length.
"""

from __future__ import annotations

import mmap
import queue
import struct
import threading
from typing import IO, Any, Protocol

from invar import canonical
from invar.errors import ProtocolError

MAGIC = b"INV1"
HEADER = struct.Struct(">4sI")
MAX_FRAME = (1 << 31) - 1


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...
"""The largest payload a frame may carry (2 GiB − 1)."""


def encode_frame(payload: bytes) -> bytes:
    """Frame an already encoded payload."""
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame payload of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return HEADER.pack(MAGIC, len(payload)) + payload


_COALESCE = 1 << 16


def _write_all(stream: IO[bytes], data: bytes | memoryview) -> None:
    # An unbuffered pipe may take fewer bytes than offered; a short write must never pass silently.
    view = memoryview(data).cast("B")
    while view:
        n = stream.write(view)
        if n is None:  # a non-blocking stream that is full: never the case for a worker's pipes
            raise ProtocolError("the stream would block")
        view = view[n:]


def write_parts(stream: IO[bytes], parts: list[bytes | memoryview]) -> None:
    """Write one frame whose payload is the concatenation of `parts`.

    Small segments are joined so a message of many fields costs few writes; large ones (array data) are written
    from their own memory, never copied into one buffer.
    """
    total = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    if total > MAX_FRAME:
        raise ProtocolError(f"frame payload of {total} bytes exceeds the {MAX_FRAME}-byte limit")
    pending: list[bytes | memoryview] = [HEADER.pack(MAGIC, total)]
    size = HEADER.size
    for part in parts:
        n = len(part) if isinstance(part, bytes) else part.nbytes
        if n >= _COALESCE:
            if pending:
                _write_all(stream, b"".join(pending))
                pending, size = [], 0
            _write_all(stream, part)
        else:
            pending.append(part)
            size += n
            if size >= _COALESCE:
                _write_all(stream, b"".join(pending))
                pending, size = [], 0
    if pending:
        _write_all(stream, b"".join(pending))
    stream.flush()


def _read_into(stream: IO[bytes], buf: memoryview, hasher: Hasher | None = None) -> int:
    got = 0
    while got < len(buf):
        n = stream.readinto(buf[got:])  # type: ignore[attr-defined]
        if not n:
            break
        if hasher is not None:
            # Hashing each chunk as it lands overlaps the digest with the sender's writing.
            hasher.update(buf[got:got + n])
        got += n
    return got


def _read_hashing_aside(stream: IO[bytes], buf: memoryview, hasher: Hasher | None) -> int:
    """Read into `buf` while a second thread hashes what has landed (hashing and reading both release the GIL)."""
    if hasher is None:
        return _read_into(stream, buf)
    chunks: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()

    def digest_chunks() -> None:
        while (chunk := chunks.get()) is not None:
            hasher.update(chunk)

    worker = threading.Thread(target=digest_chunks, name="frame-hasher", daemon=True)
    worker.start()
    got = 0
    try:
        while got < len(buf):
            n = stream.readinto(buf[got:])  # type: ignore[attr-defined]
            if not n:
                break
            chunks.put(buf[got:got + n])
            got += n
    finally:
        chunks.put(None)
        worker.join()
    return got


def read_frame(stream: IO[bytes], hasher: Hasher | None = None) -> bytearray | memoryview | None:
    """Read one frame's payload; None at a clean end of stream (no byte of a new frame read). Memory is taken as the
    payload's bytes arrive, never for its announced length up front.

    With `hasher`, the payload's bytes are fed to it as they arrive (the header is not).
    """
    header = bytearray(HEADER.size)
    got = _read_into(stream, memoryview(header))
    if got == 0:
        return None
    if got < HEADER.size:
        raise ProtocolError(f"truncated frame header: {got} of {HEADER.size} bytes before end of stream")
    magic, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"non-frame bytes on the stream: expected {MAGIC!r}, got {bytes(header)!r}")
    if length > MAX_FRAME:
        raise ProtocolError(f"frame length {length} exceeds the {MAX_FRAME}-byte limit")
    first = bytearray(min(length, 1 << 20))
    got = _read_into(stream, memoryview(first), hasher)
    if got == length:
        return first
    if got == len(first):
        # The rest lands in anonymous memory that the kernel provides page by page as bytes are written to it: a
        # length that lies (2 GiB announced, a few bytes sent) costs what arrived, never what was announced, and
        # nothing is zero-filled first (a bytearray of the length would commit all of it at once).
        payload = memoryview(mmap.mmap(-1, length))
        payload[: len(first)] = first
        got += _read_hashing_aside(stream, payload[len(first):], hasher)
        if got == length:
            return payload
    raise ProtocolError(f"truncated frame: {got} of {length} payload bytes before end of stream")


def decode_payload(payload: bytes | bytearray | memoryview, what: str = "frame payload") -> dict[str, Any]:
    """Decode a frame payload into a message map; any malformation is a `ProtocolError` naming `what` it was.

    Only canonical bytes decode (`canonical.decode`): a payload that is a second spelling of its value would be
    recorded under a digest that no verification can reproduce, so it is refused before anything keeps it.
    """
    try:
        message = canonical.decode(payload)
    except canonical.NotCanonicalError as exc:
        # The message reads "<what> is not in canonical form: …".
        raise ProtocolError(f"{what} is {exc}; encode every message with invar.canonical.encode") from None
    except canonical.CanonicalError as exc:
        raise ProtocolError(f"undecodable {what}: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"{what} is a {type(message).__name__}, expected a map")
    return message
