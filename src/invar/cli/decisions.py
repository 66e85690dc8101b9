"""What a use decision prints, recorded or imported alike: its lines for a person and its CI headline.

`use admit` shows both kinds of decision; the line of diagnostics they share is written once, here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from invar.cli.ci import Headline

if TYPE_CHECKING:
    from invar.contract.decide import Decision
    from invar.imported.decide import ImportedDecision
    from invar.stats.diagnostics import PairedDiagnostics, RangeDiagnostics


def diagnostics_line(g: PairedDiagnostics | RangeDiagnostics) -> str:
    """A decision's diagnostics (never deciding) on one line, recorded or imported alike."""
    from invar.stats.diagnostics import RangeDiagnostics

    if isinstance(g, RangeDiagnostics):
        return (f"diagnostic (never deciding) paired Wald {g.wald_confidence:g}: [{g.wald[0]:.6g}, "
                f"{g.wald[1]:.6g}]; Hoeffding [{g.hoeffding.lower:.6g}, {g.hoeffding.upper:.6g}]")
    return (f"diagnostic (never deciding) paired Wald {g.wald_confidence:g}: [{g.wald[0]:.6g}, "
            f"{g.wald[1]:.6g}]; exact McNemar one-sided p = {g.mcnemar_p:.4g}; Hoeffding "
            f"[{g.hoeffding.lower:.6g}, {g.hoeffding.upper:.6g}]")


def render_decision(decision: Decision) -> str:
    """The decision as a few aligned lines for a person."""
    from invar.evidence import RangeTaskLoss

    d = decision
    lines = [f"{d.answer.value}: {d.reason}",
             f"contract   {d.contract_name} (sha256 {d.contract_sha256})",
             f"run        {d.run} ({d.records} records, head {d.chain_head})",
             f"decision   {d.decision_version}, plan {d.plan_version}, standard {d.standard}, ε = {d.epsilon}"
             + ("" if d.delta is None else f", δ = {d.delta}")]
    inv = d.invariance
    if inv.required:
        state = "holds" if inv.holds else f"fails on {inv.units_differing} units ({inv.first_difference})"
        lines.append(f"invariance {state}: {inv.units} units across layouts {', '.join(inv.layouts)} "
                     "(other layouts are not covered)")
    else:
        lines.append("invariance not required by the contract")
    det = d.determinism
    if det is not None:
        state = "holds" if det.holds else f"fails on {det.units_differing} units ({det.first_difference})"
        lines.append(f"determinism {state}: {det.units} units, layout {det.layout} run {det.runs} times, each later "
                     "run in a fresh worker" + ("" if det.reference_units_differing is None else
                                                f"; {det.reference_units_differing} units the reference does not "
                                                "reproduce are not counted"))
    for p in d.premises:
        lines.append(f"premise    [{p.reliance}, {'holds' if p.holds else 'NOT held'}] {p.statement} "
                     f"(party {p.party}, basis {p.basis_sha256[:16]}…)")
    t = d.task_loss
    if isinstance(t, RangeTaskLoss):
        # Sums of float losses are long exact fractions: --json has them; a person reads the floats.
        low, high = t.loss_range
        lines.append(f"task loss  n = {t.n}, losses in [{low:g}, {high:g}]: reference {float(t.reference_loss):.6g}, "
                     f"candidate {float(t.candidate_loss):.6g} (sums), worse {t.worse}, better {t.better}, mean "
                     f"increase {float(t.mean_difference):.6g} (exact fractions in --json)")
    else:
        lines.append(f"task loss  n = {t.n}: reference {t.reference_loss}, candidate {t.candidate_loss}, "
                     f"worse {t.worse}, better {t.better}, mean increase {t.mean_difference} "
                     f"= {float(t.mean_difference):.6g}")
    if d.bound is not None:
        b = d.bound
        lines.append(f"bound      {b.method} {b.version}, δ = {b.delta:.6g}: estimate {b.estimate:.6g}, "
                     f"[{b.lower:.6g}, {b.upper:.6g}]" + (" (anytime-valid, at the stopping look)"
                                                         if d.sequential is not None else ""))
    if d.sequential is not None:
        s = d.sequential
        lines.append(f"sequential {s.version} decided at look {len(s.looks)}: {s.stop:,} of n_max = {s.n_max:,} "
                     f"units used; bounds at each look: " + ", ".join(
                         f"{look.n}: [{look.lower:.3g}, {look.upper:.3g}]" for look in s.looks[-4:])
                     + (" (last four)" if len(s.looks) > 4 else ""))
    if d.diagnostics is not None:
        lines.append(diagnostics_line(d.diagnostics))
    m = d.measurements
    if m is not None:
        tf = m.teacher_forcing()
        caps = m.capture_summary()
        parts = []
        if tf is not None:
            largest = 0.0 if tf.abs_delta is None else tf.abs_delta.max
            parts.append(f"teacher forcing on {tf.units} units, {tf.identical} bit-identical at every step, "
                         f"max |Δ| {largest:.3g} nats")
        if caps is not None:
            kl = caps.kl_ref_cand
            parts.append(f"{caps.captures} captures: KL(ref‖cand) mean {kl.mean:.3g} ± {kl.stderr:.2g}, max "
                         f"{kl.max:.3g} (numerical error ≤ {kl.mean_bound:.2g} on average), same top "
                         f"{100 * caps.same_top.fraction:.2f} %")
        rule = "decides through max_kl" if d.kl is not None else "beside the decision, deciding nothing"
        lines.append(f"measure    {'; '.join(parts)} ({rule}; invar compare numerical for the rest)")
        if d.kl is not None:
            state = "holds" if d.kl.holds else ("violated" if d.kl.violated else "undecided")
            lines.append(f"max_kl     {d.kl.max_kl} nats at each of {d.kl.captures} captures: {state}"
                         + ("" if d.kl.worst is None else f" ({d.kl.worst})"))
    groups: dict[str, list[int]] = {}
    for key, seq in [*((e.key, e.record_seq) for e in d.evidence),
                     *((e.key, e.record_seq) for e in d.measurement_evidence)]:
        groups.setdefault(key.partition("#")[0], []).append(seq)
    for name, seqs in groups.items():
        where = f"record {seqs[0]}" if len(seqs) == 1 else f"{len(seqs)} calls, records {min(seqs)}–{max(seqs)}"
        lines.append(f"evidence   {name:<24} {where} (--json lists each call and report digest)")
    return "\n".join(lines)


