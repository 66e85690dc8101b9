"""The core's side of the protocol: the client that drives a worker, and the transports that start and carry one
(a local subprocess, a fork server's child, a Ray relay, one process shared by both roles). No worker imports
this package, so its code is in no worker's code digest."""

from invar.transport.client import Answer, PendingCall, Recorder, WorkerClient, WorkerLost, WorkerProcess

__all__ = ["Answer", "PendingCall", "Recorder", "WorkerClient", "WorkerLost", "WorkerProcess"]
