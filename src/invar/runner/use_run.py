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
  each other.
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
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from invar import patches
from invar.contract.bind import (
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
from invar.contract.prepare import load_contract
from invar.contract.reading import RunReader
from invar.engines import Transport, check_worker_code, engine_info
from invar.errors import ContractError, EvidenceError, InvarError, NotResumable, WorkerError
from invar.interrupts import Stopped, Terminated, interruption
from invar.owner_files import SHA256_FILE_BYTES, read_regular_file
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
    engine_session,
)
from invar.stats.sequential import SequentialDecision
from invar.transport import WorkerClient

if TYPE_CHECKING:
    from invar.transport.ray_relay import RayPlacement

ROLES: tuple[Role, Role] = ("reference", "candidate")
T = TypeVar("T")
MAX_WORKERS = 64
"""The most worker processes `use run --workers` starts per package (fewer when the package has fewer calls left)."""
INTERRUPT_GRACE_S = 30.0
"""After Ctrl-C, how long the calls under way may take to answer (and be recorded) before their workers are stopped;
a second Ctrl-C stops them at once."""
TERMINATE_GRACE_S = 10.0
"""At SIGTERM the calls under way get this long to answer: schedulers send SIGKILL about 30 s after SIGTERM (Slurm's
KillWait, Kubernetes' grace period), and stopping the workers and closing the store must fit before it."""


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


def admit_command(run: Path, contract: Path, head: str) -> str:
    """The command that decides a finished run, anchored at its head."""
    return f"invar use admit {run} --contract {contract} --expect-head {head}"


def check_sha256_file(contract_path: Path, sha: str) -> None:
    """A contract whose `.sha256` sibling (written by `use prepare`) names other bytes was changed since: refuse it."""
    sibling = contract_path.with_name(contract_path.name + ".sha256")
    if not sibling.exists():
        return
    fix = "it should hold the contract's sha256 as use prepare wrote it"
    raw = read_regular_file(sibling, "sha256 file", limit=SHA256_FILE_BYTES, fix=fix)
    try:
        recorded = raw.decode("ascii").split()[0]
    except (UnicodeDecodeError, IndexError):
        raise ContractError(f"{sibling}: unreadable; {fix}") from None
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
                      worker_digest=package.worker_digest)
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


def _open_run(run_dir: Path, contract: Contract, sha: str, base: Path, contract_path: Path) -> tuple[RunStore, bool]:
    """A new run (with the contract's inputs kept), or an existing one of this contract opened to resume."""
    if not is_run(run_dir):
        store = RunStore.create(run_dir, meta={"command": "use run", "contract_sha256": sha,
                                               "contract_name": contract.name, "contract": str(contract_path)})
        store.put_meta("inputs", run_inputs(contract, base))
        return store, False
    store = RunStore.open(run_dir, writable=True)
    try:
        _check_run(store, sha, contract_path)
        if "inputs" not in store.meta():
            # The first attempt stopped between creating the run and keeping its inputs (a full disk, a kill): keep
            # them now, so the run decides away from the owner's files as an uninterrupted one does.
            store.put_meta("inputs", run_inputs(contract, base))
    except BaseException:
        store.close()
        raise
    return store, True


