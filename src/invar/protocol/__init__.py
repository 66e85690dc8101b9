"""The invocation protocol between the core and its engine workers (see docs/protocol.md)."""

from invar.protocol.client import Answer, PendingCall, Recorder, WorkerClient, WorkerLost, WorkerProcess
from invar.protocol.messages import Call, Identity, Report, Role
from invar.protocol.server import MethodError, Server, exit_worker

__all__ = [
    "Answer", "Call", "Identity", "MethodError", "PendingCall", "Recorder", "Report", "Role", "Server",
    "WorkerClient", "WorkerLost", "WorkerProcess", "exit_worker",
]
