"""`invar compare histories RUN_A RUN_B`: did two training runs that scheduled their work differently publish the
same policies, bit for bit, from the same consumed rollouts?

Decisions:
- **Only the schedule may differ.** Two runs are comparable when their configurations agree on everything but the
  schedule knobs (`SCHEDULE_KNOBS`: how the work is split, never what is computed) and the run's name and length.
  The base model and the prompts are compared by their digests, not by the paths that name them. Any other
  difference (seed, learning rate, model, …) is a refusal naming the fields: such runs are expected to differ,
  and saying "different" would prove nothing.
- **Records first.** Both runs are verified through the store (`RunStore.verify`); a tampered store is refused with
  the record it names. Every published checkpoint must still have the digest its publication recorded. A run
  without a close record reads as incomplete: it can be compared over its published cycles but never reads as
  identical.
- **Identical means the same bytes.** A cycle is identical when the two published checkpoints have the same tree
  digest (adapter, optimizer state, manifest) and the cycle consumed the same (prompt, sample, seed, policy version)
  set. Where the digests differ, the tensors are read with the standard library and numpy (no engine) to name the
  first tensor that differs, how many of its elements differ and the largest |Δ|.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.compare.outputs import CompareHistoriesOutput, CycleHistoriesRow, HistoriesRun, TensorDiffOutput
from invar.errors import EvidenceError, InvarError, RecordError
from invar.formats.checkpoint import MLX_WEIGHTS, OPTIMIZER_WEIGHTS, PEFT_WEIGHTS, CheckpointError, read_safetensors
from invar.loop.config import TrainConfig
from invar.loop.history import PublishedCalls
from invar.protocol.payloads import GenerateResult, PayloadError
from invar.records import RunStore
from invar.records.store import is_run

EXIT_IDENTICAL, EXIT_DIFFER = 0, 10

SCHEDULE_KNOBS = ("rollout.batch_size", "rollout.workers", "rollout.layout", "learner.micro_batch",
                  "learner.reduction")
"""Configuration fields that only decide how a cycle's work is scheduled (engine batch layout, inference workers,
whether the roles share a worker process, learner micro-batch and its reduction).
`learner.reduction = "float32-microbatch"` is the negative control: a schedule-dependent reduction, which this
comparison must report as different."""

DECLARED_KNOBS = ("rollout.staleness",)
"""Configuration fields that may differ between comparable runs but are expected to change the policies: the
declared staleness K (asynchronous mode) samples older policies by design."""

_IGNORED = ("name", "cycles", "model", "prompts.path", "prompts.sha256")
"""Not compared as written: the run's name and length, and the paths (the digests behind them are compared)."""

_WEIGHT_FILES = (PEFT_WEIGHTS, MLX_WEIGHTS, OPTIMIZER_WEIGHTS)
"""Read in this order to find the first tensor that differs: the adapter, then its optimizer state."""


class NotComparable(InvarError):
    """Two histories that cannot be compared (other configurations, a tampered store, not training runs)."""


@dataclass(frozen=True)
class Cycle:
    """One published cycle of a run, as its records name it."""

    cycle: int
    digest: str
    path: Path
    consumed: frozenset[tuple[str, int, int, int]]
    """(prompt, sample index, sampling seed, policy version) of every rollout the update consumed."""
    responses: str
    """sha256 over the sampled tokens and their log-probabilities' bytes, in request order."""


@dataclass(frozen=True)
class RunHistory:
    path: Path
    closed: bool
    head: str
    config: dict[str, Any]
    """The configuration, flattened to dotted names, with the digests of the model and prompts."""
    cycles: list[Cycle]


@dataclass(frozen=True)
class CycleComparison:
    cycle: int
    digest_a: str
    digest_b: str
    consumed_same: bool
    responses_same: bool
    diff: TensorDiffOutput | None = None

    @property
    def identical(self) -> bool:
        return self.digest_a == self.digest_b and self.consumed_same

    def output(self) -> CycleHistoriesRow:
        return CycleHistoriesRow(cycle=self.cycle, identical=self.identical, checkpoint_a=self.digest_a,
                                 checkpoint_b=self.digest_b, checkpoints_identical=self.digest_a == self.digest_b,
                                 consumed_same=self.consumed_same, responses_same=self.responses_same, diff=self.diff)


