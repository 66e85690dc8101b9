"""`use prepare` and `use admit` over imported evidence: pin the exports, pair them, decide.

Decision: the answer comes from the same rules as a recorded decision (`invar.contract.decide.bound_answer` for the
population standard, `decide`'s finite-domain rule; the same bound methods; the same sequential rule), on losses the
exporter computed; nothing here recomputes a score. So
the decision's premises always begin with one per export: the scores in that file (named by its sha256) are the
exporter's word, read by Invar and not recomputed from calls. An imported decision states `evidence: imported`
and names no run, records or chain head, so it can never be presented as a recorded one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

from invar import canonical
from invar.contract.decide import Answer, PremiseCheck, bound_answer, conservative_delta
from invar.contract.model import Premise
from invar.contract.outputs import DecisionContract
from invar.contract.prepare import method_version, output_folder, relative_path, write_contract
from invar.errors import ContractError, EvidenceError
from invar.evidence import RangeTaskLoss, TaskLoss, paired_range_task_loss, paired_task_loss, within_epsilon
from invar.imported.exports import Export, Paired, pair, read_bytes, read_exports
from invar.imported.model import ImportedContract, PinnedExport, read_import_declaration, read_imported_contract
from invar.imported.outputs import ExportEvidenceOutput, UseAdmitImportedOutput
from invar.stats.bounds import Bound, StatisticsError, bound
from invar.stats.diagnostics import PairedDiagnostics, RangeDiagnostics, paired_diagnostics, range_diagnostics
from invar.stats.sequential import SequentialDecision, sequential_decision

IMPORTED_DECISION_VERSION = "invar.admit-imported/1"
"""Names the procedure below; the bound method and its version are reported beside it."""


@dataclass(frozen=True)
class PreparedImport:
    """What `use prepare` wrote for an imported declaration."""

    contract: ImportedContract
    sha256: str
    path: Path
    digest_path: Path


def prepare_imported(declaration_path: str | os.PathLike[str],
                     out_dir: str | os.PathLike[str] | None = None) -> PreparedImport:
    """Validate an imported declaration, read and pair its exports (so a defect is found now, not at admission), and
    write `<name>.contract.json` and its `.sha256` with every export pinned by digest and item count."""
    decl_path = Path(declaration_path)
    decl = read_import_declaration(decl_path)
    out = output_folder(out_dir, decl_path)
    files = {}
    for role, f in decl.imported.files().items():
        path = decl_path.parent / f.path
        data = read_bytes(path)
        sha = canonical.sha256(data)
        if f.sha256 is not None and f.sha256 != sha:
            raise ContractError(f"imported.{role}.sha256: {path} has sha256 {sha}, not the declared {f.sha256}; "
                                "point the declaration at the file it means")
        files[role] = (path, data, sha)
    exports = read_exports(decl.imported, files)
    pair(exports["reference"], exports["candidate"])  # refused now, naming the item, rather than at admission
    counts = {"reference": len(exports["reference"].items), "candidate": len(exports["candidate"].items),
              "table": len(exports["reference"].items)}
    pinned = {role: PinnedExport(path=relative_path(path, out), sha256=sha, items=counts[role])
              for role, (path, _, sha) in files.items()}
    source = decl.imported.model_copy(update={
        role: type(f)(path=pinned[role].path, sha256=pinned[role].sha256)
        for role, f in decl.imported.files().items()})
    premises = []
    for p in decl.premises:
        if p.basis_path is not None:
            basis = decl_path.parent / p.basis_path
            if not basis.is_file() or canonical.file_sha256(basis) != p.basis_sha256:
                raise ContractError(f"premises: the basis file {basis} is missing or does not hash to basis_sha256; "
                                    "point basis_path at the file the digest names")
            p = p.model_copy(update={"basis_path": relative_path(basis, out)})
        premises.append(p)
    method = decl.requirement.method
    try:
        contract = ImportedContract(
            name=decl.name, description=decl.description, source=source, exports=pinned,
            requirement=decl.requirement, method_version=None if method is None else method_version(method),
            premises=premises)
    except ValueError as exc:  # the declaration's own checks passed, so only a path past the limits lands here
        raise ContractError(f"{decl_path}: {exc}") from None
    sha, path, digest_path = write_contract(out, contract.name, contract.canonical_json())
    return PreparedImport(contract, sha, path, digest_path)


@dataclass(frozen=True)
class ImportedDecision:
    """An answer from imported evidence, with every number and premise it rests on."""

    answer: Answer
    reason: str
    contract_name: str
    contract_sha256: str
    standard: str
    epsilon: Decimal
    delta: Decimal | None
    source_format: str
    metric: str | None
    exports: tuple[ExportEvidenceOutput, ...]
    premises: tuple[PremiseCheck, ...]
    task_loss: TaskLoss | RangeTaskLoss
    bound: Bound | None
    diagnostics: PairedDiagnostics | RangeDiagnostics | None
    sequential: SequentialDecision | None
    order: str
    decision_version: str = IMPORTED_DECISION_VERSION

    @property
    def exit_code(self) -> int:
        from invar.contract.decide import EXIT_CODES

        return EXIT_CODES[self.answer]

    def output(self) -> UseAdmitImportedOutput:
        """What `use admit --json` prints of it."""
        return UseAdmitImportedOutput(
            answer=self.answer.value, exit_code=self.exit_code, reason=self.reason,
            evidence="imported", decision_version=self.decision_version,
            contract=DecisionContract(name=self.contract_name, sha256=self.contract_sha256),
            format=self.source_format, metric=self.metric, order=self.order,
            standard=self.standard, epsilon=str(self.epsilon),
            delta=None if self.delta is None else str(self.delta), exports=list(self.exports),
            premises=[p.output() for p in self.premises], task_loss=self.task_loss.output(),
            bound=None if self.bound is None else self.bound.output(),
            diagnostics=None if self.diagnostics is None else self.diagnostics.output(),
            sequential=None if self.sequential is None else self.sequential.output())


def _premises(contract: ImportedContract, base: Path, exports: dict[str, Export]) -> list[PremiseCheck]:
    """The exporter's word on each export's scores, first, then the declared premises as a recorded decision
    checks them."""
    seen: dict[str, Export] = {e.sha256: e for e in exports.values()}  # a table is one file for both sides
    checks = [PremiseCheck(
        statement=(f"the per-item scores in {e.path.name} were computed by {e.exporter}; Invar read them and did not "
                   f"recompute them from calls"),
        party=e.exporter, basis_sha256=sha, reliance="vouched", holds=True,
        note="imported evidence: relies on the exporter's word; no call of either side was recorded")
        for sha, e in seen.items()]
    for p in contract.premises:
        checks.append(_premise(p, base))
    return checks


def _premise(p: Premise, base: Path) -> PremiseCheck:
    if p.reliance == "vouched":
        return PremiseCheck(p.statement, p.party, p.basis_sha256, p.reliance, True,
                            "relies on the party's word; the core cannot check the basis")
    assert p.basis_path is not None
    path = base / p.basis_path
    if not path.is_file():
        return PremiseCheck(p.statement, p.party, p.basis_sha256, p.reliance, False, f"basis file {path} is missing")
    actual = canonical.file_sha256(path)
    holds = actual == p.basis_sha256
    note = f"basis file {path} re-hashed: " + ("matches" if holds else f"sha256 is now {actual}")
    return PremiseCheck(p.statement, p.party, p.basis_sha256, p.reliance, holds, note)


@dataclass(frozen=True)
class PinnedEvidence:
    """What an imported contract pins, read again: the contract, its digest and folder, each export re-read and
    checked against its digest, and the items paired."""

    contract: ImportedContract
    sha256: str
    base: Path
    files: dict[str, tuple[Path, bytes, str]]
    """Each pinned file by role: its path, bytes and sha256."""
    exports: dict[str, Export]
    paired: Paired

    def evidence(self, roles: Iterable[str]) -> tuple[ExportEvidenceOutput, ...]:
        """Each export in `roles`' order as a decision or a summary states it (a table stands for both sides)."""
        return tuple(ExportEvidenceOutput.model_validate({
            "role": role, "path": str(self.files[role][0]), "sha256": self.files[role][2],
            "items": len(self.exports.get(role, self.exports["reference"]).items),
            "exporter": self.exports.get(role, self.exports["reference"]).exporter}) for role in roles)


