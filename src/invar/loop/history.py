"""A training run's history, recomputed from its records alone (`invar inspect history RUN`).

Decision: the history trusts no summary. For each published cycle it takes the generate and learner_step calls the
publication names (by call digest), re-reads their reports, re-scores every response with the tokenizer the run
kept, recomputes rewards, advantages (and checks they are the ones the learner was sent), the objective, the
learner–engine gap and the importance weights, and checks that the published checkpoint is the one the learner
reported. Only the wall time per phase is taken from the publication record, since the records' own timestamps
measure only the calls.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np

from invar.errors import ContractError, EvidenceError, RecordError
from invar.formats.tokenizer import from_kept
from invar.loop import cycle as cyc
from invar.loop.advantages import group_advantages
from invar.loop.config import Reduction, TrainConfig
from invar.loop.config import Scorer as ScorerSection
from invar.loop.objective import ObjectiveSettings, loss_terms
from invar.protocol.payloads import GenerateParams, GenerateRequest, LearnerStepParams, PayloadError
from invar.records import RunStore
from invar.records.store import CallRecord
from invar.stats.intervals import clopper_pearson
from invar.tasks import ModelTokenizer, answer_of
from invar.tasks.population import Unit, check_sha256, parse_units
from invar.tasks.scorers import Scorer, load_scorer, scorer_identity

CONFIDENCE = 0.95
"""Confidence of each cycle's accuracy interval."""


@dataclass(frozen=True)
class CycleHistory:
    """One cycle's numbers, recomputed from the records."""

    cycle: int
    prompts: int
    samples: int
    reward_mean: float
    """Mean reward over the cycle's samples ((b − ℓ) / (b − a) for a task loss ℓ in [a, b]; 1 − ℓ for 0/1)."""
    accuracy: float
    """Fraction of samples with reward 1 (equal to the reward mean for a 0/1 loss)."""
    accuracy_interval: tuple[float, float]
    """Clopper–Pearson interval at `CONFIDENCE`, treating the samples as independent (a prompt's G samples are
    correlated, so it is narrower than an interval over prompts would be)."""
    advantage_mean: float
    advantage_std: float
    advantage_min: float
    advantage_max: float
    zero_variance_groups: int
    groups: int
    loss_core: float
    """The objective as the core recomputes it from the recorded per-token numbers."""
    loss_learner: float
    """The objective the learner reported."""
    loss_abs_diff: float
    policy_core: float
    kl_core: float
    grad_norm: float
    gap: cyc.Gap
    """Learner log-probability at T minus the engine's behavior log-probability, on every sampled token."""
    importance: cyc.Importance
    staleness: int
    """Cycles between the policy the rollout sampled from and the one the update started from (0: synchronous)."""
    policy: str | None
    """Digest of the checkpoint the rollout sampled from (None: the base model)."""
    checkpoint: str
    """Digest of the checkpoint the cycle published."""
    wall_s: Mapping[str, float]
    """Seconds per phase: generate, learner, publish."""


@dataclass(frozen=True)
class History:
    run: Path
    config: TrainConfig
    closed: bool
    head: str
    cycles: list[CycleHistory]


def _vocabulary(kept: Any, run: Path) -> ModelTokenizer:
    files = kept.get("tokenizer") if isinstance(kept, dict) else None
    if not isinstance(files, dict):
        raise RecordError(f"{run}: the run keeps no tokenizer (metadata inputs.tokenizer); it is not a training run")
    with tempfile.TemporaryDirectory(prefix="invar-history-") as scratch:
        return from_kept(files, scratch)


@dataclass(frozen=True)
class _Task:
    """What a run's rewards read: its scorer, and the units it trains on where the run keeps its population
    (None for the arithmetic task, whose answers follow from each request's prompt)."""

    scorer: Scorer
    units: list[Unit] | None


def _task(info: Mapping[str, Any], kept: Any, config: TrainConfig, run: Path) -> _Task:
    """The run's task, from its records alone: the population and user scorer file it keeps, each checked against
    the digests it recorded."""
    declared = config.scorer
    if declared == ScorerSection():
        return _Task(load_scorer(declared.name, declared.settings, run), None)
    kept = kept if isinstance(kept, dict) else {}
    identity = info.get("scorer")
    population = kept.get("population")
    if not isinstance(identity, dict) or not isinstance(population, bytes):
        raise RecordError(f"{run}: the run trains with scorer {declared.name} but keeps no population or scorer "
                          "identity (metadata inputs.population, run.scorer)")
    sha = identity.get("sha256")
    file = kept.get("scorer_file")
    try:
        scorer = load_scorer(declared.name, declared.settings, run, sha if isinstance(sha, str) else None,
                             kept=file if isinstance(file, bytes) else None)
        check_sha256("kept population", run, population, str(info.get("prompts_sha256")))
        units = parse_units(population, "the run's kept population")
    except ContractError as exc:
        raise EvidenceError(f"{run}: {exc}") from None
    if scorer_identity(scorer) != identity:
        raise EvidenceError(f"{run}: the scorer the run keeps is not the one it recorded")
    return _Task(scorer, cyc.select_units(units, config.prompts.kinds))


