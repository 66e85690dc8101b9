"""Starting an engine for a package: one place that every command (`infer`, `evaluate`, `score`, `use run`,
`train`) drives engines through.

Decisions:
- **A package is launched, then checked.** A package's launch settings become the worker's command line; the
  worker then declares its identity (engine versions, settings, patches) at handshake. Where a contract names the
  package, that identity must equal the contract's exactly, or the worker is stopped before any call is made: the
  records must never hold evidence from a worker the contract did not name.
- **The core names the files.** The model and adapter are named by the tree digests the core computes itself, and
  the worker must report them back.
- **Options are checked before any worker starts** (`invar.runner.options`): a model load takes seconds, and a bad
  seed must not cost them.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.engines import LAUNCH_SETTINGS as LAUNCH_SETTINGS
from invar.engines import Dtype as Dtype
from invar.engines import Engine as Engine
from invar.engines import LaunchSetting as LaunchSetting
from invar.engines import Quantization as Quantization
from invar.engines import Transport, start_worker
from invar.engines import launch_args as launch_args
from invar.engines import parse_launch_settings as parse_launch_settings
from invar.errors import EvidenceError, InvarError, ProtocolError
from invar.evidence import Difference, first_difference
from invar.formats.model_config import check_effective
from invar.protocol import Identity, Role
from invar.protocol.methods import LOAD_ADAPTER, LOAD_MODEL, Method, Wire
from invar.protocol.payloads import (
    AdapterRef,
    GenerateParams,
    GenerateResult,
    LoadAdapterParams,
    LoadModelParams,
)
from invar.records import RunStore
from invar.transport import Answer, WorkerClient, WorkerLost

ADAPTER_NAME = "policy"
"""The name under which a session loads its adapter into the worker."""


def _difference(expected: Any, actual: Any, where: str) -> str | None:
    diff = first_difference(expected, actual, where)
    return None if diff is None else diff.said(_IDENTITY_WORDS)


_IDENTITY_WORDS: dict[str, Callable[[Difference], str]] = {
    "missing": lambda d: f"{d.where} is missing from the worker's identity (the contract has {d.expected!r})",
    "unexpected": lambda d: f"{d.where} = {d.actual!r} in the worker's identity is not in the contract",
    "other": lambda d: f"{d.where} is {d.actual!r} in the worker's identity, {d.expected!r} in the contract",
}
"""How a start says where a worker's identity differs from the package the contract names."""


def check_identity(identity: Identity, engine_version: Mapping[str, str], settings: Mapping[str, Any],
                   who: str) -> None:
    """The worker must be the package the contract names: engine versions and settings (patches included) equal."""
    for what, expected, actual in (("engine_version", dict(engine_version), identity.engine_version),
                                   ("settings", dict(settings), identity.settings)):
        diff = _difference(expected, actual, f"{who}.{what}")
        if diff is not None:
            raise EvidenceError(f"the {who} worker is not the package the contract names: {diff}; run it with the "
                                "package the contract fixes (or prepare a contract for this one)")