def render_imported(d: ImportedDecision) -> str:
    """An imported decision as a few aligned lines, saying first that it was not recorded."""
    from invar.evidence import RangeTaskLoss

    lines = [f"{d.answer.value}: {d.reason}",
             f"contract   {d.contract_name} (sha256 {d.contract_sha256})",
             f"evidence   imported from {d.source_format} exports ({d.metric or 'losses'}); not recorded: no call of "
             "either side was made or checked by Invar",
             f"decision   {d.decision_version}, standard {d.standard}, ε = {d.epsilon}"
             + ("" if d.delta is None else f", δ = {d.delta}") + f", export order {d.order}"]
    for e in d.exports:
        lines.append(f"export     {e.role:<10} {e.items} items, sha256 {e.sha256} ({e.path})")
    for p in d.premises:
        lines.append(f"premise    [{p.reliance}, {'holds' if p.holds else 'NOT held'}] {p.statement} "
                     f"(party {p.party}, basis {p.basis_sha256[:16]}…)")
    t = d.task_loss
    if isinstance(t, RangeTaskLoss):
        lines.append(f"task loss  n = {t.n}, losses in [{t.loss_range[0]:g}, {t.loss_range[1]:g}]: worse {t.worse}, "
                     f"better {t.better}, mean increase {float(t.mean_difference):.6g}")
    else:
        mean = t.mean_difference
        lines.append(f"task loss  n = {t.n}: reference {t.reference_loss}, candidate {t.candidate_loss}, worse "
                     f"{t.worse}, better {t.better}, mean increase {mean} = {float(mean):.6g}")
    if d.bound is not None:
        b = d.bound
        lines.append(f"bound      {b.method} {b.version}, δ = {b.delta:.6g}: estimate {b.estimate:.6g}, "
                     f"[{b.lower:.6g}, {b.upper:.6g}]")
    if d.diagnostics is not None:
        lines.append(diagnostics_line(d.diagnostics))
    return "\n".join(lines)


def headline(d: Decision | ImportedDecision, evidence: str) -> Headline:
    """What the CI reports state of a recorded or an imported decision."""
    b = d.bound
    return Headline(name=d.contract_name, answer=d.answer.value, reason=d.reason, evidence=evidence,
                    epsilon=d.epsilon, lower=None if b is None else b.lower, upper=None if b is None else b.upper,
                    estimate=float(d.task_loss.mean_difference) if b is None else b.estimate, n=d.task_loss.n,
                    method=None if b is None else b.method, contract_sha256=d.contract_sha256)


__all__ = ["diagnostics_line", "headline", "render_decision", "render_imported"]