@dataclass(frozen=True)
class HistoriesComparison:
    a: RunHistory
    b: RunHistory
    knobs: dict[str, tuple[Any, Any]]
    """The schedule knobs whose values differ: name → (A's, B's)."""
    cycles: list[CycleComparison] = field(default_factory=list)

    @property
    def first_difference(self) -> CycleComparison | None:
        return next((c for c in self.cycles if not c.identical), None)

    @property
    def identical(self) -> bool:
        return (self.a.closed and self.b.closed and len(self.a.cycles) == len(self.b.cycles)
                and self.first_difference is None)

    @property
    def exit_code(self) -> int:
        return EXIT_IDENTICAL if self.identical else EXIT_DIFFER

    def output(self) -> CompareHistoriesOutput:
        """What `compare histories --json` prints."""
        first = self.first_difference
        return CompareHistoriesOutput(
            verdict="identical" if self.identical else "differ",
            runs=[HistoriesRun(run=str(r.path), closed=r.closed, chain_head=r.head, cycles=len(r.cycles))
                  for r in (self.a, self.b)],
            schedule_knobs_differing={k: list(v) for k, v in self.knobs.items()},
            cycles_compared=len(self.cycles),
            first_differing_cycle=None if first is None else first.cycle,
            cycles=[c.output() for c in self.cycles],
        )


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _responses_digest(outputs: list[Any]) -> str:
    h = hashlib.sha256()
    for out in outputs:
        for key in ("tokens", "logprobs", "reference_logprobs"):
            value = out.get(key) if isinstance(out, dict) else None
            h.update(key.encode())
            h.update(np.ascontiguousarray(value).tobytes() if isinstance(value, np.ndarray) else b"-")
    return h.hexdigest()


