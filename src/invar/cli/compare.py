"""`invar compare numerical`: where and how far a candidate's numbers part from the reference's, from the records.

Two ways in: a use run and its contract (whose plan says which calls measure what), or two `infer`/`evaluate` runs
made with the same requests and seeds, with optional `invar score` runs for teacher forcing and captures. The
computation is the core's (`invar.compare`; a use run is read under its contract by `invar.contract.compare_run`),
from verified records alone; no engine runs. This module parses, prints and writes the report.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from invar.cli.common import JsonOpt, QuietOpt, emit_model, plain
from invar.errors import InvarError

# The comparison itself (numpy, the run store) is imported when a command runs: `compare --help` needs none of it.
if TYPE_CHECKING:
    from invar.compare.numerical import Comparison, UnitResult

DEFAULT_LARGE_STEP = 0.01
"""`invar.compare.numerical.DEFAULT_LARGE_STEP`, the default --large-step (checked equal in
tests/cli/test_lazy_imports.py)."""

app = typer.Typer(
    name="compare",
    help="Compare a candidate's numbers with the reference's, from the records alone.",
    no_args_is_help=True, rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _pct(x: float) -> str:
    return f"{100 * x:.3f}"


def _positions(d: dict[str, Any], limit: int = 8) -> str:
    parts = [f"none {d['none']}"] + [f"at {k}: {v}" for k, v in list(d["positions"].items())[:limit]]
    more = len(d["positions"]) - limit
    return "; ".join(parts) + (f"; … {more} more positions" if more > 0 else "")


def _llama_block(label: str, dist: dict[str, Any], scale: float = 1.0, unit: str = "") -> list[str]:
    """A distribution in llama.cpp's layout (`Mean KLD: x ± y`, `Maximum`, percentiles, `Minimum`)."""
    def v(x: float) -> str:
        return f"{scale * x:10.6f}{unit}"

    lines = [f"Mean    {label}: {v(dist['mean'])} ± {scale * dist['stderr']:10.6f}{unit}",
             f"Maximum {label}: {v(dist['max'])}"]
    for name, value in dist["percentiles"].items():
        title = "Median " if name == "50" else f"{float(name):4.1f}%".rjust(6) + " "
        lines.append(f"{title} {label}: {v(value)}")
    lines.append(f"Minimum {label}: {v(dist['min'])}")
    return lines


def render_comparison(result: Comparison) -> str:
    """The comparison as text: the responses, the teacher forcing, the captures (llama.cpp's layout), the worst."""
    from invar.compare.report import headline

    doc = result.body().model_dump()
    g = doc["generation"]
    n = g["units"]
    title, rows = headline(result)
    lines = [f"compare numerical: {title}", *(f"{label:<26} {text}" for label, text in rows)]
    lines.append("== sampled responses (same requests, same seeds: paired, not coupled) ==")
    lines.append(f"bit-identical units        {g['identical']} / {n} ({_pct(g['fraction_identical'])} %): tokens, "
                 "log-probability bits and finish reason")
    lines.append(f"tokens identical           {g['tokens_identical']} / {n}")
    lines.append(f"log-probs bit-identical    {g['logprobs_identical_over_shared_prefix']} / "
                 f"{g['with_shared_prefix']} units that share a prefix (of {n}), over that prefix")
    lines.append(f"first divergence           {_positions(g['first_divergence'])}")
    for key, name, unit in (("max_ulp", "max ULP per unit", "ULP"), ("max_abs_delta", "max |Δ logprob| per unit",
                                                                     "nats"),
                            ("sum_delta", "Σ Δ logprob per unit", "nats")):
        d = g[key]
        if d is not None:
            lines.append(f"{name:<26} mean {_fmt(d['mean'])} ± {_fmt(d['stderr'])}, median "
                         f"{_fmt(d['percentiles']['50'])}, max {_fmt(d['max'])} (shared prefix, {unit}; "
                         f"{d['n']} units)")
    tf = doc["teacher_forcing"]
    if tf is not None:
        lines.append("== teacher forcing: the candidate scores the reference's responses ==")
        lines.append(f"units                      {tf['units']}, bit-identical at every step: {tf['identical']}")
        lines.append(f"first |Δ| > {tf['large_step']:g} nats      {_positions(tf['first_large_step'])}")
        d = tf["delta"]
        lines.append(f"Δ per step (cand − ref)    mean {_fmt(d['mean'])} ± {_fmt(d['stderr'])}, min "
                     f"{_fmt(d['min'])}, max {_fmt(d['max'])} ({d['n']} steps)")
        for row in tf["per_step"][:12]:
            lines.append(f"  step {row['step']:>3}  n {row['n']:>6}  mean {_fmt(row['mean']):>12}  mean |Δ| "
                         f"{_fmt(row['mean_abs']):>12}  max |Δ| {_fmt(row['max_abs']):>12}")
    c = doc["captures"]
    if c is not None:
        where = "along the reference's responses" if c["context"] == "reference" else \
            "along each package's own response, within the shared prefix"
        lines.append(f"== full-vocabulary captures: {c['captures']} at {c['units']} units, {where} ==")
        lines.append(f"identical captures         {c['identical']}; KL within its numerical error bound of 0 "
                     f"(both directions): {c['indistinguishable_from_0']}")
        for key, label in (("kl_ref_cand", "KLD"), ("kl_cand_ref", "KLD(cand‖ref)")):
            d = c[key]
            lines.extend(_llama_block(label if key == "kl_cand_ref" else "KLD", d))
            verdict = "indistinguishable from 0" if d["mean_indistinguishable_from_0"] else "above it"
            lines.append(f"numerical error of the mean ≤ {d['mean_bound']:.3g} (from the capture's precision): "
                         f"{verdict}")
        lines.append("KL(ref‖cand) per capture step:")
        for row in c["by_step"]:
            lines.append(f"  step {row['step']:>3}  n {row['n']:>6}  mean {_fmt(row['mean_kl_ref_cand']):>12}  max "
                         f"{_fmt(row['max_kl_ref_cand']):>12}  mean bound {row['mean_bound_ref_cand']:.3g}  within "
                         f"bound of 0 {row['indistinguishable_from_0']}  same top {row['same_top']}")
        lines.extend(_llama_block("Δp", c["delta_p"], 100.0, "%"))
        lines.append(f"RMS Δp    : {100 * c['rms_delta_p']['value']:6.3f} ± {100 * c['rms_delta_p']['stderr']:5.3f} %")
        lines.append(f"Same top p: {100 * c['same_top']['fraction']:6.3f} ± {100 * c['same_top']['stderr']:5.3f} %")
    s = doc["reference_self_consistency"]
    if s is not None:
        lines.append(f"reference self-check       its teacher-forced scores equal its sampled log-probabilities bit "
                     f"for bit on {s['identical']} of {s['units']} units")
    worst = doc["worst"]
    if worst:
        lines.append("== units that part most ==")
        for u in worst[:5]:
            kl = max((cap["kl_ref_cand"] for cap in u["captures"]), default=None)
            fd = u["first_divergence"]
            # A unit whose first token differs shares no prefix: there is no |Δ| to show, not a |Δ| of 0.
            delta = "no shared prefix" if u["shared"] == 0 else f"max |Δ| {_fmt(u['max_abs_delta'])} over " \
                f"{u['shared']} shared tokens"
            expected = "" if u["expected"] is None else f" (expected {u['expected']!r})"
            lines.append(f"{u['unit_id']}: {u['prompt']!r}{expected} → reference {u['reference_text']!r}, candidate "
                         f"{u['candidate_text']!r}; first divergence "
                         f"{'none' if fd is None else f'at token {fd}'}, {delta}"
                         + ("" if kl is None else f", max KL {_fmt(kl)}"))
    return "\n".join(lines)


