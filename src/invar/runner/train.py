"""`invar train`: run the training loop the core owns, keep every record, and resume a stopped run.

Decisions:
- **Synchronous cycles.** Each cycle samples from the checkpoint published last and the update starts from that same
  checkpoint, so the learner–engine gap (proximal − behavior) comes only from the two implementations; the staleness
  is 0 in every cycle and rollouts of any other policy are refused (`invar.loop.cycle.read_rollout`).
- **Two workers, started through `invar.runner.engine`**: the backend's inference engine and its learner, each
  recording into the run's store. The learner saves each update as a checkpoint under `RUN/checkpoints/`; the
  core checks it (`invar.loop.checkpoint.check_checkpoint`) and publishes it by recording `cycle-NNNNNN`: the
  calls the cycle used, the checkpoint's path and digest, the core's own objective and the wall time per phase.
  The next cycle's engine must load exactly that digest. Its calls go out as soon as the learner has reported (the
  engine loads and samples while the core checks), and its rollouts are read only after the publication: a refused
  checkpoint stops the run first, and those calls stay on record, unused. The prompts and params of the next
  cycle's calls are built while the learner works. Every worker (each inference worker and the learner) starts
  at once through the command's `invar.runner.pool.WorkerPool`, so the start-up costs about the slowest one's; one
  that fails to start stops every other.
- **A signal stops the run as it stops `use run`**: no cycle and no update starts after Ctrl-C or SIGTERM, the calls
  under way get the pool's grace to answer and be recorded, then the workers still computing are stopped; a worker
  still loading its model (at the start, or a replacement) is stopped at once; the run resumes from its last
  published cycle.
- **Resume from the records.** A run directory that holds records is opened for writing (the writer lock refuses a
  second process), must have been made by this configuration (its digest), and continues after the last published
  cycle: the learner loads that checkpoint with its optimizer state, the engine loads it as the policy. Calls of an
  unfinished cycle stay in the records, unused; the cycle runs again with the same derived seeds, so on engines
  whose calls are deterministic the resumed run publishes the same checkpoints, bit for bit, as an uninterrupted
  one.
- **A lost Ray-placed inference worker is replaced** (`invar.runner.engine.Lease`, at most `RESTARTS` times per
  worker): the replacement must declare the first inference worker's identity, loads the policy the pending call
  samples, and is issued that call again with the same params; the lost call stays on record unanswered and the
  publication names the answered one. A local worker's death stops the run instead (resume it).
- **A refusal stops the run** with one line naming the cycle and what differs; every record written so far is kept
  and the store is left open (not closed), so the run reads as incomplete.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from invar import canonical, owner_files
from invar.engines import Transport
from invar.errors import ContractError, EvidenceError, InvarError, NotResumable, RecordError
from invar.formats.tokenizer import kept_files
from invar.loop import cycle as cyc
from invar.loop.advantages import group_advantages
from invar.loop.checkpoint import check_checkpoint
from invar.loop.config import BACKEND_ENGINES, ConfigError, TrainConfig, read_config, resolve
from invar.loop.config import Scorer as ScorerSection
from invar.loop.objective import OBJECTIVE_VERSION, ObjectiveSettings, loss_terms
from invar.protocol import Role
from invar.protocol.methods import LEARNER_STEP, LOAD_ADAPTER
from invar.protocol.payloads import (
    GenerateRequest,
    LearnerOptimizer,
    LearnerStepParams,
    LoadAdapterParams,
    LoraParams,
    Schedule,
)
from invar.records import RunStore
from invar.records.store import is_run
from invar.runner.engine import ADAPTER_NAME, RESTARTS, Dtype, Engine, EngineSpec, Lease, Session, engine_session
from invar.runner.options import check_context, model_context
from invar.runner.pool import WorkerPool
from invar.tasks import SCORER_NAME, ModelTokenizer, split_of
from invar.tasks.population import Unit, check_sha256, parse_units, read_regular_file
from invar.tasks.scorers import Scorer, UserScorer, check_units, load_scorer, scorer_identity
from invar.transport import Answer, PendingCall, WorkerLost
from invar.transport.shared import SharedProcess

BACKENDS: dict[str, tuple[Engine, Engine]] = {
    backend: (Engine(inference), Engine(learner)) for backend, (inference, learner) in BACKEND_ENGINES.items()}
"""Backend → (inference engine, learner engine)."""

CYCLE_KEY = "cycle-{:06d}"
"""The metadata key that publishes a cycle's checkpoint."""
CHECKPOINTS = "checkpoints"


class ResumeRefused(NotResumable, EvidenceError):
    """An existing run that is not this configuration's, or whose inputs changed: the message says what to change,
    and the same command again would be refused again."""


class UnreadableRun(NotResumable, RecordError):
    """An existing run whose records cannot be read or verified: it cannot be resumed as it stands."""