def read_run(path: Path, label: str) -> RunHistory:
    """Verify a training run's records and name each published cycle's checkpoint and consumed rollouts."""
    if not is_run(path):
        raise NotComparable(f"{label} {path}: not a run directory (no records.sqlite); give the --run folder of an "
                            "invar train run")
    try:
        with RunStore.open(path) as store:
            records = store.calls()  # verifies the store, walked once: verify() below reuses the walk
            v = store.verify()
            meta = store.meta()
            calls = PublishedCalls(records)
    except RecordError as exc:
        raise NotComparable(f"{label}: refused, its records do not verify: {exc}") from None
    info = meta.get("run", {})
    if not isinstance(info, dict) or info.get("command") != "train" or not isinstance(info.get("config"), dict):
        raise NotComparable(f"{label} {path}: is a run of {info.get('command')!r}, not a training run; compare "
                            "histories reads the runs invar train makes")
    try:
        config = TrainConfig.model_validate({k: x for k, x in info["config"].items() if k != "schema"})
    except ValueError as exc:
        raise NotComparable(f"{label} {path}: its recorded configuration does not read ({exc})") from None
    flat = {k: x for k, x in _flatten(config.model_dump(mode="json")).items() if k not in _IGNORED}
    # The reduction the learner ran, not the field as written (omitted means float64-sequence on mlx).
    flat["learner.reduction"] = config.schedule()["reduction"] or "whole-batch"
    flat["model_digest"] = info.get("model_digest")
    flat["prompts_sha256"] = info.get("prompts_sha256")
    flat["objective_version"] = info.get("objective_version")
    cycles: list[Cycle] = []
    versions: dict[str | None, int] = {None: 0}
    n = 0
    while (entry := meta.get(f"cycle-{n:06d}")) is not None:
        ck = entry.get("checkpoint") if isinstance(entry, dict) else None
        try:
            gens = calls.of(entry, n)[0] if isinstance(entry, dict) else []
        except EvidenceError:
            gens = []
        if not isinstance(ck, dict) or not gens:
            raise NotComparable(f"{label} {path}: the publication of cycle {n} does not name a checkpoint and "
                                "answered generate calls")
        folder = path / str(ck.get("path"))
        digest = str(ck.get("digest"))
        if not folder.is_dir() or canonical.tree_digest(folder) != digest:
            raise NotComparable(f"{label} {path}: the checkpoint of cycle {n} ({folder}) no longer has the digest "
                                f"its publication recorded ({digest[:16]}…); restore it to compare the runs")
        policy = entry.get("policy_digest")
        if policy not in versions:
            raise NotComparable(f"{label} {path}: cycle {n} sampled from {str(policy)[:16]}…, which the run did not "
                                "publish before it")
        version = versions[policy]
        requests: list[Any] = []
        outputs: list[Any] = []
        for gen in gens:
            assert gen is not None
            assert gen.report is not None
            result = gen.report.report.result or {}
            asked, answered = gen.call.params.get("requests"), result.get("outputs")
            if "outputs_batch" in result:  # the outputs as columns (a training cycle's): read as the same maps
                try:
                    answered = [o.to_wire() for o in GenerateResult.from_wire(result).outputs]
                except PayloadError:
                    answered = None
            if not isinstance(asked, list) or not isinstance(answered, list):
                raise NotComparable(f"{label} {path}: a generate call of cycle {n} holds no requests or outputs")
            requests += asked
            outputs += answered
        consumed = frozenset((str(r["prompt"]), int(str(r["request_id"]).rsplit("/", 1)[1]), int(r["seed"]), version)
                             for r in requests)
        cycles.append(Cycle(n, digest, folder, consumed, _responses_digest(outputs)))
        versions[digest] = n + 1
        n += 1
    return RunHistory(path, v.closed, v.head, flat, cycles)


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def check_comparable(a: RunHistory, b: RunHistory) -> dict[str, tuple[Any, Any]]:
    """The schedule knobs that differ; `NotComparable` naming every other field that does."""
    keys = sorted(set(a.config) | set(b.config))
    differ = [k for k in keys if a.config.get(k) != b.config.get(k)]
    others = [k for k in differ if k not in SCHEDULE_KNOBS + DECLARED_KNOBS]
    if others:
        shown = ", ".join(f"{k} ({_shown(a.config.get(k))[:24]} vs {_shown(b.config.get(k))[:24]})" for k in others)
        raise NotComparable(f"the runs are not comparable: their configurations differ in {shown}, which is not a "
                            f"schedule knob ({', '.join(SCHEDULE_KNOBS + DECLARED_KNOBS)}); compare runs made with the "
                            "same configuration but for their schedule")
    return {k: (a.config.get(k), b.config.get(k)) for k in differ}


def _tensor_diff(folder_a: Path, folder_b: Path) -> TensorDiffOutput | None:
    first: tuple[str, str, int, int, float] | None = None
    tensors = elements = 0
    for name in _WEIGHT_FILES:
        pa, pb = folder_a / name, folder_b / name
        if not pa.is_file() and not pb.is_file():
            continue
        try:
            fa, fb = read_safetensors(pa), read_safetensors(pb)
        except CheckpointError as exc:
            raise NotComparable(f"a published checkpoint does not read: {exc}") from None
        for tensor in sorted(set(fa.tensors) | set(fb.tensors)):
            if tensor not in fa.tensors or tensor not in fb.tensors or \
                    fa.tensors[tensor].shape != fb.tensors[tensor].shape or \
                    fa.tensors[tensor].dtype != fb.tensors[tensor].dtype:
                raise NotComparable(f"{name} tensor {tensor}: present in one checkpoint only, or with another shape "
                                    "or dtype; the runs do not train the same adapter")
            if fa.raw(tensor) == fb.raw(tensor):
                continue
            x, y = fa.array(tensor), fb.array(tensor)
            bits = x.view(f"<u{x.dtype.itemsize}") != y.view(f"<u{y.dtype.itemsize}")
            count = int(np.count_nonzero(bits))
            if fa.tensors[tensor].dtype == "bfloat16":  # raw patterns: widen to float32 to subtract
                x = (x.astype(np.uint32) << 16).view(np.float32)
                y = (y.astype(np.uint32) << 16).view(np.float32)
            delta = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
            tensors += 1
            elements += count
            if first is None:
                first = (name, tensor, count, int(x.size), delta)
    if first is None:
        return None
    return TensorDiffOutput(file=first[0], tensor=first[1], elements=first[2], size=first[3], max_abs_delta=first[4],
                            tensors_differing=tensors, elements_differing=elements)


