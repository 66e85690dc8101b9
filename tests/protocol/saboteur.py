"""A worker that breaks the protocol on purpose, one way per mode, so the client's rejections can be tested.

    python tests/protocol/saboteur.py MODE
"""

from __future__ import annotations

import os
import sys
import time

import msgpack

from invar import canonical
from invar.protocol import frames
from invar.protocol.messages import PROTOCOL_VERSION, Call, Handshake, Identity, Report, Role

IDENTITY = Identity(engine="saboteur", engine_version={"invar": "test"}, role=Role.INFERENCE, settings={},
                    methods=("echo",), pid=os.getpid())


def send(out: object, message: dict[str, object]) -> None:
    out.write(frames.encode_frame(canonical.encode(message)))  # type: ignore[attr-defined]
    out.flush()  # type: ignore[attr-defined]


def send_document(out: object, doc: bytes) -> None:
    """Send a frame whose msgpack document was written by hand (no arrays follow it)."""
    out.write(frames.encode_frame(len(doc).to_bytes(4, "big") + doc))  # type: ignore[attr-defined]
    out.flush()  # type: ignore[attr-defined]


def spelled(mode: str, report: dict[str, object]) -> bytes:
    """A document that decodes to (nearly) `report` but is not how `canonical.encode` writes it."""
    canonical_doc = canonical.encode(report)[4:]
    if mode == "unsorted-keys":
        return msgpack.packb(dict(reversed(list(report.items()))), use_bin_type=True)  # type: ignore[no-any-return]
    if mode == "wide-int":  # the call id 1 as a uint64 instead of a positive fixint
        return canonical_doc.replace(b"\xa7call_id\x01", b"\xa7call_id\xcf" + (1).to_bytes(8, "big"))
    if mode == "float32":  # 0.5 is exact in float32, so the value decodes unchanged
        message = dict(sorted({**report, "result": {"x": 0.5}}.items()))
        return msgpack.packb(message, use_bin_type=True, use_single_float=True)  # type: ignore[no-any-return]
    if mode == "bytes-key":
        message = dict(sorted({**report, "result": {b"x": 0.5}}.items()))
        return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]
    raise SystemExit(f"unknown mode {mode}")


def main() -> int:
    mode = sys.argv[1]
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    if mode == "no-handshake":
        time.sleep(60)
        return 0
    if mode == "bad-handshake":
        out.write(b"hello world\n")
        out.flush()
        time.sleep(5)
        return 0
    if mode == "die-at-start":
        print("cannot load the engine: something is missing", file=sys.stderr, flush=True)
        return 7
    if mode == "noisy":  # an engine that logs a lot while it loads: 32 MB of lines, one very long, then a last one
        err = sys.stderr.buffer
        lines = b"".join(b"loading shard %07d of the weights, all is well\n" % i for i in range(20_000))
        for _ in range(32 * 1024 * 1024 // len(lines)):
            err.write(lines)
        err.write(b"x" * 10_000 + b"\n" + "last log line: ready ✓\n".encode())
        err.flush()
        mode = "echo"
    send(out, Handshake(PROTOCOL_VERSION, IDENTITY).to_wire())
    while True:
        payload = frames.read_frame(inp)
        if payload is None:
            return 0
        message = frames.decode_payload(payload)
        if message["kind"] == "shutdown":
            return 0
        call = Call.from_wire(message)
        digest = canonical.sha256(payload)
        good = Report(call.call_id, digest, IDENTITY.digest, result={"echo": call.params})
        if mode == "wrong-digest":
            send(out, Report(call.call_id, "0" * 64, IDENTITY.digest, result={}).to_wire())
        elif mode == "wrong-identity":
            send(out, Report(call.call_id, digest, "f" * 64, result={}).to_wire())
        elif mode == "unknown-call":
            send(out, Report(call.call_id + 1000, digest, IDENTITY.digest, result={}).to_wire())
        elif mode == "duplicate":
            send(out, good.to_wire())
            send(out, good.to_wire())
        elif mode == "stray-bytes":
            out.write(b"Loading weights... 100%\n")
            send(out, good.to_wire())
        elif mode == "truncated":
            frame = frames.encode_frame(canonical.encode(good.to_wire()))
            out.write(frame[: len(frame) // 2])
            out.flush()
            return 0
        elif mode == "malformed":
            out.write(frames.encode_frame(b"\xc1\xc1\xc1"))
            out.flush()
        elif mode == "not-a-report":
            send(out, {"kind": "call", "call_id": 1, "method": "x", "params": {}})
        elif mode == "die":
            print("segfault in the engine (simulated)", file=sys.stderr, flush=True)
            os._exit(139)
        elif mode == "hang":
            time.sleep(60)
        elif mode in ("unsorted-keys", "wide-int", "float32", "bytes-key"):
            send_document(out, spelled(mode, good.to_wire()))
        elif mode == "echo":
            send(out, good.to_wire())
        else:
            raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