def _arithmetic_units(requests: Sequence[Mapping[str, Any]], n: int) -> list[Unit]:
    """The arithmetic units of recorded requests: each answer is the one its prompt gives."""
    units = []
    for req in requests:
        prompt = str(req.get("prompt"))
        try:
            answer = str(answer_of(prompt))
        except ContractError as exc:
            raise EvidenceError(f"cycle {n} request {req.get('request_id')}: {exc}") from None
        units.append(Unit(str(req.get("request_id")), prompt, None, answer))
    return units


class PublishedCalls:
    """The calls a run's publications name, found by record (seq) and digest.

    A publication names each call by its digest and, since identical call bytes may recur in a run (a lost call
    issued again, after a resume or to a replacement worker), by its record's seq as well: that record must hold
    the call with that digest, answered. A publication written before publications named the record has the
    digest alone; it names the answered copy of the call (the one the cycle consumed), the last one recorded when
    there are several."""

    def __init__(self, calls: Sequence[CallRecord]) -> None:
        self.by_seq = {c.seq: c for c in calls}
        self.answered: dict[str, CallRecord] = {}
        for c in sorted(calls, key=lambda c: c.seq):
            if c.report is not None and c.report.report.ok:
                self.answered[c.call_digest] = c

    def named(self, digest: Any, seq: Any, what: str, n: int) -> CallRecord:
        """The answered call a publication names (`EvidenceError` naming the cycle if the records hold none)."""
        if seq is None:
            rec = self.answered.get(str(digest))
        else:
            rec = self.by_seq.get(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None
            if rec is not None and rec.call_digest != digest:
                raise EvidenceError(f"cycle {n}: the publication names {what} call {str(digest)[:16]}… in record "
                                    f"{seq}, which holds call {rec.call_digest[:16]}…")
        if rec is None or rec.report is None or not rec.report.report.ok or rec.call.method != what:
            at = "" if seq is None else f" (record {seq})"
            raise EvidenceError(f"cycle {n}: the publication names {what} call {str(digest)[:16]}…{at}, which the "
                                "records do not hold answered")
        return rec

    def of(self, entry: Mapping[str, Any], n: int) -> tuple[list[CallRecord], CallRecord]:
        """The generate calls (one per inference worker, in shard order) and the learner_step call of cycle n's
        publication `entry`."""
        names = entry.get("generate_calls") or [entry.get("generate_call")]
        seqs = entry.get("generate_seqs")
        if not isinstance(seqs, list) or len(seqs) != len(names):
            if seqs is not None:
                raise EvidenceError(f"cycle {n}: the publication names {len(names)} generate calls but "
                                    f"{len(seqs) if isinstance(seqs, list) else 'no list of'} records")
            seqs = [None] * len(names)
        gens = [self.named(name, seq, "generate", n) for name, seq in zip(names, seqs, strict=True)]
        return gens, self.named(entry.get("learner_call"), entry.get("learner_seq"), "learner_step", n)


def read_history(run: Path, *, expect_head: str | None = None) -> History:
    """Verify the run's records and recompute every published cycle's numbers from them."""
    with RunStore.open(run) as store:
        records = store.calls()  # verifies the store, walked once: verify() below reuses the walk
        v = store.verify(expect_head=expect_head)
        meta = store.meta()
        calls = PublishedCalls(records)
    info = meta.get("run", {})
    if info.get("command") != "train":
        raise RecordError(f"{run}: is a run of {info.get('command')!r}, not a training run; inspect history reads "
                          "the runs invar train makes")
    config = TrainConfig.model_validate({k: v for k, v in info["config"].items() if k != "schema"})
    vocab = _vocabulary(meta.get("inputs"), run)
    task = _task(info, meta.get("inputs"), config, run)
    o = config.objective
    settings = ObjectiveSettings(o.clip_low, o.clip_high, o.kl_coef, o.importance, o.importance_cap)
    model_digest = str(info.get("model_digest"))
    rows: list[CycleHistory] = []
    previous: str | None = None
    published: list[str] = []
    for n in range(len([k for k in meta if k.startswith("cycle-")])):
        entry = meta.get(f"cycle-{n:06d}")
        if not isinstance(entry, dict):
            raise RecordError(f"{run}: cycle {n} has no publication record; the publications have a gap")
        gens, step = calls.of(entry, n)
        shards: list[list[Any]] = []
        for g in gens:
            requests = g.call.params.get("requests")
            if not isinstance(requests, list):
                raise EvidenceError(f"cycle {n}: a generate call holds no requests")
            shards.append(requests)
        # Cycle n samples policy version max(0, n − K): the checkpoint published by cycle n − K − 1 (K = 0: the one
        # published last), or the base model.
        version = max(0, n - config.rollout.staleness)
        sampled = published[version - 1] if version else None
        if entry.get("policy_digest") != sampled:
            raise EvidenceError(f"cycle {n}: sampled from {str(entry.get('policy_digest'))[:16]}…, not policy version "
                                f"{version} (rollout.staleness = {config.rollout.staleness})")
        with_reference = o.kl_coef > 0
        assert step.report is not None
        recorded = [r for requests in shards for r in requests]
        if task.units is None:
            cyc.check_prompt_ids(recorded, vocab, f"cycle {n}:")
            units = _arithmetic_units(recorded, n)
        else:
            # The run keeps its population: the cycle's requests are re-derived from it and must be the recorded
            # ones, so each reward is scored against the unit the engine was asked.
            prompts = cyc.cycle_prompts(task.units, config.prompts.per_cycle, config.seed, n)
            expected = cyc.rollout_requests(prompts, config.rollout.group_size, config.seed, n,
                                            config.rollout.temperature, config.rollout.max_tokens, vocab)
            cyc.check_requests(recorded, expected, f"cycle {n}: generate")
            units = [u for u in prompts for _ in range(config.rollout.group_size)]
        samples = []
        for gen, requests in zip(gens, shards, strict=True):
            assert gen.report is not None
            samples += cyc.read_rollout(gen.report.report.result or {}, _requests(requests, n), cycle=n,
                                        model_digest=model_digest,
                                        policy_digest=sampled, reference=with_reference, vocab_size=vocab.size)
        try:
            rewards = cyc.rewards(samples, units, task.scorer, vocab)
        except ContractError as exc:
            raise EvidenceError(f"cycle {n}: {exc}") from None
        adv = group_advantages(rewards, config.rollout.group_size, config.advantage.normalization,
                               config.advantage.eps)
        try:
            # Read as a learner read it: the reductions are every one a configuration can name.
            sent = LearnerStepParams.from_wire(step.call.params, reductions=get_args(Reduction))
        except PayloadError as exc:
            raise EvidenceError(f"cycle {n}: {exc}") from None
        sent_adv = [s.advantage for s in sent.samples]
        if len(sent_adv) != len(samples) or np.asarray(sent_adv, dtype=np.float32).tobytes() != adv.values.tobytes():
            raise EvidenceError(f"cycle {n}: the advantages the learner was sent are not the ones the core computes "
                                "from the recorded responses")
        ck = entry.get("checkpoint")
        save_dir = sent.save_dir
        report = cyc.read_learner(step.report.report.result or {}, samples, cycle=n, model_digest=model_digest,
                                  start_digest=previous, optimizer_steps=n + 1, save_dir=save_dir)
        if not isinstance(ck, dict) or ck.get("digest") != report.adapter_digest:
            raise EvidenceError(f"cycle {n}: the published checkpoint is not the one the learner reported")
        behavior = [s.behavior for s in samples]
        core = loss_terms(report.proximal, behavior, adv.values, settings,
                          reference=[s.reference for s in samples if s.reference is not None] if with_reference
                          else None)
        correct = int(np.sum(rewards == 1.0))
        wall = entry.get("wall_s")
        rows.append(CycleHistory(
            cycle=n, prompts=adv.groups, samples=len(samples), reward_mean=float(np.mean(rewards)),
            accuracy=correct / len(samples), accuracy_interval=clopper_pearson(correct, len(samples), CONFIDENCE),
            advantage_mean=float(np.mean(adv.values)), advantage_std=float(np.std(adv.values)),
            advantage_min=float(np.min(adv.values)), advantage_max=float(np.max(adv.values)),
            zero_variance_groups=adv.zero_variance, groups=adv.groups,
            loss_core=core.loss, loss_learner=report.terms.loss, loss_abs_diff=abs(core.loss - report.terms.loss),
            policy_core=core.policy, kl_core=core.kl, grad_norm=report.grad_norm,
            gap=cyc.gap(report.proximal, behavior), importance=cyc.importance(report.proximal, behavior, settings),
            staleness=n - version, policy=sampled, checkpoint=report.adapter_digest,
            wall_s={k: float(wall[k]) for k in ("generate", "learner", "publish")} if isinstance(wall, dict)
            else {}))
        previous = report.adapter_digest
        published.append(previous)
    return History(run, config, v.closed, v.head, rows)


def _requests(recorded: list[Any], n: int) -> list[GenerateRequest]:
    """A recorded generate call's requests, read as the worker read them (`EvidenceError` naming the field)."""
    try:
        return list(GenerateParams.from_wire({"requests": recorded}).requests)
    except PayloadError as exc:
        raise EvidenceError(f"cycle {n}: {exc}") from None