@dataclass(frozen=True)
class Progress:
    """Where a run is: the cycle and its phase, and the last published cycle's reward and gap."""

    cycle: int
    cycles: int
    phase: str
    """`start`, `generate`, `learn`, `publish` or `done`."""
    reward: float | None = None
    gap_max: float | None = None


@dataclass(frozen=True)
class Published:
    """A published cycle: its checkpoint, as the run's records name it."""

    cycle: int
    path: Path
    digest: str
    optimizer_steps: int


@dataclass(frozen=True)
class TrainOutcome:
    """What `train` did."""

    run: Path
    config: Path
    config_digest: str
    head: str
    cycles: int
    cycles_reused: int
    """Cycles already published when this invocation started (a resumed run)."""
    checkpoint: Published | None
    wall_s: float
    already_closed: bool
    signal: str | None = None
    """The signal (`SIGTERM`, `Ctrl-C`) that came while the run's last cycle was under way: that cycle finished
    within the grace and the run closed, so nothing was left to stop."""


@dataclass(frozen=True)
class Plan:
    """A configuration read and checked, with everything the run needs before a worker starts."""

    config: TrainConfig
    path: Path
    digest: str
    model: Path
    model_digest: str
    prompts: list[Unit]
    prompts_path: Path
    prompts_sha256: str
    prompts_data: bytes
    """The prompts file's bytes, as read once: the units were parsed from them and their digest checked."""
    vocab: ModelTokenizer
    settings: ObjectiveSettings
    scorer: Scorer

    @property
    def own_task(self) -> bool:
        """The run trains on a task of the owner's (a scorer other than the arithmetic default): its records then
        keep the population and the scorer, whose answers the rewards read."""
        return self.config.scorer != ScorerSection()

    def meta(self) -> dict[str, Any]:
        out = {"command": "train", "config": self.config.canonical(), "config_digest": self.digest,
               "config_path": str(self.path), "model": str(self.model), "model_digest": self.model_digest,
               "prompts": str(self.prompts_path), "prompts_sha256": self.prompts_sha256,
               "prompts_count": len(self.prompts), "objective_version": OBJECTIVE_VERSION}
        if self.own_task:
            out["scorer"] = scorer_identity(self.scorer)
        return out

    def inputs(self) -> dict[str, Any]:
        """What the run keeps beside its records so that `inspect history` recomputes every reward from them alone:
        the tokenizer, and for the owner's task the population and a user scorer's file (the arithmetic task's
        answers follow from its prompts)."""
        out: dict[str, Any] = {"tokenizer": kept_files(self.model)}
        if self.own_task:
            out["population"] = self.prompts_data
            if isinstance(self.scorer, UserScorer):
                out["scorer_file"] = self.scorer.data
        return out


def _prompt_units(config_path: Path, config: TrainConfig, path: Path, data: bytes, scorer: Scorer) -> list[Unit]:
    """The units the run trains on: the file's units, checked against the scorer, of the chosen kinds."""
    try:
        units = parse_units(data, path)
        check_units(scorer, units)
    except ContractError as exc:
        raise ConfigError(f"{config_path}: prompts.path: {exc}") from None
    if scorer.name == SCORER_NAME:
        for u in units:
            if u.prompt is None or split_of(u.prompt) != "train":
                raise ConfigError(f"{config_path}: prompts.path: {path} holds {u.prompt!r} ({u.id}), a prompt of "
                                  "the evaluation split; train on the training set (data/arith-train.jsonl), never "
                                  "on the evaluation population")
    kinds = config.prompts.kinds
    if kinds is not None:
        labels = {u.kind for u in units}
        unknown = sorted(set(kinds) - labels) if scorer.name != SCORER_NAME else []
        if unknown:
            raise ConfigError(f"{config_path}: prompts.kinds: {unknown} label no unit of {path}; choose from "
                              f"{sorted(k for k in labels if k)}")
    chosen = cyc.select_units(units, kinds)
    if len(chosen) < config.prompts.per_cycle:
        raise ConfigError(f"{config_path}: prompts.per_cycle: {config.prompts.per_cycle} prompts per cycle, but "
                          f"{path} holds {len(chosen)} of the kinds chosen; lower per_cycle")
    return chosen