def _label(desc: dict[str, Any]) -> str:
    parts = [str(desc.get("engine")), str(desc.get("dtype")), str(desc.get("quantization"))]
    if desc.get("patches"):
        parts.append("patches " + ",".join(sorted(desc["patches"])))
    return f"{desc.get('run')} ({' '.join(parts)})"


@app.command("numerical")
def numerical(
    runs: Annotated[list[Path], typer.Argument(help="A use run (with --contract), or REF_RUN CAND_RUN: two infer or "
                                                    "evaluate runs made with the same requests and seeds.")],
    contract: Annotated[
        Path | None, typer.Option("--contract", help="The use run's contract; default: the one the run names.")
    ] = None,
    cand_scores: Annotated[
        Path | None, typer.Option("--cand-scores", help="An invar score run of REF_RUN's responses by the "
                                                       "candidate: teacher forcing (and its captures).")
    ] = None,
    ref_scores: Annotated[
        Path | None, typer.Option("--ref-scores", help="An invar score run of REF_RUN's responses by the "
                                                      "reference: its captures, for KL.")
    ] = None,
    large_step: Annotated[
        float, typer.Option("--large-step", help="|Δ| in nats above which a teacher-forced step counts as large.")
    ] = DEFAULT_LARGE_STEP,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write a self-contained HTML report here (and PNGs beside it).")
    ] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Where the candidate's tokens first part from the reference's, whether the bits agree before that, how the
    candidate scores the reference's responses, and how far the full next-token distributions are apart."""
    from invar.compare.numerical import InputError, compare

    if not large_step > 0:
        raise InvarError(f"--large-step {large_step}: must be a positive number of nats")
    if len(runs) not in (1, 2):
        raise InvarError(f"give one use run, or REF_RUN CAND_RUN; got {len(runs)} runs")
    if len(runs) == 2 and contract is not None:
        raise InvarError("--contract goes with one use run; two runs are compared by their records alone")
    if len(runs) == 1 and (cand_scores is not None or ref_scores is not None):
        raise InvarError("--cand-scores and --ref-scores go with REF_RUN CAND_RUN; a use run carries its "
                         "measurements in its records")
    # Imported when the command runs: the records' readers and the contract (admission) cost a --help's start.
    from invar.cli.progress import admission_steps, reporting
    from invar.compare.runs import check_run_kind, pair_runs, read_generate_run, read_score_run
    from invar.contract.compare_run import compare_use_run
    from invar.parallel import helper

    if len(runs) == 2:  # a path that is no such run is refused in one line, before any progress is shown
        for path, what, kind in ((runs[0], "REF_RUN", "generate"), (runs[1], "CAND_RUN", "generate"),
                                 (cand_scores, "--cand-scores", "score"), (ref_scores, "--ref-scores", "score")):
            if path is not None:
                check_run_kind(path, what, kind)
    rows: _RowSpill | None = None
    result: Comparison
    with reporting(quiet) as shown:
        try:
            if len(runs) == 2:
                shown.phase("reading REF_RUN (every record verified)")
                ref = read_generate_run(runs[0], "REF_RUN")
                shown.phase("reading CAND_RUN (every record verified)")
                cand = read_generate_run(runs[1], "CAND_RUN")
                if cand_scores is not None:
                    shown.phase("reading --cand-scores (every record verified)")
                cand_s = None if cand_scores is None else read_score_run(cand_scores, "--cand-scores")
                if ref_scores is not None:
                    shown.phase("reading --ref-scores (every record verified)")
                ref_s = None if ref_scores is None else read_score_run(ref_scores, "--ref-scores")
                shown.phase("comparing the numbers")
                pairs, captures = pair_runs(ref, cand, cand_s, ref_s)
                sources: dict[str, Any] = {
                    "mode": "runs",
                    "reference": {**ref.describe(), "label": _label(ref.describe())},
                    "candidate": {**cand.describe(), "label": _label(cand.describe())},
                    "cand_scores": None if cand_s is None else cand_s.describe(),
                    "ref_scores": None if ref_s is None else ref_s.describe(),
                }
                result = compare(pairs, captures, context="reference", large_step=large_step, sources=sources)
            else:
                rows = _RowSpill() if json_out else None
                with helper():  # the records checked on a second core, as by `use admit`
                    result = compare_use_run(runs[0], contract, large_step=large_step, phase=shown.phase,
                                             progress=admission_steps(shown),
                                             row=(lambda u: None) if rows is None else rows.add)
        except InputError as exc:
            raise InvarError(str(exc)) from None
        if report is not None:
            from invar.compare.report import write_report

            shown.phase("writing the report")
            written = write_report(result, report)
            result.sources["report"] = [str(p) for p in written]
    if json_out:
        from invar.compare.numerical import NumericalComparison

        if isinstance(result, NumericalComparison):
            emit_model(result.output(), exclude_unset=True)
            return
        assert rows is not None
        rows.emit(result.output().model_dump(exclude_unset=True))
        return
    typer.echo(render_comparison(result))
    if report is not None:
        typer.echo(f"report     {report} (+ {len(result.sources['report']) - 1} PNGs beside it)")