def _closed_head(run_dir: Path, sha: str, contract_path: Path) -> str | None:
    """The head of an existing, closed run of this contract (nothing left to do), else None."""
    if not is_run(run_dir):
        return None
    with RunStore.open(run_dir) as store:
        if not store.closed:
            return None
        _check_run(store, sha, contract_path)
        return store.verify().head


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
    if ray is not None and transport is not None:
        raise InvarError("use_run: give a Ray address or a transport, not both")
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise InvarError(f"--workers {workers}: must be a whole number ≥ 1 and at most {MAX_WORKERS} (worker "
                         "processes per package; each loads the model)")
    if calls_at_once is not None and (isinstance(calls_at_once, bool) or not isinstance(calls_at_once, int)
                                      or calls_at_once < 1):
        raise InvarError(f"--calls-at-once {calls_at_once}: must be a whole number ≥ 1 (calls computing at once "
                         "over all workers), or left out to fit this machine's cores")
    started = time.perf_counter()
    contract, sha, plan = load_contract(contract_path)
    check_sha256_file(contract_path, sha)
    check_method_version(contract, "run with the Invar version the contract names")
    base = contract_path.parent
    specs = {role: package_spec(contract.package(role), base, role) for role in ROLES}
    # The run is read under its contract as admission reads it: the same reader binds a resumed run's records and
    # recomputes the stopping rule.
    reader = RunReader.of_models(contract, sha, plan, base, {role: specs[role].model for role in ROLES})
    _ = reader.scorer  # a changed user scorer is refused before any worker starts

    total = len(plan.calls) + len(plan.measurements)
    head = _closed_head(run_dir, sha, contract_path)
    if head is not None:
        with RunStore.open(run_dir) as closed:
            kept = closed.meta().get(SEQUENTIAL_META)
        return RunOutcome(run_dir, contract_path, sha, head, total, total, 0,
                          time.perf_counter() - started, already_closed=True, stop=kept)
    placement = None
    if ray is not None:
        from invar.transport.ray_relay import RayPlacement, connect

        connect(ray)
        placement = RayPlacement(ray, restarts=RESTARTS)
    if is_run(run_dir):
        phase("verifying the records")
    store, resumed = _open_run(run_dir, contract, sha, base, contract_path)
    with store:
        tokens: dict[tuple[Role, int], np.ndarray] = {}
        done: set[str] = set()
        first_look = 0
        if resumed:
            # One call at a time, outputs checked and dropped: a resumed run reads its records in bounded memory.
            bound = reader.bind_partial(store)
            done = set(bound.found) | set(bound.measured)
            for c in plan.calls if _needs_tokens(plan) else ():
                if c.layout == plan.pairing_layout and c.key in bound.found:
                    for index, out in zip(c.units, bound.found[c.key].outputs, strict=True):
                        tokens[(c.package, index)] = np.array(out.tokens, copy=True)
            if plan.sequential is not None:
                first_look = reader.looks(bound.found, str(run_dir), running=True)
        rule = None if plan.sequential is None else _Rule(reader, tokens)
        todo = {role: [c for c in plan.calls if c.package == role and c.key not in done] for role in ROLES}
        measure = {role: [m for m in plan.measurements if m.package == role and m.key not in done] for role in ROLES}
        counter = _Counter(plan, done, progress)
        counter.report()
        if rule is not None and first_look and rule.stops(first_look):
            todo = {role: [] for role in ROLES}  # stopped before the kill: only the stop and the close are left
        issued = _execute(reader, _Launch(specs, workers, call_timeout, placement, transport, calls_at_once),
                          _Work(todo, measure, tokens, rule, first_look), store, counter, phase)
        if rule is not None:
            phase("deciding")
        stop = None if rule is None else _record_stop(store, reader)
        head = store.close_run()
    return RunOutcome(run_dir, contract_path, sha, head, total, len(done), issued,
                      time.perf_counter() - started, already_closed=False, stop=stop)


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