def compare_histories(run_a: Path, run_b: Path) -> HistoriesComparison:
    """Verify both runs, refuse incomparable ones, and compare their published cycles one by one."""
    a, b = read_run(run_a, "RUN_A"), read_run(run_b, "RUN_B")
    knobs = check_comparable(a, b)
    rows = []
    for ca, cb in zip(a.cycles, b.cycles, strict=False):
        diff = None
        if ca.digest != cb.digest:
            try:
                diff = _tensor_diff(ca.path, cb.path)
            except (OSError, EvidenceError) as exc:
                raise NotComparable(f"cycle {ca.cycle}: the checkpoints do not read ({exc})") from None
        rows.append(CycleComparison(ca.cycle, ca.digest, cb.digest, ca.consumed == cb.consumed,
                                    ca.responses == cb.responses, diff))
    return HistoriesComparison(a, b, knobs, rows)


def render(result: HistoriesComparison) -> str:
    """The comparison as text: the runs, the knobs that differ, one line per cycle, the first difference."""
    def state(r: RunHistory) -> str:
        return f"{len(r.cycles)} cycles, {'closed' if r.closed else 'incomplete (no close record)'}"

    lines = [f"compare histories: A {result.a.path} ({state(result.a)}); B {result.b.path} ({state(result.b)})"]
    knobs = ", ".join(f"{k} ({_shown(x)} vs {_shown(y)})" for k, (x, y) in result.knobs.items())
    lines.append(f"schedule knobs that differ: {knobs or 'none'}")
    lines.append(f"{'cycle':>5}  {'checkpoint':<40}  {'consumed':<9}  responses")
    for c in result.cycles:
        ck = f"identical {c.digest_a[:16]}…" if c.digest_a == c.digest_b else \
            f"differs {c.digest_a[:12]}… / {c.digest_b[:12]}…"
        lines.append(f"{c.cycle:>5}  {ck:<40}  {'same' if c.consumed_same else 'differ':<9}  "
                     f"{'bit-identical' if c.responses_same else 'differ'}")
    first = result.first_difference
    if first is not None:
        what = [] if first.consumed_same else ["the consumed (prompt, sample, seed, version) sets differ"]
        if first.diff is not None:
            d = first.diff
            what.append(f"first tensor {d.tensor} ({d.file}): {d.elements} of {d.size} elements differ, max |Δ| "
                        f"{d.max_abs_delta:.3g}; {d.tensors_differing} tensors, {d.elements_differing} elements differ "
                        "in all")
        lines.append(f"first difference: cycle {first.cycle}: " + "; ".join(what))
    if len(result.a.cycles) != len(result.b.cycles):
        lines.append(f"the runs published {len(result.a.cycles)} and {len(result.b.cycles)} cycles; compared the "
                     f"first {len(result.cycles)}")
    if result.identical:
        lines.append(f"verdict: identical: every one of {len(result.cycles)} cycles published the same checkpoint "
                     "from the same rollouts")
    elif first is not None:
        lines.append(f"verdict: differ, first at cycle {first.cycle}")
    else:
        lines.append("verdict: differ: the compared cycles agree, but the runs are not both complete and of the "
                     "same length")
    return "\n".join(lines)