def read_pinned(contract_path: str | os.PathLike[str]) -> PinnedEvidence:
    """Read an imported contract and the exports it pins: each file re-read and checked against its digest, the
    items paired; `EvidenceError` (one line) for any defect."""
    path = Path(contract_path)
    contract, sha = read_imported_contract(path)
    base = path.parent
    files: dict[str, tuple[Path, bytes, str]] = {}
    for role, pinned in contract.exports.items():
        file = base / pinned.path
        data = read_bytes(file)
        actual = canonical.sha256(data)
        if actual != pinned.sha256:
            raise EvidenceError(f"{file}: sha256 is {actual}, not the {pinned.sha256} the contract pins; decide from "
                                "the export the contract was prepared on, or prepare a new contract")
        files[role] = (file, data, actual)
    exports = read_exports(contract.source, files)
    return PinnedEvidence(contract, sha, base, files, exports, pair(exports["reference"], exports["candidate"]))


def admit_imported(contract_path: str | os.PathLike[str]) -> ImportedDecision:
    """Decide from the exports an imported contract pins: each file re-read and checked against its digest, the
    items paired, the losses bounded by the contract's method; `EvidenceError` (one line) for any defect."""
    path = Path(contract_path)
    contract, _ = read_imported_contract(path)
    if contract.method_version is not None and contract.requirement.method is not None \
            and method_version(contract.requirement.method) != contract.method_version:
        raise ContractError(f"method_version: the contract fixes {contract.method_version}, this Invar computes "
                            f"{method_version(contract.requirement.method)}; decide with the Invar version the "
                            "contract names, or prepare a new contract")
    pinned = read_pinned(path)
    sha, base, exports, paired = pinned.sha256, pinned.base, pinned.exports, pinned.paired
    source = contract.source
    binary = source.loss_range is None
    req = contract.requirement
    if binary:
        ref = np.array(paired.reference, dtype=np.int64)
        cand = np.array(paired.candidate, dtype=np.int64)
        loss: TaskLoss | RangeTaskLoss = paired_task_loss(ref, cand)
        d = (cand - ref).astype(np.float64)
        low, high = -1.0, 1.0
    else:
        assert source.loss_range is not None
        a, b = source.loss_range
        ref_f = np.array(paired.reference, dtype=np.float64)
        cand_f = np.array(paired.candidate, dtype=np.float64)
        loss = paired_range_task_loss(ref_f, cand_f, (a, b))
        d = cand_f - ref_f
        low, high = a - b, b - a
    premises = _premises(contract, base, exports)
    task_bound: Bound | None = None
    diag: PairedDiagnostics | RangeDiagnostics | None = None
    stopped: SequentialDecision | None = None
    order = "plan" if source.order == "sampling" else "unverified"
    if req.standard == "population":
        assert req.method is not None
        assert req.delta is not None
        delta = conservative_delta(req.delta)
        try:
            if req.sequential:
                assert source.look_every is not None
                n = len(d)
                looks = [*range(source.look_every, n, source.look_every), n]
                stopped = sequential_decision(req.method, d, looks, req.epsilon, delta, n, a=low, b=high)
                final = stopped.final
                task_bound = Bound(stopped.method, stopped.version, final.n, stopped.delta,
                                   float(np.mean(d[:stopped.stop])), final.lower, final.upper)
            else:
                task_bound = bound(req.method, d, low, high, delta, order=order)
        except StatisticsError as exc:
            raise EvidenceError(f"requirement.method {req.method}: {exc}") from None
        if binary:
            diag = paired_diagnostics(loss.worse, loss.better, loss.n, delta)
        else:
            diag = range_diagnostics(d, low, high, delta)
    missing = [p for p in premises if not p.holds]
    if missing:
        answer, reason = Answer.UNKNOWN, f"premise not held as declared ({missing[0].reliance}): {missing[0].note}"
    elif stopped is not None:
        answer, reason = Answer(stopped.answer), (f"{stopped.reason}; stopped at look {len(stopped.looks)} with "
                                                  f"{stopped.stop} of {stopped.n_max} imported items")
    elif req.standard == "finite-domain":
        mean = loss.mean_difference
        answer = Answer.ADMITTED if within_epsilon(mean, req.epsilon) else Answer.VIOLATED
        relation = "≤" if answer is Answer.ADMITTED else ">"
        shown = f"{float(mean):.6g} (compared exactly)" if isinstance(loss, RangeTaskLoss) else \
            f"{mean} = {float(mean):.6g}"
        reason = (f"finite domain: mean loss increase over exactly the {loss.n} imported items is {shown} "
                  f"{relation} ε = {req.epsilon}; no claim beyond these items")
    else:
        assert task_bound is not None
        assert req.delta is not None
        answer, reason = bound_answer(task_bound, req.epsilon, req.delta)
    return ImportedDecision(
        answer=answer, reason=reason, contract_name=contract.name, contract_sha256=sha, standard=req.standard,
        epsilon=req.epsilon, delta=req.delta, source_format=source.format, metric=source.metric,
        exports=pinned.evidence(contract.exports),
        premises=tuple(premises), task_loss=loss, bound=task_bound, diagnostics=diag, sequential=stopped,
        order=source.order)


__all__ = [
    "IMPORTED_DECISION_VERSION",
    "ImportedDecision",
    "PreparedImport",
    "admit_imported",
    "prepare_imported",
]
