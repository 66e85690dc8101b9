"""The reference worker: no engine, only the protocol. It shows a new engine what serving takes, and the protocol's
tests and benchmark measure the transport with it.

    python -m invar.workers.echo [--role inference|learner] [--learner-channel IN,OUT]

With `--learner-channel` it serves both roles from one process, one channel each (`invar.transport.shared`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from invar import __version__
from invar.protocol import MethodError, Role, Server, exit_worker
from invar.protocol.server import add_channel_argument, serve_roles


def echo(params: dict[str, Any]) -> dict[str, Any]:
    """Return the params unchanged: arrays come back bit for bit."""
    return dict(params)


def checksum(params: dict[str, Any]) -> dict[str, Any]:
    """Reduce an array to a few numbers, so a large call's answer stays small."""
    arr = params.get("array")
    if not isinstance(arr, np.ndarray):
        raise MethodError("checksum: params.array must be an array")
    return {"shape": list(arr.shape), "dtype": arr.dtype.str, "sum": float(arr.sum(dtype=np.float64))}


def sleep(params: dict[str, Any]) -> dict[str, Any]:
    seconds = params.get("seconds", 0.0)
    if not isinstance(seconds, int | float) or seconds < 0:
        raise MethodError("sleep: params.seconds must be a non-negative number")
    time.sleep(seconds)
    return {"slept": float(seconds)}


def fail(params: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(str(params.get("message", "asked to fail")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.echo")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.INFERENCE.value)
    add_channel_argument(parser)
    args = parser.parse_args(argv)

    def server_for(role: Role) -> Server:
        return Server(engine="echo", engine_version={"invar": __version__, "numpy": np.__version__}, role=role,
                      settings={}, methods={"echo": echo, "checksum": checksum, "sleep": sleep, "fail": fail})

    return serve_roles(parser, server_for, Role(args.role), args.learner_channel)


if __name__ == "__main__":
    exit_worker(main())