class _Gate:
    """At most `slots` holders at once, admitted in the order they asked: a worker that finishes a call and asks
    again waits behind the workers already waiting (a plain semaphore lets it take the slot back at once, so a
    package's second worker could wait out the whole run)."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: collections.deque[object] = collections.deque()
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        ticket = object()
        with self._cond:
            self._waiting.append(ticket)
            try:
                self._cond.wait_for(lambda: self._free > 0 and self._waiting[0] is ticket)
            except BaseException:  # interrupted while waiting: out of the line, which moves on without it
                self._waiting.remove(ticket)
                self._cond.notify_all()
                raise
            self._waiting.popleft()
            self._free -= 1
            self._cond.notify_all()  # the next in line may fit too

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


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


def _execute(reader: RunReader, launch: _Launch, work: _Work, store: RunStore, counter: _Counter,
             phase: Callable[[str], object] = lambda text: None) -> int:
    """Start `launch.workers` workers per package that has calls left and issue its calls over them, generate calls
    first, then (once every package has sampled) measurements; the first failure stops all. With a stopping rule
    (plan /4) the generate calls go look by look from `work.first_look`, the rule evaluated after each."""
    contract, plan, eos = reader.contract, reader.plan, reader.eos
    specs, workers, call_timeout = launch.specs, launch.workers, launch.call_timeout
    placement, transport = launch.placement, launch.transport
    todo, measure, tokens, rule, first_look = work.todo, work.measure, work.tokens, work.rule, work.first_look
    count = workers_per_package(todo, measure, workers)
    roles = [role for role in ROLES if count[role]]
    if not roles:
        return 0
    # One thread per worker; a package's threads take its calls from shared queues, each call exactly once.
    threads = [(role, n) for role in roles for n in range(count[role])]
    keep_tokens = _needs_tokens(plan)
    at_once = launch.calls_at_once
    auto = None
    if at_once is None and placement is None:  # Ray places workers on other machines, with cores of their own
        auto = calls_at_once_for(specs, {role: count[role] for role in roles}, cores())
        at_once = None if auto is None else auto[0]
    turns = "" if auto is None else (f"; {'one call' if auto[0] == 1 else f'{auto[0]} calls'} at a time: {auto[1]}, "
                                     "--calls-at-once to change")
    phase("starting workers (" + ", ".join(f"{specs[role].engine.value} {role}" + (f" ×{count[role]}"
                                                                                   if count[role] > 1 else "")
                                           for role in roles) + turns + ")")
    after_load = "generating" if any(todo[role] for role in roles) else "measuring"
    generate_share = {role: _Share(todo[role]) for role in roles}
    measure_share = {role: _Share(measure[role]) for role in roles}
    look_share: dict[tuple[Role, int], _Share[PlannedCall]] = {}
    if rule is not None:
        assert plan.sequential is not None
        for role in roles:
            left = {c.key for c in todo[role]}
            for look in range(first_look, len(plan.sequential.boundaries)):
                look_share[(role, look)] = _Share([c for c in plan.look_calls(look)
                                                   if c.package == role and c.key in left])
    stop = threading.Event()
    # Engines that each use every core slow each other down when they compute at once (two vLLM CPU engines on 2
    # cores: 48-51 s for two calls side by side where one alone took 11 s); a gate lets such calls go one at a time.
    gate: contextlib.AbstractContextManager[object] = contextlib.nullcontext() if at_once is None else _Gate(at_once)
    live: set[WorkerClient] = set()  # the workers now serving, stopped at a Ctrl-C whose grace has passed
    live_lock = threading.Lock()

    def identities_checked() -> None:
        phase("loading the models")

    def all_loaded() -> None:
        phase(after_load)

    def all_sampled() -> None:
        if any(measure.values()):
            phase("measuring")

    # No call is made until every worker has shown the identity the contract names.
    checked = threading.Barrier(len(threads), action=identities_checked)
    # Nor before every worker has loaded its model: a package's workers share its calls, and one that loaded first
    # would otherwise take them all while the other still loads (an NF4 load is slower than a tiny model's calls).
    loaded = threading.Barrier(len(threads), action=all_loaded)
    # No measurement is made until every package has sampled: the candidate scores the reference's responses.
    sampled = threading.Barrier(len(threads), action=all_sampled)
    issued = [0]
    lock = threading.Lock()
    # Sequential: both packages finish look k before the rule looks, and no call of look k + 1 precedes its verdict.
    finished = threading.Event()
    look_at = [first_look]
    ruled: list[BaseException] = []

    def evaluate() -> None:
        assert rule is not None
        look_at[0] += 1
        try:
            if rule.stops(look_at[0]):
                finished.set()
        except BaseException as exc:  # reported by the thread that sees the broken barrier
            ruled.append(exc)
            raise

    looked = threading.Barrier(len(threads), action=evaluate)
    barriers = (checked, loaded, sampled, looked)

    def drive(role: Role, n: int) -> None:
        try:
            _drive(role, n)
        except threading.BrokenBarrierError:
            if ruled:
                raise ruled[0] from None
            raise
        except BaseException:
            for barrier in barriers:
                barrier.abort()
            raise

    def _drive(role: Role, n: int) -> None:
        package = contract.package(role)
        spec = specs[role]
        expect = (package.engine_version, package.expected_settings(), role)

        placed: Transport | None = transport
        if placement is not None:
            # Ray shows an actor only the accelerators it reserved: a package on a GPU reserves one.
            on_gpu = str(spec.settings.get("device", "")).startswith("cuda")
            placed = dataclasses.replace(placement, num_gpus=1.0) if on_gpu else placement

        @contextlib.contextmanager
        def session_of(ready: Callable[[], object]) -> Any:
            with engine_session(spec, store, expect=expect, adapter_in_load=True, call_timeout=call_timeout,
                                ready=ready, placement=placed) as session:
                if session.model_digest != package.model_digest:
                    raise EvidenceError(f"the {role} worker loaded model {session.model_digest[:16]}…, not the "
                                        "contract's")
                with live_lock:
                    live.add(session.client)
                try:
                    yield session
                finally:
                    with live_lock:
                        live.discard(session.client)

        restarts = 0 if placed is None else placed.restarts
        with Lease(session_of, checked.wait, restarts, f"the {role} worker {n + 1}") as lease:
            loaded.wait()

            def ask(method: str, params: dict[str, Any], key: str) -> tuple[dict[str, Any], str] | None:
                """The call's checked result, or None when the run stopped while this thread waited its turn."""
                with gate:  # never held across a barrier: a lease starts its first session before any call
                    # A signal that came while this thread waited at the gate stops it here: no call after it.
                    if stop.is_set():
                        return None
                    answer = lease.ask(method, params)
                where = f"{role} call {key} (call id {answer.call.call_id})"
                try:
                    result = answer.result  # raises the worker's error as WorkerError
                except WorkerError as exc:  # recorded as the worker's error; said with the package that gave it
                    raise WorkerError(exc.method, exc.error_type, failed_call(exc, where, package)) from None
                check_package_report(result, package, role, where)  # what admission checks of each record again
                return result, where

            def generate(planned: PlannedCall) -> None:
                params = planned.params.to_wire()
                if (asked := ask("generate", params, planned.key)) is None:
                    return
                result, where = asked
                outputs = parse_outputs(result, params["requests"], eos[role], where)
                if planned.layout == plan.pairing_layout and keep_tokens:
                    with lock:
                        for index, out in zip(planned.units, outputs, strict=True):
                            tokens[(role, index)] = np.array(out.tokens, copy=True)
                with lock:
                    issued[0] += 1
                counter.add(planned)

            if rule is None:
                while (planned := generate_share[role].take()) is not None:
                    if stop.is_set():
                        return
                    generate(planned)
            else:
                assert plan.sequential is not None
                for look in range(first_look, len(plan.sequential.boundaries)):
                    if stop.is_set():
                        return
                    while (planned := look_share[(role, look)].take()) is not None:
                        if stop.is_set():
                            return
                        generate(planned)
                    looked.wait()
                    if finished.is_set():
                        break
            sampled.wait()
            while (m := measure_share[role].take()) is not None:
                if stop.is_set():
                    return
                with lock:
                    source = {index: tokens[(m.source, index)] for index in m.units}
                params = measurement_params(plan, m, source.__getitem__)
                if (asked := ask("score", params, m.key)) is None:
                    return
                result, where = asked
                score_outputs(result, params["items"], where)
                with lock:
                    issued[0] += 1
                counter.add(m)

    def halt() -> None:
        stop.set()
        for barrier in barriers:
            barrier.abort()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(threads), thread_name_prefix="use-run") as pool:
        futures = [pool.submit(drive, role, n) for role, n in threads]
        failure: BaseException | None = None
        try:
            for future in concurrent.futures.as_completed(futures):
                exc = future.exception()
                # A worker released by another's refusal reports the broken barrier; the refusal is the cause.
                if exc is not None and not isinstance(exc, threading.BrokenBarrierError) and failure is None:
                    failure = exc
                    halt()
        except KeyboardInterrupt as exc:
            # Ctrl-C: no new call starts; the calls under way may answer (and be recorded) for INTERRUPT_GRACE_S,
            # then (or at a second Ctrl-C) their workers are stopped. SIGTERM: the same, within TERMINATE_GRACE_S.
            how, status = interruption(exc)
            halt()
            forced = False
            try:
                _, pending = concurrent.futures.wait(
                    futures, timeout=TERMINATE_GRACE_S if isinstance(exc, Terminated) else INTERRUPT_GRACE_S)
            except KeyboardInterrupt:
                pending = {f for f in futures if not f.done()}
            if pending:
                forced = True
                with live_lock:
                    for client in list(live):
                        client.close(timeout=0.1)
                concurrent.futures.wait(futures, timeout=60)
            cut = " (the calls still under way were stopped, unanswered)" if forced else ""
            raise Stopped(f"stopped issuing calls at {how} after {issued[0]} answered call(s) this time{cut}",
                          status) from None
        if failure is not None:
            raise failure
    return issued[0]
