"""`use run`: execute a contract's finite plan exactly, keep every record, and resume a run that was stopped.

Decisions:
- **Only the plan runs.** Every generate call is a planned call with its exact params (`invar.contract.plan`);
  nothing is chosen at run time, so admission can demand that the run did exactly the plan.
- **Workers are the contract's packages or nothing.** Each package's worker is started with the package's launch
  settings and patches; its handshake identity must equal the package's (engine versions, settings, patches)
  before any call is made (`invar.runner.engine.check_identity`). Files are checked before workers start: the
  model and adapter tree digests and each patch's digest must be the contract's.
- **Resume from the records.** A run directory that already holds records is verified (a damaged store is refused,
  naming the record), must have been made under this contract, and is read under it by the reader admission uses
  (`invar.contract.reading.RunReader.bind_partial`); only planned calls without a successful record are issued
  again. Engines are seeded per request, so a re-issued call gives what the lost one would have, and the decision
  equals that of an uninterrupted run. The writer lock refuses a second `use run` on the same directory.
- **Reference and candidate run side by side**, one worker thread each; their generate calls do not depend on
  each other. The threads, their barriers, the call gate, halting, the grace at a signal and the replacement of a
  lost worker are the command's `invar.runner.pool.WorkerPool`; this module only says which calls go when.
- **The run directory is opened once** (`open_run`): a closed run of this contract is answered from its head, a
  new one is created with the contract's inputs, an existing one is verified and opened for writing.
- **Measurements follow the generate calls** (plan /3): once both packages have sampled, each scores the
  responses the plan names (with teacher forcing, the reference's) in the batches they were sampled in, with the
  same worker. Their params are `invar.contract.plan.measurement_params` of the recorded responses, exactly what
  admission recomputes.
- **Sequential contracts (plan /4) run look by look.** Look k is part k of both packages' pairing calls; after each
  look the stopping rule (`RunReader.rule`, as admission recomputes it) is evaluated on the losses of every unit so
  far, in the plan's order, and no call of the next look is issued once it stops.
  The stop (answer, look, units, and the digests of the calls it used) is recorded in the run's meta before the
  closing record. A resumed run first evaluates the rule on the looks already recorded, so it reaches the same stop.
- **Workers may be Ray actors** (`ray`): each worker is started as a Ray actor on the cluster at that address and
  relays the same frames (`invar.transport.ray_relay`); the core binds and records every report here. A Ray
  worker that is lost mid-run (its actor killed, its node gone) is replaced by a fresh one from the same package,
  whose identity is checked against the contract again, and the call it left unanswered is issued again (the
  unanswered call stays on record; the re-issued one is a new record that binds the planned call), at most
  `RESTARTS` times per worker. A local worker's death stops the run instead (it is usually the machine or the
  operator; resuming the run recovers it with nothing lost). A `transport` in place of local subprocesses (the
  tests' in-process fake worker) is replaced as many times as it says.
- A finished run gets its closing record; its head is returned for the caller to print and keep.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import numpy as np

from invar import patches
from invar.contract.bind import (
    NON_FINITE,
    SEQUENTIAL_META,
    check_package_report,
    parse_outputs,
    run_contract_sha256,
    score_outputs,
    stop_record,
)
from invar.contract.inputs import check_method_version, run_inputs
from invar.contract.model import Contract, Package
from invar.contract.plan import ExecutionPlan, MeasurementCall, PlannedCall, Role, measurement_params
from invar.contract.prepare import check_config_changes, load_contract
from invar.contract.reading import RunReader
from invar.engines import Transport, check_worker_code, engine_info
from invar.errors import ContractError, EvidenceError, InvarError, NotResumable, WorkerError
from invar.owner_files import sha256_file
from invar.parallel import cores
from invar.records import RunStore
from invar.records.store import is_run
from invar.runner.engine import (
    RESTARTS,
    Dtype,
    Engine,
    EngineSpec,
    Lease,
    Quantization,
    Session,
    engine_session,
)
from invar.runner.pool import Start, WorkerPool
from invar.stats.sequential import SequentialDecision

if TYPE_CHECKING:
    from invar.transport.ray_relay import RayPlacement

ROLES: tuple[Role, Role] = ("reference", "candidate")
T = TypeVar("T")
MAX_WORKERS = 64
"""The most worker processes `use run --workers` starts per package (fewer when the package has fewer calls left)."""


@dataclass(frozen=True)
class Progress:
    """How far a run is: planned calls and their requests done, of the totals."""

    calls_done: int
    calls_total: int
    requests_done: int
    requests_total: int


@dataclass(frozen=True)
class RunOutcome:
    """What `use_run` did."""

    run: Path
    contract: Path
    contract_sha256: str
    head: str
    calls_total: int
    calls_reused: int
    """Planned calls already answered in the records when this invocation started (a resumed run)."""
    calls_issued: int
    wall_s: float
    already_closed: bool
    stop: dict[str, Any] | None = None
    """Sequential contracts: where the stopping rule stopped (the run's meta `sequential_stop`)."""
    nonfinite: str | None = None
    """The candidate call answered with non-finite values that ended the run (it is closed there), as one line."""
    signal: str | None = None
    """The signal (`SIGTERM`, `Ctrl-C`) that came while the run's last calls were under way (the plan's last, or the
    look where a sequential rule stops): they were answered within the grace and the run closed, so nothing was left
    to stop."""


def admit_command(run: Path, contract: Path, head: str) -> str:
    """The command that decides a finished run, anchored at its head."""
    return f"invar use admit {run} --contract {contract} --expect-head {head}"


def check_sha256_file(contract_path: Path, sha: str) -> None:
    """A contract whose `.sha256` sibling (written by `use prepare`) names other bytes was changed since: refuse it."""
    sibling = contract_path.with_name(contract_path.name + ".sha256")
    if not sibling.exists():
        return
    recorded = sha256_file(sibling, "it should hold the contract's sha256 as use prepare wrote it")
    if recorded != sha:
        raise ContractError(f"{contract_path}: its sha256 is {sha[:16]}…, but {sibling.name} records {recorded[:16]}…: "
                            "the contract was changed after use prepare wrote it; prepare it again from the "
                            "declaration")


def failed_call(error: WorkerError, where: str, package: Package) -> str:
    """The message of a call its worker answered with an error: the call, the package (its engine and the patches it
    runs, which are what a failure mid-call most often comes from) and the worker's words. The error is on record;
    a resume repeats the call, which fails again while the package is unchanged."""
    runs = f", patches {', '.join(sorted(package.patches))}" if package.patches else ""
    hint = ("; the run's records keep the error, and a resume repeats the call, which fails the same way while the "
            "package is unchanged: fix the patch or kernel and prepare a new contract")
    if error.error_type == "NonFiniteOutput":
        return f"{where}: the package ({package.engine}{runs}) produced non-finite values: {error.message}{hint}"
    return f"{where}: the package ({package.engine}{runs}) failed: {error.message}"


def package_spec(package: Package, base: Path, role: Role) -> EngineSpec:
    """The engine spec of a contract's package, after checking every file it names against the contract."""
    model = base / package.model_dir
    adapter = None if package.adapter is None else base / package.adapter.path
    if package.worker_digest is None:
        raise ContractError(f"{role}.worker_digest: the contract names no worker code (it was prepared before worker "
                            "code was pinned), so no run can show which code answered; prepare it again from its "
                            "declaration")
    # The worker's files are hashed before any worker starts, so a changed worker costs no model load.
    check_worker_code(package.engine, package.worker_digest, role)
    folders = {name: patches.patch_dir(name, base) for name in package.patches}
    spec = EngineSpec(Engine(package.engine), model, Dtype(package.dtype), Quantization(package.quantization),
                      adapter, settings=dict(package.settings), patches=dict(package.patches),
                      patch_dirs={k: str(f.resolve()) for k, f in folders.items() if patches.is_path(k)},
                      premises=package.premise_fields(), worker_digest=package.worker_digest)
    model_digest, adapter_digest = spec.digests
    if model_digest != package.model_digest:
        raise ContractError(f"{role}.model_dir: {model} has tree digest {model_digest[:16]}…, the contract fixes "
                            f"{package.model_digest[:16]}…; point the contract at the model it names")
    if package.adapter is not None and adapter_digest != package.adapter.digest:
        raise ContractError(f"{role}.adapter: {adapter} has tree digest {str(adapter_digest)[:16]}…, the contract "
                            f"fixes {package.adapter.digest[:16]}…")
    for name, sha in package.patches.items():
        patches.check_folder(name, sha, folders[name], f"{role}.patches.{name}")
    return spec


class ForeignRun(NotResumable, EvidenceError):
    """The run directory holds a run of another contract: this command cannot resume it (the CLI adds no hint)."""


def _check_run(store: RunStore, sha: str, contract_path: Path) -> None:
    """An existing run must verify and have been made under this contract."""
    store.verify()
    made_under = run_contract_sha256(store)
    if made_under != sha:
        run_meta = store.meta().get("run")
        recorded = run_meta.get("contract") if isinstance(run_meta, dict) else None
        own = f" ({recorded}, as recorded)" if isinstance(recorded, str) else ""
        raise ForeignRun(f"{store.path}: the run was made under contract {made_under[:16]}…, not {sha[:16]}… "
                         f"({contract_path}); resume it with the contract it was made under{own}, or choose a new "
                         "run directory for this one")


@dataclass
class OpenRun:
    """A run directory opened for this contract, answered once: `new` (created, the contract's inputs kept),
    `resumed` (an existing run of this contract, verified, opened for writing) or `closed` (nothing left to do)."""

    state: Literal["new", "resumed", "closed"]
    store: RunStore | None
    """Open for writing (None when closed)."""
    head: str | None = None
    """A closed run's head."""
    stop: dict[str, Any] | None = None
    """A closed sequential run's stop, as recorded."""


def open_run(run_dir: Path, contract: Contract, sha: str, contract_path: Path, *,
             before_writing: Callable[[], object] = lambda: None,
             phase: Callable[[str], object] = lambda text: None) -> OpenRun:
    """Open `run_dir` for the contract: a closed run of it is only verified; otherwise `before_writing` runs (joining
    a Ray cluster: before the run directory is touched) and the run is created, or opened for writing, verified
    and checked to be this contract's."""
    if is_run(run_dir):
        with RunStore.open(run_dir) as existing:
            if existing.closed:
                _check_run(existing, sha, contract_path)
                return OpenRun("closed", None, existing.verify().head, existing.meta().get(SEQUENTIAL_META))
    before_writing()
    if not is_run(run_dir):
        store = RunStore.create(run_dir, meta={"command": "use run", "contract_sha256": sha,
                                               "contract_name": contract.name, "contract": str(contract_path)})
        store.put_meta("inputs", run_inputs(contract, contract_path.parent))
        return OpenRun("new", store)
    phase("verifying the records")
    store = RunStore.open(run_dir, writable=True)
    try:
        _check_run(store, sha, contract_path)
        if "inputs" not in store.meta():
            # The first attempt stopped between creating the run and keeping its inputs (a full disk, a kill): keep
            # them now, so the run decides away from the owner's files as an uninterrupted one does.
            store.put_meta("inputs", run_inputs(contract, contract_path.parent))
    except BaseException:
        store.close()
        raise
    return OpenRun("resumed", store)


def use_run(
    contract_path: Path,
    run_dir: Path,
    *,
    call_timeout: float | None = 1800.0,
    progress: Callable[[Progress], None] = lambda p: None,
    workers: int = 1,
    ray: str | None = None,
    phase: Callable[[str], object] = lambda text: None,
    transport: Transport | None = None,
    calls_at_once: int | None = None,
) -> RunOutcome:
    """Execute (or resume) the plan of the contract at `contract_path` into `run_dir`, over `workers` worker
    processes per package (each started from the package and checked against it; a call is answered by one of
    them and bound to the one that answered it). `ray`: the address of a Ray cluster to place the workers on, as
    actors (joined before the run directory is touched). `phase` is told what is under way (verifying the records
    of a resumed run, starting workers, loading the models, generating, measuring, deciding); `progress`, the
    planned calls done. `transport`: start the workers there instead of as local subprocesses (tests: an in-process
    fake worker), replacing a lost one at most `transport.restarts` times. `calls_at_once`: at most this many calls
    computing at once over all workers (None: as many as this host's cores hold, from what each package's engine
    computes on, `calls_at_once_for`); the calls, their records and every number stay the same, only when each is
    issued changes."""
    _check_options(ray, transport, workers, calls_at_once)
    started = time.perf_counter()
    reader, specs = _read_contract(contract_path)
    total = len(reader.plan.calls) + len(reader.plan.measurements)
    placement: list[RayPlacement] = []
    run = open_run(run_dir, reader.contract, reader.sha256, contract_path,
                   before_writing=lambda: placement.extend(_join(ray)), phase=phase)
    if run.store is None:
        assert run.head is not None
        return RunOutcome(run_dir, contract_path, reader.sha256, run.head, total, total, 0,
                          time.perf_counter() - started, already_closed=True, stop=run.stop)
    with run.store as store:
        work, done = _work_left(reader, store if run.state == "resumed" else None)
        counter = _Counter(reader.plan, done, progress)
        counter.report()
        launch = _Launch(specs, workers, call_timeout, placement[0] if placement else None, transport, calls_at_once)
        issued, nonfinite, heard = 0, None, None
        for part in _passes(work):
            answered, nonfinite, heard = _execute(reader, launch, part, store, counter, phase)
            issued += answered
            if nonfinite is not None or heard is not None:
                break
        if work.rule is not None and nonfinite is None:
            phase("deciding")
        stop = None if work.rule is None or nonfinite is not None else _record_stop(store, reader)
        head = store.close_run()
    return RunOutcome(run_dir, contract_path, reader.sha256, head, total, len(done), issued,
                      time.perf_counter() - started, already_closed=False, stop=stop, nonfinite=nonfinite,
                      signal=heard)


def _passes(work: _Work) -> list[_Work]:
    """The work in passes, each over workers started for it: every first-run call and the measurements, then each
    later run of the determinism layout on its own, so no process of an earlier run answers a later one."""
    runs = sorted({c.run for calls in work.todo.values() for c in calls} | {1})
    first = dataclasses.replace(work, todo={role: [c for c in work.todo[role] if c.run == 1] for role in ROLES})
    return [first] + [_Work({role: [c for c in work.todo[role] if c.run == run] for role in ROLES},
                            {role: [] for role in ROLES}, work.tokens, None, 0, work.nonfinite)
                      for run in runs[1:]]


class _NonFinite(WorkerError):
    """A candidate call answered with `NonFiniteOutput`: the run stops issuing calls and closes, since that recorded
    error decides admission (Violated) by itself and a repeat fails the same way while the package is unchanged."""

    def __init__(self, error: WorkerError, message: str) -> None:
        super().__init__(error.method, error.error_type, message)
        self.message = message


def _check_options(ray: str | None, transport: Transport | None, workers: int, calls_at_once: int | None) -> None:
    """`use run`'s options, checked before anything is read or started."""
    if ray is not None and transport is not None:
        raise InvarError("use_run: give a Ray address or a transport, not both")
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise InvarError(f"--workers {workers}: must be a whole number ≥ 1 and at most {MAX_WORKERS} (worker "
                         "processes per package; each loads the model)")
    if calls_at_once is not None and (isinstance(calls_at_once, bool) or not isinstance(calls_at_once, int)
                                      or calls_at_once < 1):
        raise InvarError(f"--calls-at-once {calls_at_once}: must be a whole number ≥ 1 (calls computing at once "
                         "over all workers), or left out to fit this machine's cores")


def _read_contract(contract_path: Path) -> tuple[RunReader, dict[Role, EngineSpec]]:
    """The contract read and checked with every file it names, before any worker starts: the reader that binds
    the run's records as admission does, and each package's engine spec."""
    contract, sha, plan = load_contract(contract_path)
    check_sha256_file(contract_path, sha)
    check_method_version(contract, "run with the Invar version the contract names")
    base = contract_path.parent
    specs = {role: package_spec(contract.package(role), base, role) for role in ROLES}
    check_config_changes(contract, base)  # each worker is then checked against its folder's configuration
    # The run is read under its contract as admission reads it: the same reader binds a resumed run's records and
    # recomputes the stopping rule.
    reader = RunReader.of_models(contract, sha, plan, base, {role: specs[role].model for role in ROLES})
    _ = reader.scorer  # a changed user scorer is refused before any worker starts
    return reader, specs


def _join(ray: str | None) -> list[RayPlacement]:
    """Join the Ray cluster at `ray` (if any): where the workers are placed."""
    if ray is None:
        return []
    from invar.transport.ray_relay import RayPlacement, connect

    connect(ray)
    return [RayPlacement(ray, restarts=RESTARTS)]


def _work_left(reader: RunReader, resumed: RunStore | None) -> tuple[_Work, set[str]]:
    """What is left of the plan, and the planned calls already answered in a resumed run's records."""
    plan = reader.plan
    tokens: dict[tuple[Role, int], np.ndarray] = {}
    done: set[str] = set()
    first_look = 0
    nonfinite = None
    if resumed is not None:
        # One call at a time, outputs checked and dropped: a resumed run reads its records in bounded memory.
        bound = reader.bind_partial(resumed)
        done = set(bound.found) | set(bound.measured)
        if bound.nonfinite:  # stopped there before it could close: the recorded error decides, no call is repeated
            first = bound.nonfinite[0]
            nonfinite = (f"candidate call {first.key} (call id {first.call_id}) answered NonFiniteOutput: "
                         f"{first.message}")
            return _Work({role: [] for role in ROLES}, {role: [] for role in ROLES}, tokens, None, 0, nonfinite), done
        for c in plan.calls if _needs_tokens(plan) else ():
            if c.layout == plan.pairing_layout and c.run == 1 and c.key in bound.found:
                for index, out in zip(c.units, bound.found[c.key].outputs, strict=True):
                    tokens[(c.package, index)] = np.array(out.tokens, copy=True)
        if plan.sequential is not None:
            first_look = reader.looks(bound.found, str(resumed.path), running=True)
    rule = None if plan.sequential is None else _Rule(reader, tokens)
    todo = {role: [c for c in plan.calls if c.package == role and c.key not in done] for role in ROLES}
    measure = {role: [m for m in plan.measurements if m.package == role and m.key not in done] for role in ROLES}
    if rule is not None and first_look and rule.stops(first_look):
        todo = {role: [] for role in ROLES}  # stopped before the kill: only the stop and the close are left
    return _Work(todo, measure, tokens, rule, first_look), done


def calls_at_once_for(specs: Mapping[Role, EngineSpec], workers: Mapping[Role, int],
                      cores: int) -> tuple[int, str] | None:
    """How many calls may compute at once on this host without the engines taking turns on its cores, and why; None
    when the workers may all compute at once (or what they use is not known). Each package's engine says how many
    cores one of its calls keeps busy (`EngineInfo.host_cores`): two vLLM CPU engines on 2 cores computing side by
    side took 48-51 s for two calls that took about 11 s each alone (docs/performance.md)."""
    busiest, why = 0, ""
    for role, count in workers.items():
        if not count:
            continue
        spec = specs[role]
        used = engine_info(spec.engine.value).host_cores(spec.settings, cores)
        if used is not None and used > busiest:
            busiest, why = used, f"a {spec.engine.value} call computes on {used} of {cores} cores"
    if not busiest:
        return None
    at_once = max(1, cores // busiest)
    if at_once >= sum(workers.values()):
        return None
    return at_once, why


def _needs_tokens(plan: ExecutionPlan) -> bool:
    """Whether the run needs the pairing responses' tokens as it goes: measurements are made of them (plan /3) and
    the stopping rule scores them (plan /4); any other plan's calls depend on nothing sampled."""
    return bool(plan.measurements) or plan.sequential is not None


class _Rule:
    """The stopping rule during a run: evaluated after each look on the pairing responses sampled so far."""

    def __init__(self, reader: RunReader, tokens: Mapping[tuple[Role, int], np.ndarray]) -> None:
        self._reader, self._tokens = reader, tokens
        self._loss: dict[tuple[Role, int], float] = {}
        self.decision: SequentialDecision | None = None

    def _unit_loss(self, role: Role, index: int) -> float:
        if (role, index) not in self._loss:
            self._loss[(role, index)] = self._reader.unit_loss(role, index, self._tokens[(role, index)])
        return self._loss[(role, index)]

    def stops(self, looks: int) -> bool:
        """Whether the rule stops on the first `looks` looks (every one of their responses sampled)."""
        assert self._reader.plan.sequential is not None
        units = self._reader.plan.sequential.look_units(looks)
        d = np.array([self._unit_loss("candidate", i) - self._unit_loss("reference", i) for i in units],
                     dtype=np.float64)
        self.decision = self._reader.rule(d)
        return self.decision.answer != "Running"


def _record_stop(store: RunStore, reader: RunReader) -> dict[str, Any]:
    """Recompute the stop from the records, exactly as admission does, and record it in the run's meta (once)."""
    found = reader.bind_partial(store).found
    used = reader.reached_units(found, str(store.path))
    losses = reader.losses(found)
    decision = reader.stop(losses["candidate"][used] - losses["reference"][used], str(store.path))
    entry = stop_record(decision, reader.plan, found)
    kept = store.meta().get(SEQUENTIAL_META)
    if kept is None:
        store.put_meta(SEQUENTIAL_META, entry)
    elif kept != entry:
        raise EvidenceError(f"{store.path}: the run records a stop ({kept.get('answer')} at look {kept.get('look')}) "
                            "its records do not give; choose a new run directory")
    return entry


class _Share(Generic[T]):
    """Work handed out to the threads of one package: each item to exactly one of them, in order."""

    def __init__(self, items: Sequence[T]) -> None:
        self._items = collections.deque(items)
        self._lock = threading.Lock()

    def take(self) -> T | None:
        with self._lock:
            return self._items.popleft() if self._items else None


class _Counter:
    """Progress across the worker threads."""

    def __init__(self, plan: ExecutionPlan, done: set[str], sink: Callable[[Progress], None]) -> None:
        self._lock = threading.Lock()
        self._sink = sink
        every: list[PlannedCall | MeasurementCall] = [*plan.calls, *plan.measurements]
        self.calls_total = len(every)
        self.requests_total = sum(len(c.units) for c in every)
        self.calls_done = len(done)
        self.requests_done = sum(len(c.units) for c in every if c.key in done)

    def add(self, planned: PlannedCall | MeasurementCall) -> None:
        with self._lock:
            self.calls_done += 1
            self.requests_done += len(planned.units)
        self.report()

    def report(self) -> None:
        self._sink(Progress(self.calls_done, self.calls_total, self.requests_done, self.requests_total))


def workers_per_package(todo: Mapping[Role, Sequence[PlannedCall]], measure: Mapping[Role, Sequence[MeasurementCall]],
                        workers: int) -> dict[Role, int]:
    """How many workers each package starts: `workers`, but never more than it has calls left to issue (a worker
    with nothing to answer would only load the model), and none for a package that is done."""
    return {role: min(workers, len(todo[role]) + len(measure[role])) for role in ROLES}


@dataclass(frozen=True)
class _Launch:
    """How a run's workers start: each package's engine spec, how many per package, where (a Ray placement or a
    transport; local subprocesses otherwise), and how long one call may take."""

    specs: Mapping[Role, EngineSpec]
    workers: int = 1
    call_timeout: float | None = 1800.0
    placement: RayPlacement | None = None
    transport: Transport | None = None
    calls_at_once: int | None = None
    """At most this many calls computing at once over all workers; None: as many as the host's cores hold
    (`calls_at_once_for`), each worker's call as soon as it is free when they all fit or run elsewhere."""


@dataclass(frozen=True)
class _Work:
    """What is left of the plan: each package's generate calls and measurements without a successful record, the
    pairing layout's response tokens on record by (package, unit index) (it gains those sampled now), and for a
    sequential plan the stopping rule and the look to go on from."""

    todo: Mapping[Role, Sequence[PlannedCall]]
    measure: Mapping[Role, Sequence[MeasurementCall]]
    tokens: dict[tuple[Role, int], np.ndarray]
    rule: _Rule | None = None
    first_look: int = 0
    nonfinite: str | None = None
    """A resumed run's records hold a candidate call answered with non-finite values: nothing is left but closing."""


def _execute(reader: RunReader, launch: _Launch, work: _Work, store: RunStore, counter: _Counter,
             phase: Callable[[str], object] = lambda text: None) -> tuple[int, str | None, str | None]:
    """Start `launch.workers` workers per package that has calls left and issue its calls over them, generate calls
    first, then (once every package has sampled) measurements; the first failure stops all. With a stopping rule
    (plan /4) the generate calls go look by look from `work.first_look`, the rule evaluated after each.

    Returns the calls answered this time; the candidate call answered with non-finite values that ended the
    run, if one did (now, or in the records of a resumed run): on record, the run closes there and admission decides
    from that record; and the signal that came while the run's last calls were under way, when they answered within
    the grace and completed the run (`_Calls.complete`)."""
    count = workers_per_package(work.todo, work.measure, launch.workers)
    slots = [(role, n) for role in ROLES for n in range(count[role])]
    if not slots:
        return 0, work.nonfinite, None
    at_once = _calls_at_once(launch, count, phase)
    after_load = "generating" if any(work.todo.values()) else "measuring"
    pool = WorkerPool(len(slots), calls_at_once=at_once, checked=lambda: phase("loading the models"),
                      loaded=lambda: phase(after_load))
    calls = _Calls(reader, work, counter, pool, len(slots), phase)

    def serve(role: Role, n: int) -> None:
        with pool.lease(_starter(role, reader.contract.package(role), launch, store, pool), _restarts(launch, role),
                        f"the {role} worker {n + 1}") as lease:
            calls.drive(role, lease)

    try:
        # The calls under way at a signal may answer within the grace; when they completed the run, nothing is left
        # to resume, and the run closes rather than make the user start it again only to close it.
        heard = pool.run([functools.partial(serve, role, n) for role, n in slots], name="use-run",
                         stopped=lambda how: f"stopped issuing calls at {how} after {calls.issued} answered call(s) "
                                             "this time",
                         finished=calls.complete)
    except _NonFinite as exc:  # the other calls under way were answered and recorded before the pool returned
        return calls.issued, exc.message, None
    return calls.issued, None, heard


def _calls_at_once(launch: _Launch, count: Mapping[Role, int], phase: Callable[[str], object]) -> int | None:
    """How many calls may compute at once (None: all), told with the workers being started."""
    at_once, auto = launch.calls_at_once, None
    if at_once is None and launch.placement is None:  # Ray places workers on other machines, with cores of their own
        auto = calls_at_once_for(launch.specs, {role: count[role] for role in ROLES if count[role]}, cores())
        at_once = None if auto is None else auto[0]
    turns = "" if auto is None else (f"; {'one call' if auto[0] == 1 else f'{auto[0]} calls'} at a time: {auto[1]}, "
                                     "--calls-at-once to change")
    phase("starting workers (" + ", ".join(f"{launch.specs[role].engine.value} {role}"
                                           + (f" ×{count[role]}" if count[role] > 1 else "")
                                           for role in ROLES if count[role]) + turns + ")")
    return at_once


def _placed(launch: _Launch, role: Role) -> Transport | None:
    """Where a package's workers start: Ray shows an actor only the accelerators it reserved, so a package on a GPU
    reserves one."""
    if launch.placement is None:
        return launch.transport
    on_gpu = str(launch.specs[role].settings.get("device", "")).startswith("cuda")
    return dataclasses.replace(launch.placement, num_gpus=1.0) if on_gpu else launch.placement


def _restarts(launch: _Launch, role: Role) -> int:
    placed = _placed(launch, role)
    return 0 if placed is None else placed.restarts


def _starter(role: Role, package: Package, launch: _Launch, store: RunStore, pool: WorkerPool) -> Start:
    """How a package's worker starts, first or as a replacement: from its spec, its identity checked against the
    contract's package before any call, its model the contract's; stopped at once at a signal while it loads."""
    expect = (package.engine_version, package.expected_settings(), role)

    @contextlib.contextmanager
    def start(ready: Callable[[], object]) -> Iterator[Session]:
        with engine_session(launch.specs[role], store, expect=expect, adapter_in_load=True,
                            call_timeout=launch.call_timeout, ready=ready, placement=_placed(launch, role),
                            watch=pool.starting) as session:
            if session.model_digest != package.model_digest:
                raise EvidenceError(f"the {role} worker loaded model {session.model_digest[:16]}…, not the "
                                    "contract's")
            yield session
    return start


class _Calls:
    """The plan's calls handed out to the workers' threads, each call to exactly one: a package's threads share its
    queues; measurements wait until every package has sampled (the candidate scores the reference's responses);
    a sequential plan's looks go one at a time, both packages finishing look k before the rule is evaluated, and no
    call of look k + 1 preceding its verdict."""

    def __init__(self, reader: RunReader, work: _Work, counter: _Counter, pool: WorkerPool, parties: int,
                 phase: Callable[[str], object]) -> None:
        self.reader, self.work, self.counter, self.pool = reader, work, counter, pool
        plan = reader.plan
        self.keep_tokens = _needs_tokens(plan)
        self.generate = {role: _Share(work.todo[role]) for role in ROLES}
        self.measure = {role: _Share(work.measure[role]) for role in ROLES}
        self.looks: dict[tuple[Role, int], _Share[PlannedCall]] = {}
        if work.rule is not None:
            assert plan.sequential is not None
            for role in ROLES:
                left = {c.key for c in work.todo[role]}
                for look in range(work.first_look, len(plan.sequential.boundaries)):
                    self.looks[(role, look)] = _Share([c for c in plan.look_calls(look)
                                                       if c.package == role and c.key in left])

        def all_sampled() -> None:
            if any(work.measure.values()):
                phase("measuring")

        self.sampled = pool.barrier(parties, all_sampled)
        self.looked = pool.barrier(parties, self._evaluate)
        self.finished = threading.Event()
        self.look_at = work.first_look
        self.issued = 0
        self.lock = threading.Lock()

    def _evaluate(self) -> None:
        assert self.work.rule is not None
        self.look_at += 1
        if self.work.rule.stops(self.look_at):
            self.finished.set()

    def complete(self) -> bool:
        """Whether the calls answered so far complete the run, read once every worker's thread has ended: every
        planned call is answered, or (a sequential plan with no measurement to follow) the rule stops at the looks
        answered so far, as `_evaluate` would have asked it had a signal not broken the look's barrier."""
        if self.counter.calls_done == self.counter.calls_total:
            return True
        plan, work = self.reader.plan, self.work
        if work.rule is None or plan.sequential is None or any(work.measure.values()):
            return False
        if self.finished.is_set():  # the rule stopped before the signal
            return True
        looks = self.look_at + 1  # the look under way, as `_evaluate` counts it
        units = plan.sequential.look_units(looks)
        if any((role, i) not in work.tokens for role in ROLES for i in units):
            return False  # the look was not finished
        return work.rule.stops(looks)

    def drive(self, role: Role, lease: Lease) -> None:
        """Issue `role`'s calls over this worker until none is left (or the pool halts)."""
        plan, stop = self.reader.plan, self.pool.stop
        if self.work.rule is None:
            while not stop.is_set() and (planned := self.generate[role].take()) is not None:
                self._generate(role, lease, planned)
        else:
            assert plan.sequential is not None
            for look in range(self.work.first_look, len(plan.sequential.boundaries)):
                while not stop.is_set() and (planned := self.looks[(role, look)].take()) is not None:
                    self._generate(role, lease, planned)
                self.pool.wait(self.looked)
                if self.finished.is_set():
                    break
        self.pool.wait(self.sampled)
        while not stop.is_set() and (m := self.measure[role].take()) is not None:
            with self.lock:
                source = {index: self.work.tokens[(m.source, index)] for index in m.units}
            params = measurement_params(plan, m, source.__getitem__)
            if (asked := self._ask(role, lease, "score", params, m.key)) is None:
                return
            result, where = asked
            score_outputs(result, params["items"], where)
            self._done(m)

    def _ask(self, role: Role, lease: Lease, method: str, params: dict[str, Any],
             key: str) -> tuple[dict[str, Any], str] | None:
        """The call's checked result, or None when the run stopped while this thread waited its turn."""
        if (answer := self.pool.ask(lease, method, params)) is None:
            return None
        where = f"{role} call {key} (call id {answer.call.call_id})"
        package = self.reader.contract.package(role)
        try:
            result = answer.result  # raises the worker's error as WorkerError
        except WorkerError as exc:  # recorded as the worker's error; said with the package that gave it
            if role == "candidate" and method == "generate" and exc.error_type == NON_FINITE:
                raise _NonFinite(exc, f"{where} answered NonFiniteOutput: {exc.message}") from None
            raise WorkerError(exc.method, exc.error_type, failed_call(exc, where, package)) from None
        check_package_report(result, package, role, where)  # what admission checks of each record again
        return result, where

    def _generate(self, role: Role, lease: Lease, planned: PlannedCall) -> None:
        params = planned.params.to_wire()
        if (asked := self._ask(role, lease, "generate", params, planned.key)) is None:
            return
        result, where = asked
        outputs = parse_outputs(result, params["requests"], self.reader.eos[role], where)
        if planned.layout == self.reader.plan.pairing_layout and planned.run == 1 and self.keep_tokens:
            with self.lock:
                for index, out in zip(planned.units, outputs, strict=True):
                    self.work.tokens[(role, index)] = np.array(out.tokens, copy=True)
        self._done(planned)

    def _done(self, planned: PlannedCall | MeasurementCall) -> None:
        with self.lock:
            self.issued += 1
        self.counter.add(planned)