class _RowSpill:
    """A use run's per-unit rows of `compare numerical --json`, each the unit's `UnitComparison` (`output()`),
    written as its JSON text to a temporary file as the unit is compared, then printed in place of the report's
    `units`: the same bytes as the whole report printed at once, without holding every row."""

    def __init__(self) -> None:
        import tempfile

        # Open while the units stream past, closed by `emit` (or with the process): no one block holds both.
        self._file = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        self._count = 0

    def add(self, unit: UnitResult) -> None:
        row = unit.output().model_dump(exclude_unset=True)
        # As `emit_json` writes an item of a list that is a value of the top map: two levels in.
        text = json.dumps(plain(row), indent=2, sort_keys=True, allow_nan=False).replace("\n", "\n    ")
        self._file.write(("    " if self._count == 0 else ",\n    ") + text)
        self._count += 1

    def emit(self, head: dict[str, Any]) -> None:
        """Print `head` (the report less its rows) with the rows written so far as its `units`."""
        import secrets

        mark = f"units-{secrets.token_hex(16)}"
        text = json.dumps(plain({**head, "units": mark}), indent=2, sort_keys=True, allow_nan=False) + "\n"
        before, found, after = text.partition(json.dumps(mark))
        assert found
        assert json.dumps(mark) not in after
        out = sys.stdout
        out.write(before)
        if self._count == 0:
            out.write("[]")
        else:
            out.write("[\n")
            self._file.seek(0)
            shutil.copyfileobj(self._file, out)
            out.write("\n  ]")
        out.write(after)
        self._file.close()


@app.command("histories")
def histories(
    run_a: Annotated[Path, typer.Argument(help="A training run (invar train --run).")],
    run_b: Annotated[Path, typer.Argument(help="A training run of the same configuration, scheduled differently.")],
    json_out: JsonOpt = False,
) -> None:
    """Whether two training runs that scheduled their work differently published the same checkpoints, bit for bit,
    from the same consumed rollouts, cycle by cycle; where not, the first cycle and tensor that differ and which
    schedule knob differs. Exit 0 identical, 10 differ, 2 refused (configurations that differ in more than the
    schedule, records that do not verify)."""
    from invar.compare.histories import compare_histories, render

    result = compare_histories(run_a, run_b)
    if json_out:
        emit_model(result.output(), exclude_unset=True)
    else:
        typer.echo(render(result))
    raise typer.Exit(result.exit_code)
