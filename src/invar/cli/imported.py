"""`use prepare` and `use summary` over imported evidence: what they print (a decision's lines are
`invar.cli.decisions`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from invar.imported.decide import PreparedImport
    from invar.imported.outputs import UseSummaryOutput


def render_prepared(prepared: PreparedImport) -> str:
    """`use prepare`'s lines for an imported contract: its digest, then each export pinned."""
    c = prepared.contract
    lines = [f"{prepared.sha256}  {prepared.path}",
             f"imported {c.source.format} evidence ({c.source.metric or 'losses'}, loss {c.source.loss}); no calls "
             "are planned: the scores are the exporter's"]
    for role, pinned in c.exports.items():
        lines.append(f"  {role:<10} {pinned.items:>7} items  sha256 {pinned.sha256[:16]}…  {pinned.path}")
    return "\n".join(lines)


def render_summary(m: UseSummaryOutput) -> str:
    """`use summary`: each side as `invar evaluate` reports a policy, the paired table, then the exports."""
    lines = [f"{m.contract.name}: imported {m.format} evidence ({m.metric or 'losses'}, loss {m.loss}); the "
             "scores are the exporter's, not recomputed from calls",
             f"contract   {m.contract.name} (sha256 {m.contract.sha256}); decide with invar use admit --contract"]
    for s in m.sides:
        lo, hi = s.interval
        if s.correct is not None:
            lines.append(f"{s.role:<10} accuracy {1 - s.mean_loss:.4f} ({s.correct}/{s.items}), {m.confidence:.0%} "
                         f"Clopper–Pearson interval [{lo:.4f}, {hi:.4f}]")
        else:
            assert m.loss_range is not None
            score = "" if s.mean_score is None else f", mean score {s.mean_score:.4f}"
            lines.append(f"{s.role:<10} mean loss {s.mean_loss:.4f} over {s.items} items (losses in "
                         f"[{m.loss_range[0]:g}, {m.loss_range[1]:g}]){score}, {m.confidence:.0%} betting interval "
                         f"[{lo:.4f}, {hi:.4f}]")
    p = m.paired
    ties = f"{p.ties}" if p.both_right is None else f"{p.ties} ({p.both_right} both right, {p.both_wrong} both wrong)"
    lines.append(f"paired     {p.items} items: candidate worse on {p.worse}, better on {p.better}, tied on {ties}; "
                 f"mean loss increase {p.mean_increase:.6g}")
    for e in m.exports:
        lines.append(f"export     {e.role:<10} {e.items} items, {e.exporter}, sha256 {e.sha256} ({e.path})")
    return "\n".join(lines)


def summary_imported_cmd(contract: Path, confidence: float, json_out: bool) -> None:
    """`use summary`: one line for a contract that is not imported, or a bad --confidence; else the summary."""
    import typer

    from invar.cli.common import emit_model
    from invar.errors import ContractError
    from invar.imported import is_imported_contract
    from invar.imported.summary import summarise_imported

    if not 0 < confidence < 1:
        raise ContractError(f"--confidence {confidence}: must be in (0, 1), e.g. 0.95")
    if not is_imported_contract(contract):
        from invar.contract.model import read_contract

        read_contract(contract)  # a contract that cannot be read says so first
        raise ContractError(f"{contract}: use summary describes imported evidence; summarise a run with invar "
                            "evaluate, or compare its two sides with invar compare numerical RUN --contract CONTRACT")
    summary = summarise_imported(contract, confidence)
    if json_out:
        emit_model(summary)
    else:
        typer.echo(render_summary(summary))


__all__ = ["render_prepared", "render_summary", "summary_imported_cmd"]
