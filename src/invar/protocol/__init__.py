"""The invocation protocol between the core and its engine workers, as it crosses the wire (see docs/protocol.md):
frames, messages, the typed payloads and the worker-side server. This is all a worker imports of it; the core's
side of a call (the client, the transports that start and carry a worker) is `invar.transport`."""

from invar.protocol.messages import Call, Identity, Report, Role
from invar.protocol.server import MethodError, Server, exit_worker

__all__ = ["Call", "Identity", "MethodError", "Report", "Role", "Server", "exit_worker"]