def plan(config_path: Path) -> Plan:
    """Read the configuration and check every file it names, before any worker starts."""
    config = read_config(config_path)
    model = resolve(config_path, config.model)
    spec = EngineSpec(Engine.MLX, model)
    try:
        model_digest, _ = spec.digests
    except Exception as exc:
        raise ConfigError(f"{config_path}: model: {exc}") from None
    declared = config.scorer
    try:
        scorer = load_scorer(declared.name, declared.settings, config_path.parent, declared.sha256)
    except ContractError as exc:
        raise ConfigError(f"{config_path}: scorer: {exc}") from None
    prompts_path = resolve(config_path, config.prompts.path)
    try:
        sha = owner_files.declared_sha256(prompts_path, config.prompts.sha256, "set prompts.sha256 to the digest you "
                                          f"expect, or write it to {prompts_path.with_suffix('.sha256')}")
        data = read_regular_file(prompts_path, "population file")
        check_sha256("population file", prompts_path, data, sha)
    except ContractError as exc:
        raise ConfigError(f"{config_path}: prompts.path: {exc}") from None
    units = _prompt_units(config_path, config, prompts_path, data, scorer)
    vocab = ModelTokenizer.from_model_dir(model)
    context = model_context(model)
    longest = 0
    for u in units:
        try:
            longest = max(longest, len(vocab.unit_prompt(u)[1]))
        except ContractError as exc:
            line = f" line {u.line}" if u.line else ""
            raise ConfigError(f"{config_path}: prompts.path: {prompts_path}{line}: unit {u.id!r}: {exc}") from None
    # +1: vLLM scores a reference only for a prompt it could extend by one more token.
    check_context(longest, config.rollout.max_tokens + 1, context, f"{config_path}: rollout.max_tokens")
    o = config.objective
    settings = ObjectiveSettings(o.clip_low, o.clip_high, o.kl_coef, o.importance, o.importance_cap)
    return Plan(config, config_path, config.digest(), model, model_digest, units, prompts_path, sha, data, vocab,
                settings, scorer)


def published_cycles(store: RunStore, run_dir: Path) -> list[Published]:
    """The cycles a run published, in order; a gap or a malformed entry is a `RecordError`."""
    meta = store.meta()
    out: list[Published] = []
    for key in sorted(k for k in meta if k.startswith("cycle-")):
        entry = meta[key]
        ck = entry.get("checkpoint") if isinstance(entry, dict) else None
        if (not isinstance(ck, dict) or entry.get("cycle") != len(out) or key != CYCLE_KEY.format(len(out))
                or not isinstance(ck.get("path"), str) or not isinstance(ck.get("digest"), str)):
            raise RecordError(f"{run_dir}: metadata {key} is not the publication of cycle {len(out)}")
        out.append(Published(len(out), run_dir / ck["path"], ck["digest"], int(ck["optimizer_steps"])))
    return out


def _check_made_by(store: RunStore, run_dir: Path, p: Plan) -> str:
    """An existing run must verify and be a training run of this configuration; its head, as verified."""
    try:
        head = store.verify().head
    except RecordError as exc:
        raise UnreadableRun(f"{exc}; it cannot be resumed: restore its records, or choose a new run directory") \
            from None
    _check_run_of(store, run_dir, p)
    return head


def _check_run_of(store: RunStore, run_dir: Path, p: Plan) -> None:
    """An existing run must be a training run of this configuration, on the same inputs (its metadata as recorded:
    verified where it matters, by `_check_made_by`)."""
    try:
        run = store.meta("run").get("run", {})
    except RecordError as exc:
        raise UnreadableRun(f"{exc}; it cannot be resumed: restore its records, or choose a new run directory") \
            from None
    if run.get("command") != "train":
        raise ResumeRefused(f"{run_dir}: is a run of {run.get('command')!r}, not a training run; choose a new run "
                            "directory")
    if run.get("config_digest") != p.digest:
        made = str(run.get("config_digest"))[:16]
        recorded = run.get("config_path")
        own = f" ({recorded}, as recorded)" if isinstance(recorded, str) and Path(recorded) != p.path else ""
        raise ResumeRefused(f"{run_dir}: the run was made with configuration {made}…, not {p.digest[:16]}… "
                            f"({p.path}); resume it with the configuration it was made with{own}, or train "
                            f"{p.path} in a new run directory")
    # The configuration names its files by path; what they held when the run started is in the records, and a
    # resumed run must train on the same bytes.
    now = p.meta()
    for key, what in (("model_digest", "the model folder"), ("prompts_sha256", "the prompts file"),
                      ("scorer", "the scorer")):
        if run.get(key) != now.get(key):
            raise ResumeRefused(f"{run_dir}: {what} changed since the run started ({_short(run.get(key))} → "
                                f"{_short(now.get(key))}); restore it to resume the run, or choose a new run "
                                "directory")


