"""Reading a use run under its contract: the one reader `use admit`, `use run` and `compare numerical RUN` share.

A run's records mean something only under the contract they were made for: the contract's sha256 names the run, the
files it fixes by digest give the plan and each package's tokenizer, and the plan says which record answers which
call. `RunReader` holds those anchors once read (the contract, its sha256, the plan, the tokenizers, the scorer) and
binds a store's records to them (`invar.contract.bind`) in the three ways the commands need:

- `bind_complete` (`use admit`): the store verified and closed, made under this contract, every planned call answered;
- `bind_streamed` (`compare numerical RUN`): the same checks, reading the store once as a stream;
- `bind_partial` (`use run` resuming): as far as the run got, so a run resumes exactly where admission would say it
  stopped.

The losses, the units a sequential run reached, its stopping rule and the measurements are then computed from the
bound evidence by the same methods for all three, so the stop `use run` records is the one admission recomputes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from invar import parallel
from invar.compare.measured import measured_comparison
from invar.compare.numerical import DEFAULT_LARGE_STEP, InputError, NumericalComparison, Response
from invar.contract.bind import (
    BoundEvidence,
    CallEvidence,
    Output,
    OutputReader,
    Visit,
    bind_in_one_pass,
    bind_records,
    collect_evidence,
    layout_outputs,
    recorded_looks,
    stream_evidence,
)
from invar.contract.decide import (
    layout_losses,
    output_digest,
    sequential_rule,
    sequential_stop,
    token_losses,
    unit_loss,
    unit_range_loss,
)
from invar.contract.inputs import read_anchors
from invar.contract.model import Contract, Package
from invar.contract.plan import ExecutionPlan, PlannedCall, Role
from invar.contract.prepare import ROLES, contract_scorer, difference_range, package_tokenizers
from invar.errors import EvidenceError, InvarError
from invar.formats.tokenizer import ModelTokenizer
from invar.records.store import CallStream, RunStore, Verification
from invar.stats.sequential import SequentialDecision
from invar.tasks.scorers import Scorer


@dataclass(frozen=True)
class RunReader:
    """A contract's anchors, read once, for reading the records of runs made under it."""

    contract: Contract
    sha256: str
    """Of the contract file's bytes: the run must name it (meta `run.contract_sha256`)."""
    base: Path
    """The contract's folder: the files it names are relative to it."""
    plan: ExecutionPlan
    tokenizers: Mapping[Role, ModelTokenizer]
    """Each package's tokenizer, checked against the contract's digest."""

    @classmethod
    def of_run(cls, contract: Contract, sha256: str, base: Path, store: RunStore, scratch: Path) -> RunReader:
        """The plan and tokenizers of `contract` (read from the file at `base` with that sha256), from the files it
        fixes beside it, or else from the copies `store`'s run keeps (written into `scratch`), every one checked
        against the contract."""
        plan, tokenizers = read_anchors(contract, sha256, base, store, scratch)
        return cls(contract, sha256, base, plan, tokenizers)

    @classmethod
    def of_models(cls, contract: Contract, sha256: str, plan: ExecutionPlan, base: Path,
                  folders: Mapping[Role, Path]) -> RunReader:
        """A contract already read with its plan, the tokenizers from each package's model folder `folders[role]`
        (`use run`, once it has checked the folders' digests)."""
        return cls(contract, sha256, base, plan, package_tokenizers(contract, folders))

    @property
    def eos(self) -> dict[Role, frozenset[int]]:
        """Each package's end-of-sequence tokens: where a response must end when it stops."""
        return {role: frozenset(self.tokenizers[role].eos_token_ids) for role in ROLES}

    @functools.cached_property
    def scorer(self) -> Scorer:
        """The contract's scorer as this Invar computes it, read when first asked (a changed user scorer is refused
        then: `use run` asks before any worker starts, admission after binding)."""
        return contract_scorer(self.contract, self.base)

    def bind_complete(self, store: RunStore) -> BoundEvidence:
        """Every planned call bound to the one record that answered it, the store verified, closed and of this
        contract (`invar.contract.bind.collect_evidence`); the outputs are read again from `store` when asked."""
        return collect_evidence(store, self.contract, self.sha256, self.plan, self.eos)

    def bind_streamed(self, store: RunStore, stream: CallStream | None = None) -> BoundEvidence:
        """As `bind_complete`, reading the store once as a stream (`invar.contract.bind.stream_evidence`; `stream`,
        the store's, perhaps primed, when given)."""
        return stream_evidence(store, self.contract, self.sha256, self.plan, self.eos, stream)

    def bind_partial(self, store: RunStore) -> BoundEvidence:
        """The records of a run still going (or stopped) bound as far as it got, one call at a time, outputs read again
        from `store` when asked; the caller has checked that the run is of this contract."""
        return bind_records(store.iter_calls(), self.contract, self.plan, self.eos, OutputReader(store))

    def read_scored(self, store: RunStore, invariance: Sequence[str] = (),
                    progress: Callable[[int, int], object] | None = None, expect_head: str | None = None,
                    stream: CallStream | None = None, keep: Visit | None = None,
                    scoring: Callable[[], object] | None = None) -> Scored:
        """`bind_complete`, each record read and decoded once (`invar.contract.bind.bind_in_one_pass`): as each
        generate call binds, its pairing-layout responses are kept (their tokens, compactly) and, for the candidate's
        calls under the `invariance` layouts, each output kept as its digest (`invar.contract.decide.output_digest`);
        then the outputs are dropped (`expect_head`: the head the run must have), and once the pass ends the kept
        responses are scored into the losses. The same evidence, losses and refusals (a loss the scorer refuses is
        raised as `losses` raises it: the first in the plan's order, after everything binding refuses). `stream`: the
        store's pass to read (`RunStore.stream(kept=True)`, perhaps primed). `keep` is told each bound generate call
        with its outputs too, as it binds (what a caller keeps of them); `scoring`, when the pass is done and the
        scoring starts."""
        plan = self.plan
        try:
            scorer = self.scorer
        except InvarError as exc:  # refused after what binding refuses, as `losses` after `bind_complete`
            bind_in_one_pass(store, self.contract, self.sha256, plan, self.eos, lambda *_: None, progress, expect_head,
                             stream)
            raise exc from None
        n = len(plan.units)
        losses = {role: np.zeros(n, dtype=np.int64 if scorer.binary else np.float64) for role in ROLES}
        digests = {layout: np.zeros((n, 32), dtype=np.uint8) for layout in invariance}
        rank = {c.key: (r, i) for r, role in enumerate(ROLES)
                for i, c in enumerate(plan.layout_calls(role, plan.pairing_layout))}
        refused: dict[tuple[int, int], EvidenceError] = {}
        # The pairing calls' responses, kept compactly (each call's tokens in one array) and scored once the pass ends:
        # half of them in a helper process where the command allows one, since the checking process is done by then.
        responses: list[_Responses] = []

        def visit(planned: PlannedCall, evidence: CallEvidence, outputs: tuple[Output, ...]) -> None:
            role = planned.package
            if planned.run > 1:
                if keep is not None:
                    keep(planned, evidence, outputs)
                return  # a later run of the determinism layout: compared with the first run, not scored
            if planned.layout == plan.pairing_layout:
                lengths = np.fromiter((o.tokens.size for o in outputs), dtype=np.int32, count=len(outputs))
                tokens = _narrow(np.concatenate([o.tokens for o in outputs]))
                responses.append(_Responses(planned, evidence.name, tokens, np.cumsum(lengths, dtype=np.int32)[:-1]))
            if role == "candidate" and planned.layout in digests:
                table = digests[planned.layout]
                for index, o in zip(planned.units, outputs, strict=True):
                    table[index] = output_digest(o)
            if keep is not None:
                keep(planned, evidence, outputs)

        bound, verification = bind_in_one_pass(store, self.contract, self.sha256, plan, self.eos, visit, progress,
                                               expect_head, stream)

        def scored(part: Sequence[_Responses]) -> list[np.ndarray | str]:
            out: list[np.ndarray | str] = []
            for r in part:
                try:
                    out.append(token_losses([plan.units[i] for i in r.planned.units], np.split(r.tokens, r.starts),
                                            self.tokenizers[r.planned.package], scorer))
                except EvidenceError as exc:
                    out.append(f"{r.name}: {exc}")
            return out

        if scoring is not None:
            scoring()
        for r, part in zip(responses, parallel.in_halves(scored, responses), strict=True):
            if isinstance(part, str):
                refused[rank[r.planned.key]] = EvidenceError(part)
            else:
                losses[r.planned.package][list(r.planned.units)] = part
        if refused:
            raise refused[min(refused)]
        return Scored(bound, losses, digests, verification)

    def losses(self, found: Mapping[str, CallEvidence]) -> dict[Role, np.ndarray]:
        """Each package's task loss per planned unit under the pairing layout (`layout_losses`: int64[n] for a
        binary scorer, float64[n] otherwise; 0 for a look a sequential run did not reach)."""
        return {role: layout_losses(self.plan, found, role, self.plan.pairing_layout, self.tokenizers[role],
                                    self.scorer) for role in ROLES}

    def unit_loss(self, role: Role, index: int, tokens: np.ndarray) -> float:
        """One planned unit's task loss from `role`'s response `tokens` (int[T]), as `losses` scores it."""
        score = unit_loss if self.scorer.binary else unit_range_loss
        return score(self.plan.units[index], tokens, self.tokenizers[role], self.scorer)

    def looks(self, found: Mapping[str, CallEvidence], where: str, *, running: bool = False) -> int:
        """A sequential run's looks its records complete (`recorded_looks`, which refuses a run out of look order;
        `running`: a run being resumed may also hold part of the next look)."""
        return recorded_looks(self.plan, found, where, running=running)

    def reached_units(self, found: Mapping[str, CallEvidence], where: str) -> list[int]:
        """The units a run's decision uses, in the plan's order: every planned unit, or for a sequential run those of
        the looks its records complete (`looks`)."""
        if self.plan.sequential is None:
            return list(range(len(self.plan.units)))
        return list(self.plan.sequential.look_units(self.looks(found, where)))

    def rule(self, d: np.ndarray) -> SequentialDecision:
        """The stopping rule on the paired differences `d` (candidate − reference, in the rule's unit order) of the
        looks so far; "Running" while it has not stopped."""
        return sequential_rule(self.contract, self.plan, d, difference_range(self.scorer))

    def stop(self, d: np.ndarray, where: str) -> SequentialDecision:
        """The stopping rule on the differences of the looks a run recorded, which must stop exactly where the
        records end (`EvidenceError` naming `where` otherwise)."""
        return sequential_stop(self.contract, self.plan, d, where, difference_range(self.scorer))

    def measurements(self, store: RunStore, bound: BoundEvidence, losses: Mapping[Role, np.ndarray], *,
                     large_step: float = DEFAULT_LARGE_STEP) -> NumericalComparison:
        """Every reached unit's pairing-layout responses compared, with the measurements of a plan /3 run (teacher
        forcing, captures streamed from `store`) on the units they cover (`invar.compare.measured`). `losses` are
        `losses(bound.found)`. `EvidenceError` for measurements that cannot be compared."""
        plan, contract = self.plan, self.contract
        # A sequential run holds the units of the looks it reached, in the rule's order (it has no measurements, which
        # index every planned unit); any other run holds every planned unit.
        used = self.reached_units(bound.found, str(store.path))
        outputs: dict[Role, list[Response]] = {}
        texts: dict[Role, list[str | None]] = {}
        for role in ROLES:
            outs = layout_outputs(plan, bound.found, role, plan.pairing_layout, units=used)
            outputs[role] = [Response(o.tokens, o.logprobs, o.finish_reason) for o in outs]
            texts[role] = [self.tokenizers[role].decode(o.tokens.tolist()) for o in outs]
        # The comparison counts 0/1 losses; losses in a wider range are summarised by the decision's task loss only.
        binary = losses["reference"].dtype.kind == "i"
        shown: dict[Role, list[int | None]] = {
            role: [int(losses[role][i]) if binary else None for i in used] for role in ROLES}
        sources = {"mode": "use run", "run": str(store.path), "contract": contract.name, "plan_version": plan.version,
                   "reference": {"label": f"{contract.name} reference ({_label(contract.reference)})"},
                   "candidate": {"label": f"{contract.name} candidate ({_label(contract.candidate)})"},
                   "measurements": None if plan.measure is None else plan.measure.model_dump(mode="json")}
        try:
            return measured_comparison(
                store, [plan.units[i].unit_id for i in used], [plan.units[i].prompt for i in used], outputs,
                [bound.measured[m.key] for m in plan.measurements],
                teacher_forcing=plan.measure is None or plan.measure.teacher_forcing,
                texts=texts, losses=shown, large_step=large_step, sources=sources)
        except InputError as exc:
            raise EvidenceError(f"{store.path}: measurements: {exc}") from None