@dataclass(frozen=True)
class EngineSpec:
    """What a session starts and loads: the engine and its launch, the model, its dtype and quantization, an adapter.

    The digests are the core's own (`digests`).
    """

    engine: Engine
    model: Path
    dtype: Dtype = Dtype.FLOAT32
    quantization: Quantization = Quantization.NONE
    adapter: Path | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Launch settings (a package's `settings`); empty: the worker's defaults."""
    patches: Mapping[str, str] = field(default_factory=dict)
    """Patches and kernels to apply at start: reference (a name under patches/, or a folder path) → sha256."""
    patch_dirs: Mapping[str, str] = field(default_factory=dict)
    """Where a reference's folder lies when the worker cannot find it from the reference itself (a contract's path,
    relative to the contract): reference → absolute folder. The worker checks its digest again before it runs."""
    premises: tuple[str, ...] = ()
    """Effective-configuration fields the package declares its engine does not honour (`known_premises`): where the
    worker's configuration differs from the folder's there, the difference is shown, not refused."""
    worker_digest: str | None = None
    """The worker code digest the package names (`invar.worker_code`), checked before the worker starts and again
    against its handshake; None: not pinned (a command that runs no contract)."""

    @functools.cached_property
    def digests(self) -> tuple[str, str | None]:
        """Tree digests of the model and adapter folders (computed once); `InvarError` naming a missing folder."""
        for what, path in (("--model", self.model), ("--adapter", self.adapter)):
            if path is not None and not path.is_dir():
                raise InvarError(f"{what} {path}: no such folder; pass the folder that holds the "
                                 f"{'model' if what == '--model' else 'LoRA adapter'}")
        model = canonical.tree_digest(str(self.model))
        adapter = None if self.adapter is None else canonical.tree_digest(str(self.adapter))
        return model, adapter

    def meta(self) -> dict[str, Any]:
        model, adapter = self.digests
        return {"engine": self.engine.value, "model": str(self.model), "model_digest": model,
                "dtype": self.dtype.value, "quantization": self.quantization.value,
                "adapter": None if self.adapter is None else str(self.adapter), "adapter_digest": adapter,
                **({"patches": dict(self.patches)} if self.patches else {})}


@dataclass(frozen=True)
class Session:
    """A started worker with the model (and adapter) loaded as the core asked."""

    client: WorkerClient
    adapter: str | None
    """The adapter name to pass in calls (None: the model as loaded)."""
    model_digest: str
    adapter_digest: str | None
    eos_token_id: int
    max_model_len: int | None


def session_premises(spec: EngineSpec) -> tuple[str, ...]:
    """The effective-configuration fields a session accepts as premises: the package's `known_premises`, and the
    rope of a package that runs MLX with map_rope_parameters = false (the package is about mlx-lm as installed)."""
    implied = ("rope_theta",) if spec.settings.get("map_rope_parameters") is False else ()
    return tuple(dict.fromkeys((*spec.premises, *implied)))


def default_run_dir(command: str) -> Path:
    """A fresh run directory under ./runs, named by the command and the local time to the microsecond."""
    return Path("runs") / f"{command}-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}"


@contextlib.contextmanager
def engine_session(
    spec: EngineSpec,
    store: RunStore,
    *,
    role: Role = Role.INFERENCE,
    expect: tuple[Mapping[str, str], Mapping[str, Any], str] | None = None,
    adapter_in_load: bool = False,
    resume_training: bool = False,
    call_timeout: float | None = 1800.0,
    ready: Callable[[], object] = lambda: None,
    placement: Transport | None = None,
    phase: Callable[[str], object] = lambda text: None,
    watch: Callable[[WorkerClient], contextlib.AbstractContextManager[object]] = lambda _: contextlib.nullcontext(),
) -> Iterator[Session]:
    """Start the engine's worker (recording into `store`), load the model and adapter; stop the worker after.

    `expect` = (engine_version, settings, who): the identity the worker must declare, checked before any call.
    `adapter_in_load`: load the adapter with the model (as a contract's package does) instead of by name.
    `resume_training` (a learner, with `adapter_in_load`): continue training the adapter, restoring the optimizer
    state saved with it (a training checkpoint).
    `ready` is called after the identity check and before the first call (`use run` waits there until every
    package's worker has passed its check).
    `placement`: start the worker there, e.g. as a Ray actor (`invar.engines.start_worker`).
    `phase` is told what the session is doing (starting the worker, loading the model), for a command to show.
    `watch` holds the client from its handshake until its model is loaded (a `WorkerPool` stops a worker that is
    still loading at once at a signal: a load has no answer worth waiting for).
    """
    spec.digests  # noqa: B018  (first: a missing folder costs no worker start)
    args = launch_args(spec.engine.value, spec.settings, spec.patches, spec.patch_dirs)
    code = None if spec.worker_digest is None else (spec.worker_digest, expect[2] if expect else spec.engine.value)
    phase(f"starting the {spec.engine.value} worker")
    client = start_worker(spec.engine.value, role, args=args, recorder=store, call_timeout=call_timeout,
                          placement=placement, code=code)
    try:
        with watch(client):
            if expect is not None:
                check_identity(client.identity, expect[0], expect[1], expect[2])
            ready()
            phase("loading the model")
            session = _load(spec, client, adapter_in_load, resume_training, phase)
        yield session
    finally:
        client.close()


def _load(spec: EngineSpec, client: WorkerClient, adapter_in_load: bool, resume_training: bool,
          phase: Callable[[str], object]) -> Session:
    """Load `spec`'s model (and adapter) into a started worker, each checked against the core's digests."""
    model_digest, adapter_digest = spec.digests
    adapter_ref = None
    if adapter_in_load and spec.adapter is not None:
        adapter_ref = AdapterRef(str(spec.adapter.resolve()), adapter_digest, True if resume_training else None)
    loaded = client.call(LOAD_MODEL, LoadModelParams(
        str(spec.model.resolve()), model_digest, spec.dtype.value, spec.quantization.value, adapter_ref,
    ))
    if loaded.model_digest != model_digest:
        raise EvidenceError(f"the {spec.engine.value} worker reports model digest {loaded.model_digest[:16]}…, "
                            f"not {model_digest[:16]}…: it loaded other files than the core named")
    if loaded.effective_config is not None:
        # the configuration the engine built, field by field against the folder's config.json (which the model
        # digest seals): a field the package does not declare a known premise is refused here, before any call
        for line in check_effective(spec.model, spec.engine.value, loaded.effective_config, session_premises(spec)):
            phase(f"known premise of the package: {line}")
    name = None
    if spec.adapter is not None and not adapter_in_load:
        got = client.call(LOAD_ADAPTER, LoadAdapterParams(ADAPTER_NAME, str(spec.adapter.resolve()), adapter_digest))
        if got.adapter_digest != adapter_digest:
            raise EvidenceError(f"the {spec.engine.value} worker reports adapter digest {got.adapter_digest[:16]}…, "
                                f"not {adapter_digest}")
        name = ADAPTER_NAME
    return Session(client, name, model_digest, adapter_digest, loaded.eos_token_id, loaded.max_model_len)


RESTARTS = 3
"""How many times one Ray-placed worker may be replaced after it is lost, before the command stops."""


class Lease:
    """One worker slot: a session started by `start`, replaced by a fresh one from the same `start` when its worker
    is lost (at most `restarts` times; with none, the loss is raised as it came).

    `start(ready)` enters a session; `ready` runs once, for the first session only (`use run` waits there for every
    worker's identity check). A replacement passes whatever checks `start` makes before its first call.
    `replaced` counts the replacements, so a caller can tell which of its calls went to a lost worker."""

    def __init__(self, start: Callable[[Callable[[], object]], contextlib.AbstractContextManager[Session]],
                 ready: Callable[[], object], restarts: int, who: str) -> None:
        self._start, self._ready, self._left, self._restarts, self._who = start, ready, restarts, restarts, who
        self._stack = contextlib.ExitStack()
        self.session: Session | None = None
        self.replaced = 0

    def __enter__(self) -> Lease:
        self.session = self._stack.enter_context(self._start(self._ready))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def replace(self, lost: WorkerLost) -> Session:
        """Stop what is left of the lost worker and start its replacement; `ProtocolError` once none is left."""
        if not self._restarts:
            raise lost
        while True:
            if self._left <= 0:
                # Its first line, without the stderr tail (an error's newlines are escaped where it is made).
                first = str(lost).split("\\n", 1)[0] if str(lost) else type(lost).__name__
                raise ProtocolError(f"{self._who} was lost {self._restarts + 1} times (replaced {self._restarts} "
                                    f"times); last: {first}")
            self._left -= 1
            self.session = None
            with contextlib.suppress(ProtocolError):
                self._stack.close()  # the lost worker's session: stop what is left of it
            self._stack = contextlib.ExitStack()
            try:
                self.session = self._stack.enter_context(self._start(lambda: None))
                self.replaced += 1
                return self.session
            except WorkerLost as exc:
                lost = exc

    def ask(self, method: str | Method[Any, Any], params: Mapping[str, Any] | Wire) -> Answer:
        """A call answered by this slot's worker; a lost worker's call is issued again to its replacement."""
        while True:
            assert self.session is not None
            try:
                return self.session.client.ask(method, params)
            except WorkerLost as exc:
                self.replace(exc)


@contextlib.contextmanager
def _probe(engine: Engine, settings: Mapping[str, Any] | None, patches: Mapping[str, str] | None,
           patch_dirs: Mapping[str, str] | None) -> Iterator[WorkerClient]:
    """A worker started with these launch settings and patches, recording nothing, stopped after."""
    client = start_worker(engine.value, Role.INFERENCE,
                          args=launch_args(engine.value, settings or {}, patches or {}, patch_dirs))
    try:
        yield client
    finally:
        client.close()


def probe_identity(engine: Engine, settings: Mapping[str, Any] | None = None,
                   patches: Mapping[str, str] | None = None,
                   patch_dirs: Mapping[str, str] | None = None) -> Identity:
    """Start a worker with these launch settings and patches, read its handshake identity, and stop it.

    What a contract's package must state (`engine_version`, `settings`) is exactly this identity's.
    """
    with _probe(engine, settings, patches, patch_dirs) as client:
        return client.identity


def probe_effective(engine: Engine, model: Path, settings: Mapping[str, Any] | None = None,
                    patches: Mapping[str, str] | None = None,
                    patch_dirs: Mapping[str, str] | None = None) -> tuple[Identity, Mapping[str, Any] | None]:
    """Start a worker as `probe_identity` does, load `model` (float32, unquantized), and return its identity and
    the effective configuration it reports (None: the worker reports none); the worker is stopped after."""
    with _probe(engine, settings, patches, patch_dirs) as client:
        digest = canonical.tree_digest(str(model))
        loaded = client.call(LOAD_MODEL, LoadModelParams(str(model.resolve()), digest, Dtype.FLOAT32.value,
                                                         Quantization.NONE.value, None))
        return client.identity, loaded.effective_config


def read_generate(received: GenerateResult, params: GenerateParams, model_digest: str) -> GenerateResult:
    """A generate result (read by the client as `GENERATE`'s struct), checked once: one output per request, each
    answering the request it is listed for with the prompt ids it asked for, from the model the core named."""
    requests = params.requests
    if len(received.outputs) != len(requests):
        raise EvidenceError(f"generate returned {len(received.outputs)} outputs for {len(requests)} requests")
    if received.model_digest != model_digest:
        raise EvidenceError(f"generate reports model digest {received.model_digest[:16]}…, not "
                            f"{model_digest[:16]}…")
    for request, output in zip(requests, received.outputs, strict=True):
        if output.request_id != request.request_id:
            raise EvidenceError(f"generate output for request {request.request_id!r} is labelled "
                                f"{output.request_id!r}: outputs must come back in request order")
    for request, output in zip(requests, received.outputs, strict=True):
        if not np.array_equal(output.prompt_tokens, request.prompt_ids):
            raise EvidenceError(f"generate output for request {request.request_id!r}: the engine ran other prompt "
                                "tokens than the call asked for")
    return received