def _short(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("sha256") or value.get("version") or value.get("name")
    return "none" if value is None else f"{str(value)[:16]}…"


@dataclass
class _OpenRun:
    """A run directory opened for this configuration, answered once (as `use run`'s `open_run`): `new` (created, its
    inputs kept), `resumed` (a run of this configuration, verified and checked in the one store opened for writing)
    or `closed` (only verified: nothing left to do)."""

    state: Literal["new", "resumed", "closed"]
    store: RunStore | None
    """Open for writing (None when closed)."""
    done: list[Published]
    """The cycles the run published, in order."""
    head: str | None = None
    """A closed run's head."""


def _open(run_dir: Path, p: Plan, *, before_writing: Callable[[], object] = lambda: None) -> _OpenRun:
    """Open `run_dir` for the configuration: a closed run of it is only verified; otherwise `before_writing` runs
    (joining a Ray cluster: before the run directory is touched) and the run is created, or opened for writing,
    verified once and checked to be this configuration's, its last published checkpoint still its own."""
    if is_run(run_dir):
        try:
            existing = RunStore.open(run_dir)
        except RecordError as exc:
            raise UnreadableRun(f"{exc}; it cannot be resumed: restore its records, or choose a new run "
                                "directory") from None
        with existing:
            if existing.closed:  # read from the last record: nothing verified yet
                head = _check_made_by(existing, run_dir, p)
                return _OpenRun("closed", None, published_cycles(existing, run_dir), head)
            # A run of another configuration, or whose inputs changed, is refused before the writer lock is taken:
            # its folder stays byte for byte as it was. Its records are verified once, below, for writing.
            _check_run_of(existing, run_dir, p)
    before_writing()
    if not is_run(run_dir):
        store = RunStore.create(run_dir, meta=p.meta())
        store.put_meta("inputs", p.inputs())
        return _OpenRun("new", store, [])
    store = RunStore.open(run_dir, writable=True)
    try:
        _check_made_by(store, run_dir, p)
        done = published_cycles(store, run_dir)
        if done and canonical.tree_digest(done[-1].path) != done[-1].digest:
            raise ResumeRefused(f"{done[-1].path}: the published checkpoint of cycle {done[-1].cycle} no longer has "
                                f"its digest {done[-1].digest[:16]}…; restore it to resume the run")
    except BaseException:
        store.close()
        raise
    return _OpenRun("resumed", store, done)


def _save_dir(run_dir: Path, n: int) -> Path:
    """A folder name for cycle n's checkpoint that no earlier attempt used."""
    base = run_dir / CHECKPOINTS / f"cycle-{n:06d}"
    attempt = 1
    path = base
    while path.exists():
        attempt += 1
        path = base.with_name(f"{base.name}.{attempt}")
    return path


def train(
    config_path: Path,
    run_dir: Path,
    *,
    call_timeout: float | None = 1800.0,
    progress: Callable[[Progress], None] = lambda p: None,
    ray: str | None = None,
    transport: Transport | None = None,
) -> TrainOutcome:
    """Run (or resume) the training run of the configuration at `config_path` in `run_dir`.

    `ray`: the address of a Ray cluster on which the inference workers are placed, as actors (the learner stays
    on this machine); a lost inference worker is replaced and its unanswered generate calls issued again
    (`_Rollouts`), at most `RESTARTS` times per worker, then the run stops and resumes like any other.
    `transport`: start every worker there instead of as a local subprocess (tests: an in-process fake worker),
    replacing a lost inference worker at most `transport.restarts` times."""
    if ray is not None and transport is not None:
        raise InvarError("train: give a Ray address or a transport, not both")
    started = time.perf_counter()
    p = plan(config_path)
    cfg = p.config
    if cfg.rollout.layout == "shared" and ray is not None:
        raise ConfigError(f"{config_path}: rollout.layout: \"shared\" runs both roles in one local worker process, "
                          "and --ray places the inference workers on a cluster; set layout = \"split\" to train "
                          "there")
    if cfg.rollout.layout == "shared" and transport is not None:
        raise InvarError("train: rollout.layout = \"shared\" starts its own worker process; give no transport")
    placement: list[Transport] = []
    run = _open(run_dir, p, before_writing=lambda: placement.extend(_join(ray)))
    done = run.done
    if run.store is None:
        assert run.head is not None
        return TrainOutcome(run_dir, config_path, p.digest, run.head, len(done), len(done), done[-1] if done else None,
                            time.perf_counter() - started, already_closed=True)
    heard: str | None = None
    with run.store as store:
        reused = len(done)
        if reused < cfg.cycles:
            done, heard = _run_cycles(p, run_dir, store, done, call_timeout, progress,
                                      placement[0] if placement else transport, transport)
        head = store.close_run()
    progress(Progress(len(done), cfg.cycles, "done"))
    return TrainOutcome(run_dir, config_path, p.digest, head, len(done), reused, done[-1] if done else None,
                        time.perf_counter() - started, already_closed=False, signal=heard)


def _join(ray: str | None) -> list[Transport]:
    """The Ray cluster at `ray` joined, as the placement of the inference workers (none without `ray`)."""
    if ray is None:
        return []
    from invar.transport.ray_relay import RayPlacement, connect

    connect(ray)
    return [RayPlacement(ray, restarts=RESTARTS)]


def _run_cycles(p: Plan, run_dir: Path, store: RunStore, done: list[Published], call_timeout: float | None,
                progress: Callable[[Progress], None], placement: Transport | None = None,
                local: Transport | None = None) -> tuple[list[Published], str | None]:
    """The cycles left: the inference workers started at `placement`, the learner at `local` (None: local
    subprocesses). Returns every published cycle, and the signal that came while the last one was under way (it
    finished within the grace: the run is complete) or None."""
    cfg = p.config
    inference_engine, learner_engine = BACKENDS[cfg.backend]
    last = done[-1] if done else None
    progress(Progress(len(done), cfg.cycles, "start"))
    shared = SharedProcess() if cfg.rollout.layout == "shared" else None
    if shared is not None:  # one process serves both roles, one protocol channel each (`invar.transport.shared`)
        placement = local = shared
    inference_spec = EngineSpec(inference_engine, p.model, Dtype(cfg.dtype),
                                settings=cfg.engines.get(inference_engine.value, {}))
    learner_spec = EngineSpec(learner_engine, p.model, Dtype(cfg.dtype), adapter=None if last is None else last.path,
                              settings=cfg.engines.get(learner_engine.value, {}))
    pool = WorkerPool(cfg.rollout.workers + 1)
    start = _InferenceStart(inference_spec, store, call_timeout, placement, pool)
    restarts = 0 if placement is None else placement.restarts
    with contextlib.ExitStack() as stack:
        if shared is not None:
            stack.callback(shared.close)  # after both roles' sessions have closed
        # The workers are independent processes: their start-up (spawn, imports, handshake, load_model) overlaps,
        # so it costs about the slowest one's, not the sum. A start-up another one's failure made moot ends after
        # its handshake instead of loading the model; at a signal a worker still loading is stopped at once.
        *leases, learner = pool.start(stack, [
            *(Lease(pool.served(start), pool.ready, restarts, f"the inference worker {i + 1}")
              for i in range(cfg.rollout.workers)),
            pool.served(lambda ready: engine_session(
                learner_spec, store, role=Role.LEARNER, adapter_in_load=True, resume_training=True,
                call_timeout=call_timeout, ready=ready, placement=local, watch=pool.starting))(pool.ready),
        ])
        for lease in leases:  # worker 1's identity is the one every other (and every replacement) must declare
            assert lease.session is not None
            start.declare(lease.session)
        if shared is not None:
            assert leases[0].session is not None
            _record_shared(store, shared, leases[0].session, learner)
        if last is not None and learner.adapter_digest != last.digest:
            raise EvidenceError(f"the learner loaded adapter {str(learner.adapter_digest)[:16]}…, not the published "
                                f"checkpoint {last.digest[:16]}…")
        rollouts = _Rollouts(p, leases, store, pool)

        def cycles() -> None:
            for n in range(len(done), cfg.cycles):
                pool.ready()  # no cycle starts after a signal
                done.append(_cycle(p, n, run_dir, store, rollouts, learner, done, progress, pool))

        # At a signal the calls under way get the pool's grace to answer and be recorded, as in `use run`; the
        # command line says how to resume. A cycle under way is finished: when that was the last one, nothing is
        # left to resume, and the run closes rather than make the user start it again only to close it.
        heard = pool.run([cycles], name="train", stopped=lambda how: f"stopped at {how}",
                         finished=lambda: len(done) == cfg.cycles)
    return done, heard


def _record_shared(store: RunStore, shared: SharedProcess, inference: Session, learner: Session) -> None:
    """Where the roles ran, kept outside their identities (as a Ray worker's placement is): one process, whose
    two channels answered as these two workers."""
    meta = store.meta()
    key = f"placement shared {shared.process.pid}"
    n = 1
    while key in meta:  # a pid that recurs in a resumed run
        n += 1
        key = f"placement shared {shared.process.pid}.{n}"
    store.put_meta(key, {"layout": "shared", "pid": shared.process.pid,
                         "workers": {"inference": inference.client.worker_key, "learner": learner.client.worker_key}})


class _InferenceStart:
    """How an inference worker starts, first or as a replacement: every one must declare the identity of the run's
    first inference worker, worker 1 (its pid and instance aside), so the rollouts of a run come from one engine and
    settings whichever worker made them. The workers started together are checked (`declare`) once all have started; a
    replacement is checked before it is handed out."""

    def __init__(self, spec: EngineSpec, store: RunStore, call_timeout: float | None,
                 placement: Transport | None, pool: WorkerPool) -> None:
        self.spec, self.store, self.call_timeout, self.placement, self.pool = spec, store, call_timeout, placement, pool
        self.first: dict[str, Any] | None = None

    def declare(self, session: Session) -> None:
        """The first worker declared sets the identity; any later one must declare the same (`EvidenceError`)."""
        declared = {k: v for k, v in session.client.identity.to_wire().items() if k not in ("pid", "instance")}
        if self.first is None:
            self.first = declared
        first = self.first
        for key in sorted(set(first) | set(declared)):
            if first.get(key) != declared.get(key):
                raise EvidenceError(f"an inference worker declares {key} {declared.get(key)!r}, unlike the run's "
                                    f"first inference worker ({first.get(key)!r}); every inference worker must be "
                                    "the same engine, versions and settings: install the same on every node")

    @contextlib.contextmanager
    def __call__(self, ready: Callable[[], object]) -> Iterator[Session]:
        with engine_session(self.spec, self.store, call_timeout=self.call_timeout, ready=ready,
                            placement=self.placement, watch=self.pool.starting) as session:
            if self.first is not None:  # a replacement
                self.declare(session)
            yield session


@dataclass
class _Pending:
    """A cycle's rollouts in flight: one generate call per inference worker, and the policy they sample."""

    version: int
    policy: Published | None
    units: list[Unit]
    """The unit each request answers, in request order (G per unit)."""
    shards: list[list[GenerateRequest]]
    params: list[dict[str, Any]]
    workers: list[int]
    """The inference worker (its lease's index) each shard's call goes to."""
    calls: list[PendingCall | None]
    loads: list[PendingCall | None]
    """Per call, the `load_adapter` call issued before it to its worker, until `take` has checked its answer."""
    seqs: list[int | None]
    """Per call, the record (seq) of the copy issued last: the one answered."""
    issued_to: list[int]
    """Per call, how many times its worker had been replaced when it was issued: a loss seen on a call issued before
    the latest replacement needs no new one."""


@dataclass
class _Prepared:
    """A cycle's calls before they are issued: what `_Pending` takes from the configuration alone."""

    units: list[Unit]
    shards: list[list[GenerateRequest]]
    params: list[dict[str, Any]]
    workers: list[int]


class _Rollouts:
    """Starts each cycle's generate calls as soon as the policy they must sample is published: cycle m samples
    policy version max(0, m − K) (version v: the checkpoint published by cycle v − 1; 0: the base model). With
    K = 0 that is the checkpoint published last (synchronous); with K ≥ 1 the engines generate the next cycles'
    rollouts while the learner updates. The rule is fixed by the configuration, never by timing, so a resumed or
    rescheduled run consumes the same rollouts.

    A lost inference worker (on Ray) is replaced through its lease. Each call the lost worker left unanswered is
    issued again to the replacement when its cycle takes it (calls it answered before it was lost stand), with the
    same params after loading the policy that call samples; the requests are seeded, so the replacement answers
    what the lost worker would have. The lost calls stay on record unanswered."""

    def __init__(self, p: Plan, leases: list[Lease], store: RunStore, pool: WorkerPool) -> None:
        self.p = p
        self.leases = leases
        self.store = store
        self.pool = pool
        self.loaded: list[str | None] = [None] * len(leases)
        self.pending: dict[int, _Pending] = {}
        self.prepared: dict[int, _Prepared] = {}

    def version(self, m: int) -> int:
        return max(0, m - self.p.config.rollout.staleness)

    def _submit(self, m: int, j: int) -> None:
        """Issue cycle m's call j to its worker's current session, its policy loaded first (`WorkerLost` if the
        worker is gone; `Halted` once the pool halted: no call after a signal, not even the next cycles' rollouts
        started while the learner works)."""
        self.pool.ready()
        pending = self.pending[m]
        i, policy = pending.workers[j], pending.policy
        lease = self.leases[i]
        assert lease.session is not None
        client = lease.session.client
        pending.loads[j] = None  # a load issued with a lost copy of this call went with it
        if policy is not None and self.loaded[i] != policy.digest:
            # Not awaited here: the worker serves a channel's calls in order, so the generate call below samples
            # what this loaded, and `take` checks the load's answer before it reads the rollouts.
            pending.loads[j] = client.submit(
                LOAD_ADAPTER, LoadAdapterParams(ADAPTER_NAME, str(policy.path.resolve()), policy.digest))
            self.loaded[i] = policy.digest
        call = pending.calls[j] = client.submit("generate", pending.params[j])
        pending.seqs[j] = self.store.call_seq(call.call_digest)
        pending.issued_to[j] = lease.replaced

    def _issue(self, m: int, j: int) -> None:
        """`_submit`, to a replacement if the worker is lost on the way."""
        while True:
            try:
                self._submit(m, j)
                return
            except WorkerLost as exc:
                self._lost(self.pending[m].workers[j], exc)

    def _lost(self, i: int, exc: WorkerLost) -> None:
        """Replace worker i (`ProtocolError` once no replacement is left); it has loaded no policy yet."""
        self.leases[i].replace(exc)
        self.loaded[i] = None

    def _prepare(self, m: int) -> _Prepared:
        """Cycle m's prompts, requests and call params: a function of the configuration and m alone (the policy's
        name in the params depends only on whether m samples the base model)."""
        cfg = self.p.config
        prompts = cyc.cycle_prompts(self.p.prompts, cfg.prompts.per_cycle, cfg.seed, m)
        requests = cyc.rollout_requests(prompts, cfg.rollout.group_size, cfg.seed, m, cfg.rollout.temperature,
                                        cfg.rollout.max_tokens, self.p.vocab)
        reference = "base" if cfg.objective.kl_coef > 0 else None
        adapter = ADAPTER_NAME if self.version(m) else None
        prepared = _Prepared([u for u in prompts for _ in range(cfg.rollout.group_size)], [], [], [])
        for i, part in enumerate(cyc.shards(len(requests), cfg.rollout.group_size, len(self.leases))):
            if part:
                prepared.shards.append(requests[part.start:part.stop])
                prepared.params.append(cyc.generate_params(prepared.shards[-1], cfg.rollout.batch_size, adapter,
                                                           reference))
                prepared.workers.append(i)
        return prepared

    def prepare(self, m: int) -> None:
        """Build cycle m's calls now (while the learner works), unless it is past the last cycle or under way."""
        if m < self.p.config.cycles and m not in self.pending and m not in self.prepared:
            self.prepared[m] = self._prepare(m)

    def start(self, m: int, done: list[Published]) -> None:
        """Submit cycle m's generate calls (its policy must be in `done`)."""
        version = self.version(m)
        policy = done[version - 1] if version else None
        prepared = self.prepared.pop(m, None) or self._prepare(m)
        calls = len(prepared.workers)
        pending = _Pending(version, policy, prepared.units, prepared.shards, prepared.params, prepared.workers,
                           [None] * calls, [None] * calls, [None] * calls, [-1] * calls)
        self.pending[m] = pending
        for j in range(calls):
            self._issue(m, j)

    def ahead(self, n: int, done: list[Published]) -> None:
        """Start every cycle after n (within K + 1) not under way whose policy is in `done`: while cycle n's learner
        works, those whose policy is published; once it has reported, the next one too (`_cycle`)."""
        for m in range(n + 1, min(n + 1 + self.p.config.rollout.staleness, self.p.config.cycles - 1) + 1):
            if m not in self.pending and self.version(m) <= len(done):
                self.start(m, done)

    def take(self, n: int, done: list[Published]) -> tuple[_Pending, list[Answer]]:
        """Cycle n's rollouts: its pending calls (started now if they were not), answered."""
        if n not in self.pending:
            self.start(n, done)
        pending = self.pending[n]
        answers = []
        for j, i in enumerate(pending.workers):
            while True:
                call, load = pending.calls[j], pending.loads[j]
                assert call is not None
                try:
                    if load is not None:
                        got = LOAD_ADAPTER.received(load.result())
                        assert pending.policy is not None
                        if got.adapter_digest != pending.policy.digest:
                            raise EvidenceError(f"cycle {n}: the engine loaded {got.adapter_digest[:16]}…, not the "
                                                f"published checkpoint {pending.policy.digest[:16]}…")
                        pending.loads[j] = None
                    answers.append(call.answer())
                    break
                except WorkerLost as exc:
                    # A call issued before an earlier loss of its worker is lost with it: the worker was already
                    # replaced, and only the call goes again.
                    if pending.issued_to[j] == self.leases[i].replaced:
                        self._lost(i, exc)
                    self._issue(n, j)
        del self.pending[n]
        return pending, answers


def learner_step_params(p: Plan, samples: list[cyc.Sample], advantages: np.ndarray,
                        save_dir: Path) -> LearnerStepParams:
    """The `learner_step` params of a cycle: its samples and advantages, the configuration's objective, optimizer,
    LoRA and schedule, the checkpoint folder."""
    cfg = p.config
    o, lo = cfg.optimizer, cfg.lora
    schedule = cfg.schedule()
    return cyc.learner_params(
        samples, advantages, temperature=cfg.rollout.temperature, objective=p.settings,
        optimizer=LearnerOptimizer(o.lr, o.betas, o.eps, o.weight_decay, o.max_grad_norm),
        lora=LoraParams(lo.r, lo.alpha, list(lo.targets), dropout=0.0),
        seed=cyc.derive_seed(cfg.seed, "lora-init"), save_dir=str(save_dir.resolve()),
        # None: the learner's own default, and the call's bytes as before schedules existed.
        schedule=None if schedule["reduction"] is None else Schedule(schedule["micro_batch"], schedule["reduction"]))


def _cycle(p: Plan, n: int, run_dir: Path, store: RunStore, rollouts: _Rollouts, learner: Session,
           done: list[Published], progress: Callable[[Progress], None], pool: WorkerPool) -> Published:
    """One cycle: sample, score, update, check, publish. Returns the published checkpoint."""
    cfg = p.config
    progress(Progress(n, cfg.cycles, "generate"))
    t0 = time.perf_counter()
    pending, gens = rollouts.take(n, done)  # already generated, with K ≥ 1, while the last update ran
    policy, start = pending.policy, (done[-1] if done else None)
    staleness = n - pending.version
    if staleness > cfg.rollout.staleness:  # the rule above never asks for one; a rollout this old is refused
        raise EvidenceError(f"cycle {n}: rollouts of policy version {pending.version} are {staleness} versions old, "
                            f"beyond rollout.staleness = {cfg.rollout.staleness}")
    with_reference = cfg.objective.kl_coef > 0
    samples = []
    for gen, shard in zip(gens, pending.shards, strict=True):
        samples += cyc.read_rollout(gen.result, shard, cycle=n, model_digest=p.model_digest,
                                    policy_digest=None if policy is None else policy.digest,
                                    reference=with_reference, vocab_size=p.vocab.size)
    rewards = cyc.rewards(samples, pending.units, p.scorer, p.vocab)
    adv = group_advantages(rewards, cfg.rollout.group_size, cfg.advantage.normalization, cfg.advantage.eps)
    t1 = time.perf_counter()

    progress(Progress(n, cfg.cycles, "learn"))
    pool.ready()  # no update starts after a signal
    save_dir = _save_dir(run_dir, n)
    save_dir.parent.mkdir(parents=True, exist_ok=True)
    params = learner_step_params(p, samples, adv.values, save_dir)
    submitted = learner.client.submit(LEARNER_STEP, params)
    learner_seq = store.call_seq(submitted.call_digest)
    rollouts.ahead(n, done)  # with K ≥ 1 the engines generate the next cycles while the learner updates
    rollouts.prepare(n + 1)  # the next cycle's prompts and calls, built while the learner works
    step = submitted.answer()
    # The update starts from the checkpoint published last, whatever policy the rollouts sampled.
    report = cyc.read_learner(step.result, samples, cycle=n, model_digest=p.model_digest,
                              start_digest=None if start is None else start.digest, optimizer_steps=n + 1,
                              save_dir=str(save_dir.resolve()))
    t2 = time.perf_counter()

    progress(Progress(n, cfg.cycles, "publish"))
    # The cycle that samples this update starts now, on the checkpoint as the learner reported it, and the engine
    # loads and samples it while the core checks it below. Its rollouts are read only once this cycle is published
    # (the next `_cycle`), and only if the checkpoint checked is that digest: a refused one stops the run first, its
    # calls on record and unused, as a resumed run leaves an unfinished cycle's. What stops that start (a signal, a
    # lost worker) stops the run only after this cycle is published.
    reported = Published(n, save_dir, report.adapter_digest, n + 1)
    deferred: Exception | None = None
    try:
        rollouts.ahead(n, [*done, reported])
    except Exception as exc:  # raised below, once this cycle's checkpoint is checked and published
        deferred = exc
    core = loss_terms(report.proximal, [s.behavior for s in samples], adv.values, p.settings,
                      reference=[s.reference for s in samples if s.reference is not None] if with_reference
                      else None)
    diffs = cyc.compare_objective(core, report.terms, proximal=report.proximal, samples=samples,
                                  advantages=adv.values, settings=p.settings, cycle=n)
    try:
        checkpoint = check_checkpoint(save_dir, p.model, reported_digest=report.adapter_digest,
                                      reported_tensors=report.adapter_tensors, reported_steps=n + 1,
                                      base_model_digest=p.model_digest)
    except EvidenceError as exc:
        raise EvidenceError(f"cycle {n}: checkpoint refused: {exc}") from None
    if (checkpoint.adapter.digest, checkpoint.optimizer_steps) != (reported.digest, reported.optimizer_steps):
        # check_checkpoint refuses another digest and other steps than the report's, so this is never met
        raise EvidenceError(f"cycle {n}: the checkpoint checked ({checkpoint.adapter.digest[:16]}…, "
                            f"{checkpoint.optimizer_steps} steps) is not the one the learner reported "
                            f"({reported.digest[:16]}…, {reported.optimizer_steps} steps), which the next cycle's "
                            "engine loaded")
    gap = cyc.gap(report.proximal, [s.behavior for s in samples])
    store.put_meta(CYCLE_KEY.format(n), {
        "cycle": n,
        "generate_call": gens[0].call_digest,
        **({"generate_calls": [g.call_digest for g in gens]} if len(gens) > 1 else {}),
        "learner_call": step.call_digest,
        # The records of those calls: identical call bytes may recur (a lost call issued again), the seq does not.
        "generate_seqs": pending.seqs,
        "learner_seq": learner_seq,
        "policy_digest": None if policy is None else policy.digest,
        "policy_version": pending.version,
        "staleness": staleness,
        "checkpoint": {"path": str(save_dir.relative_to(run_dir)), "digest": checkpoint.adapter.digest,
                       "optimizer_steps": checkpoint.optimizer_steps},
        "core": {"loss": core.loss, "policy": core.policy, "kl": core.kl,
                 "importance_weight_mean": core.importance_weight_mean, "tokens": core.tokens},
        "abs_diff": diffs,
        "reward_mean": float(np.mean(rewards)),
        "zero_variance_groups": adv.zero_variance,
        "wall_s": {"generate": t1 - t0, "learner": t2 - t1, "publish": time.perf_counter() - t2},
    })
    published = Published(n, save_dir, checkpoint.adapter.digest, checkpoint.optimizer_steps)
    progress(Progress(n + 1, cfg.cycles, "generate" if n + 1 < cfg.cycles else "done",
                      reward=float(np.mean(rewards)), gap_max=gap.max))
    if deferred is not None:
        raise deferred
    return published