def _narrow(tokens: np.ndarray) -> np.ndarray:
    """`tokens` (int[T]) in the narrowest unsigned type that holds every one of them exactly (a run's responses are
    held until scored: a small vocabulary's in a byte each), else as they are (an id out of any vocabulary included,
    which scoring refuses)."""
    if tokens.size and tokens.min() >= 0:
        top = int(tokens.max())
        if top < 1 << 8:
            return tokens.astype(np.uint8)
        if top < 1 << 16:
            return tokens.astype(np.uint16)
    return tokens


@dataclass(frozen=True)
class _Responses:
    """A bound pairing call's responses, to be scored: every output's tokens in one array, split at `starts`."""

    planned: PlannedCall
    name: str
    """The record's name, for a refusal."""
    tokens: np.ndarray
    starts: np.ndarray


@dataclass(frozen=True)
class Scored:
    """A run's records bound and scored in one pass (`RunReader.read_scored`)."""

    bound: BoundEvidence
    losses: dict[Role, np.ndarray]
    """Each package's task loss per planned unit, as `RunReader.losses` gives them."""
    digests: dict[str, np.ndarray]
    """Per invariance layout, the candidate's `output_digest` per planned unit (uint8[units, 32])."""
    verification: Verification
    """The store's verification, from the same pass."""


def _label(package: Package) -> str:
    parts: list[str] = [package.engine, package.dtype, package.quantization]
    if package.patches:
        parts.append("patches " + ",".join(sorted(package.patches)))
    return " ".join(parts)


__all__ = ["RunReader", "Scored"]
