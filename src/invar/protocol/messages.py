"""Every message of the invocation protocol, and its validation.

Messages are plain frozen dataclasses with an explicit `to_wire` map and a `from_wire` that checks every field, so
nothing untyped travels further than this module. A report is bound to its call by `call_id`, by the digest of the
exact call payload, and by the digest of the worker identity declared at handshake.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from invar import canonical
from invar.errors import ProtocolError

PROTOCOL_VERSION = 1


class Kind(enum.StrEnum):
    """The kinds of message on the wire."""

    HANDSHAKE = "handshake"
    CALL = "call"
    REPORT = "report"
    SHUTDOWN = "shutdown"


class Role(enum.StrEnum):
    """What a worker process serves as: an inference engine, or the learner of the training loop."""

    INFERENCE = "inference"
    LEARNER = "learner"


_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def _map(value: Any, what: str) -> dict[str, Any]:
    """`value` if it is a map whose keys are all strings (what every message and every nested map must be)."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is a {type(value).__name__}, expected a map")
    for key in value:
        if not isinstance(key, str):
            raise ProtocolError(f"{what} has the key {canonical.show(key)}, which is not a string")
    return value


def _field(message: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in message:
        raise ProtocolError(f"{what} has no field {name!r}")
    value = message[name]
    # bool is an int subclass: a call id of True is malformed, not 1.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"{what} field {name!r} has type bool")
    if not isinstance(value, kind):
        raise ProtocolError(f"{what} field {name!r} has type {type(value).__name__}")
    if isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
        raise ProtocolError(f"{what} field {name!r} is {canonical.show(value)}, which does not fit in 64 bits")
    if isinstance(value, dict):
        _map(value, f"{what} field {name!r}")
    return value


@dataclass(frozen=True)
class Identity:
    """Who answers: the engine, its versions, its role, its launch settings and the methods it serves."""

    engine: str
    engine_version: dict[str, str]
    role: Role
    settings: dict[str, Any]
    methods: tuple[str, ...]
    pid: int
    worker: dict[str, str] | None = None
    """The code that answers: the worker module's name and the sha256 of its file (absent in older records)."""
    instance: str | None = None
    """A random name the worker draws for this start of its server (absent in older records). A pid recurs (a
    resumed run in a container that numbers its pids afresh, a busy host) and each start numbers its calls from 1, so
    without it two starts could share an identity digest, the key their calls are recorded under."""

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "engine": self.engine,
            "engine_version": dict(self.engine_version),
            "role": self.role.value,
            "settings": self.settings,
            "methods": list(self.methods),
            "pid": self.pid,
        }
        if self.worker is not None:
            m["worker"] = dict(self.worker)
        if self.instance is not None:
            m["instance"] = self.instance
        return m

    @property
    def digest(self) -> str:
        return canonical.digest(self.to_wire())

    @classmethod
    def from_wire(cls, m: Any) -> Identity:
        m = _map(m, "handshake identity")
        role = _field(m, "role", str, "identity")
        try:
            parsed_role = Role(role)
        except ValueError:
            raise ProtocolError(f"identity role {canonical.show(role)} is neither 'inference' nor 'learner'") from None
        versions = _field(m, "engine_version", dict, "identity")
        methods = _field(m, "methods", list, "identity")
        if not all(isinstance(v, str) for v in versions.values()):
            raise ProtocolError("identity engine_version must map package names to version strings")
        if not all(isinstance(x, str) for x in methods):
            raise ProtocolError("identity methods must be strings")
        worker = m.get("worker")
        if worker is not None and not all(isinstance(v, str) for v in _map(worker, "identity worker").values()):
            raise ProtocolError("identity worker must map 'module' and 'sha256' to strings")
        instance = m.get("instance")
        if instance is not None and not isinstance(instance, str):
            raise ProtocolError(f"identity instance must be a string, not {type(instance).__name__}")
        identity = cls(
            worker=worker,
            engine=_field(m, "engine", str, "identity"),
            engine_version=versions,
            role=parsed_role,
            settings=_field(m, "settings", dict, "identity"),
            methods=tuple(methods),
            pid=_field(m, "pid", int, "identity"),
            instance=instance,
        )
        # Every report names the identity by its digest: an identity without one (settings holding a value with
        # no canonical encoding, or nested past its depth limit) could never be bound to a report. The other
        # fields were checked above, so the settings are what failed.
        try:
            identity.digest  # noqa: B018
        except canonical.CanonicalError as exc:
            raise ProtocolError(f"identity settings have no canonical encoding: {exc}") from None
        return identity


@dataclass(frozen=True)
class Handshake:
    protocol: int
    identity: Identity

    def to_wire(self) -> dict[str, Any]:
        return {"kind": Kind.HANDSHAKE.value, "protocol": self.protocol, "identity": self.identity.to_wire()}

    @classmethod
    def from_wire(cls, m: Any) -> Handshake:
        m = _map(m, "handshake")
        if not isinstance(m.get("kind"), str) or m["kind"] != Kind.HANDSHAKE.value:  # an array's == is elementwise
            raise ProtocolError(f"expected a handshake first, got kind {canonical.show(m.get('kind'))}")
        version = _field(m, "protocol", int, "handshake")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"worker speaks protocol {version}, this core speaks {PROTOCOL_VERSION}")
        return cls(protocol=version, identity=Identity.from_wire(m.get("identity")))


@dataclass(frozen=True)
class Call:
    call_id: int
    method: str
    params: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"kind": Kind.CALL.value, "call_id": self.call_id, "method": self.method, "params": self.params}

    @classmethod
    def from_wire(cls, m: Any) -> Call:
        m = _map(m, "call")
        return cls(
            call_id=_field(m, "call_id", int, "call"),
            method=_field(m, "method", str, "call"),
            params=_field(m, "params", dict, "call"),
        )


@dataclass(frozen=True)
class ErrorInfo:
    """A failure the worker reports instead of a result: the exception type and its message."""

    type: str
    message: str

    @classmethod
    def from_wire(cls, m: Any) -> ErrorInfo:
        m = _map(m, "report error")
        return cls(type=_field(m, "type", str, "report error"), message=_field(m, "message", str, "report error"))


@dataclass(frozen=True)
class Report:
    call_id: int
    call_digest: str
    identity_digest: str
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_wire(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "kind": Kind.REPORT.value,
            "call_id": self.call_id,
            "call_digest": self.call_digest,
            "identity_digest": self.identity_digest,
            "ok": self.ok,
        }
        if self.error is None:
            m["result"] = self.result if self.result is not None else {}
        else:
            m["error"] = {"type": self.error.type, "message": self.error.message}
        return m

    @classmethod
    def from_wire(cls, m: Any) -> Report:
        m = _map(m, "report")
        ok = _field(m, "ok", bool, "report")
        common = {
            "call_id": _field(m, "call_id", int, "report"),
            "call_digest": _field(m, "call_digest", str, "report"),
            "identity_digest": _field(m, "identity_digest", str, "report"),
        }
        # A report carries a result or an error, as `ok` says; one carrying both is contradictory, not lenient.
        if ok:
            if "error" in m:
                raise ProtocolError("report says ok but carries an error")
            return cls(**common, result=_field(m, "result", dict, "report"))
        if "result" in m:
            raise ProtocolError("report says not ok but carries a result")
        return cls(**common, error=ErrorInfo.from_wire(_field(m, "error", dict, "report")))


def shutdown_message() -> dict[str, Any]:
    return {"kind": Kind.SHUTDOWN.value}
