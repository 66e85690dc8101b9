"""`invar use`: prepare a use contract, plan the sample it needs, and decide admission from a run.

Exit codes of `invar use admit`: 0 Admitted, 10 Violated, 11 Unknown; 2 when the evidence is refused or the
input is bad (an `InvarError`, printed as one line by the application).
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from invar.cli.common import ExpectHeadOpt, JsonOpt, QuietOpt, emit_model, resumable
from invar.cli.options import DEFAULT_CALL_TIMEOUT, CallTimeoutOpt, ConfidenceOpt, PatchOpt, SettingOpt
from invar.cli.use_init import init_cmd
from invar.engines import Engine, parse_launch_settings
from invar.errors import ContractError, InvarError

# Each command imports the contract model, the statistics and the output models it uses when it runs: a command's
# --help (and the family's start) then reads none of them (tests/cli/test_version.py).
if TYPE_CHECKING:
    from invar.cli.progress import Reporter
    from invar.contract.plan import PlannedCall
    from invar.contract.sample_size import SampleSizePlan
    from invar.runner.use_run import Progress
    from invar.stats.planning import Assumed, PlanRow

app = typer.Typer(
    name="use",
    help="Use contracts: build one from a declaration, plan its sample size, decide admission from a run.",
    no_args_is_help=True, rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command("init")(init_cmd)  # first in the help: a declaration comes before every other use command

ContractOpt = Annotated[
    Path, typer.Option("--contract", help="The owner's contract file (<name>.contract.json): the anchors.")
]
ContractArg = Annotated[Path, typer.Argument(help="The contract file (<name>.contract.json).")]


@app.command("prepare")
def prepare_cmd(
    declaration: Annotated[Path, typer.Argument(help="The owner's declaration (TOML).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for the contract; default: the declaration's folder.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a declaration and write <name>.contract.json and its .sha256; print the sha256.

    A declaration with an [imported] table names two evaluation exports instead of packages (docs/ci.md): each
    export is read, paired and pinned by its digest."""
    from invar.cli import outputs
    from invar.contract.prepare import prepare
    from invar.imported import is_imported_declaration

    if is_imported_declaration(declaration):
        prepare_imported_cmd(declaration, out, json_out)
        return
    prepared = prepare(declaration, out)
    plan = prepared.plan
    if json_out:
        emit_model(outputs.UsePrepareOutput(
            contract=str(prepared.path), sha256=prepared.sha256, units=len(plan.units),
            calls=[outputs.PreparedCall(call=c.key, purposes=list(c.purposes), batches=len(c.batches))
                   for c in plan.calls],
            measurements=len(plan.measurements), plan_version=plan.version,
            sequential=None if plan.sequential is None else plan.sequential.output()))
        return
    typer.echo(f"{prepared.sha256}  {prepared.path}")
    typer.echo(f"plan {plan.version}: {len(plan.units)} units, {len(plan.calls)} generate calls")
    groups: dict[str, list[PlannedCall]] = {}
    for c in plan.calls:
        groups.setdefault(f"{c.package}/{c.layout}" + ("" if c.run == 1 else f"@{c.run}"), []).append(c)
    for name, calls in groups.items():
        typer.echo(f"  {name:<28} {len(calls):>5} call{'s' if len(calls) > 1 else ' '} "
                   f"{sum(len(c.batches) for c in calls):>6} batches  ({', '.join(calls[0].purposes)})")
    if plan.sequential is not None:
        seq = plan.sequential
        typer.echo(f"  sequential                   {len(seq.boundaries):>5} looks  ({seq.version}: stops at the first "
                   f"look that decides, at n_max = {seq.n_max:,} at the latest)")
    if plan.measurements and plan.measure is not None:
        units = sum(len(m.units) for m in plan.measurements if m.package == "reference")
        what = "teacher forcing of the reference's responses" if plan.measure.teacher_forcing else \
            "each package's own responses"
        steps = ", ".join(str(x) for x in plan.measure.capture_steps) or "none"
        typer.echo(f"  measurements                 {len(plan.measurements):>5} score calls on {units} units "
                   f"({what}; captures at steps {steps})")


def prepare_imported_cmd(declaration: Path, out: Path | None, json_out: bool) -> None:
    """`use prepare` of a declaration with [imported]: pin each export and print the contract's digest."""
    from invar.cli import outputs
    from invar.cli.imported import render_prepared
    from invar.imported import prepare_imported

    pinned = prepare_imported(declaration, out)
    if json_out:
        emit_model(outputs.UsePrepareImportedOutput(
            contract=str(pinned.path), sha256=pinned.sha256, format=pinned.contract.source.format,
            exports={role: outputs.PinnedExportOutput(path=e.path, sha256=e.sha256, items=e.items)
                     for role, e in pinned.contract.exports.items()}))
        return
    typer.echo(render_prepared(pinned))


# A name starts where no letter precedes it: a long run of letters with no `=` is then one failed try, not one
# per letter (quadratic; `--assume xxx…` of 100 000 letters took minutes).
_ASSUMPTION = re.compile(r"(?<![a-z_])([a-z_]+)=([^\s,]+)")
_ASSUMPTION_KEYS = {"worse": "p_worse", "better": "p_better", "variance": "variance", "mean": "mean"}
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_assumptions(values: list[str]) -> dict[str, float]:
    """`["worse=0.01 better=0.01"]` or `["worse=0.01", "better=0.01"]` → {"p_worse": 0.01, "p_better": 0.01}.

    Names: worse, better (0/1 losses: probability a unit gets worse / better), or variance and mean (of d); each
    once, its value a decimal number (never nan, inf, 1_0 or hex).
    """
    out: dict[str, float] = {}
    given: dict[str, str] = {}
    for value in values:
        text = value.replace(",", " ").strip()
        if not text or _ASSUMPTION.sub("", text).strip():
            raise InvarError(f"--assume {value!r}: write name=value pairs, e.g. worse=0.01 better=0.01")
        for name, number in _ASSUMPTION.findall(text):
            if name not in _ASSUMPTION_KEYS:
                raise InvarError(f"--assume: {name!r} is not an assumption; use {', '.join(_ASSUMPTION_KEYS)}")
            if name in given:
                raise InvarError(f"--assume {name} is given twice ({name}={given[name]}, then {name}={number}); "
                                 "state each assumption once")
            given[name] = number
            if not _DECIMAL.fullmatch(number) or not math.isfinite(float(number)):  # 1e999 is inf
                raise InvarError(f"--assume {name}={number}: {number!r} is not a number; write a decimal such as "
                                 "0.01")
            out[_ASSUMPTION_KEYS[name]] = float(number)
    return out


@app.command("plan")
def plan_cmd(
    contract: ContractArg,
    assume: Annotated[
        list[str],
        typer.Option("--assume", help="Assumed distribution of the paired differences: 'worse=0.01 better=0.01' "
                                      "(0/1 losses) or 'variance=0.02 mean=0'."),
    ],
    power: Annotated[float, typer.Option("--power", help="Probability of admitting when the assumption holds.")] = 0.8,
    method: Annotated[
        list[str] | None, typer.Option("--method", help="Plan only these bound methods (default: every method).")
    ] = None,
    sequential_max: Annotated[
        int | None, typer.Option("--sequential-max", min=1, help="Also plan sequential admission stopping at most "
                                 "at this n: expected and 90th-percentile stopping n (0/1 losses).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw power against n per method into this PNG, with the "
                                               "contract's n and the target power.")
    ] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """The sample size each bound method needs to admit under stated assumptions, at a stated power."""
    from invar.imported import is_imported_contract

    stated = parse_assumptions(assume)
    if is_imported_contract(contract):  # the items its exports pair stand for the units a run would have
        from invar.imported.plan import plan_imported

        plan = plan_imported(contract, stated, power, method or None)
    else:
        from invar.contract.sample_size import plan_sample_size
        from invar.parallel import forked

        with forked(), _planning_progress(quiet) as planned:  # the methods, and the pieces of each, on every core
            plan = plan_sample_size(contract, stated, power, method or None, sequential_max=sequential_max,
                                    plot=plot, progress=planned)
    got = plan.output
    if plot is not None and plan.curves is not None:
        from invar.cli.plan_plot import draw_power

        draw_power(plan.curves, target=power, contract_n=got.contract_units or 0,
                   contract_method=got.contract_method, assumption=got.rows[0].assumption if got.rows else "",
                   out=plot)
    if json_out:
        emit_model(got)
    else:
        typer.echo(render_sample_size(plan, power), nl=False)


def render_sample_size(plan: SampleSizePlan, power: float) -> str:
    """`use plan`'s lines: the methods' table, the stopping plan, and what the contract's own n does."""
    from invar.stats.planning import render_plan
    from invar.stats.sequential import render_sequential

    got, units = plan.output, plan.output.contract_units or 0
    text = render_plan(got.rows)
    if got.sequential is not None:
        text += render_sequential(got.sequential)
    own = got.contract_power
    if plan.imported:
        return text + (f"the contract decides with {got.contract_method} from {units:,} imported items"
                       + ("" if own is None else f"; at that n it admits with probability {own:.4f} under this "
                          "assumption") + "\n")
    if plan.looks is not None:
        text += (f"the contract decides sequentially with {plan.method_version}, looking after each of "
                 f"{plan.looks} pairing calls, and runs at most {units:,} units\n")
    else:
        text += f"the contract decides with {got.contract_method} and runs {units:,} units\n"
    if own is not None:
        needed = next((r.n for r in got.rows if r.method == got.contract_method), None)
        if got.underpowered:
            text += (f"warning: the contract's n is underpowered for this assumption: at {units:,} units "
                     f"{got.contract_method} admits with probability {own:.4f}, below the target {power:g}"
                     + ("" if needed is None else f"; it needs {needed:,} units") + "\n")
        else:
            text += (f"at its {units:,} units {got.contract_method} admits with probability {own:.4f} under this "
                     "assumption\n")
    if got.plot is not None:
        text += f"power curves: {got.plot}\n"
    return text


PLAN_QUIET_S = 2.0
"""Seconds `use plan` computes before it shows its progress: most plans are done sooner and print only the table."""


class _PlanningProgress:
    """`use plan`'s progress on stderr: once planning has taken PLAN_QUIET_S, the methods planned so far, each with
    its n as it is ready (a method whose assumed increase lies close to ε searches far, for minutes)."""

    def __init__(self, shown: Reporter) -> None:
        self._shown, self._lock = shown, threading.Lock()
        self._total, self._rows, self._showing = 0, 0, False
        self._simulating: str | None = None  # the sequential simulation's phase, once it has begun
        self._runs, self._simulated = 0, 0  # its runs, and how many are done
        self._timer = threading.Timer(PLAN_QUIET_S, self._begin)
        self._timer.daemon = True

    def expect(self, assumed: Assumed, methods: Sequence[str] | None) -> None:
        from invar.stats.planning import planned_methods

        self._total = len(planned_methods(assumed, methods))
        if PLAN_QUIET_S <= 0:
            self._begin()
        else:
            self._timer.start()

    def _begin(self) -> None:
        with self._lock:
            self._showing = True
            if self._simulating is not None:
                self._shown.phase(self._simulating, total=self._runs, unit="runs", done=self._simulated)
            else:
                self._shown.phase("planning the sample size", total=self._total, unit="methods", done=self._rows)

    def simulating(self, horizon: int | None, runs: int = 0) -> None:
        """The stopping-n simulation of `--sequential-max` begins: a phase of its own, counting its runs (at the
        largest n_max each run takes seconds)."""
        if horizon is None:
            return
        with self._lock:
            self._simulating = f"simulating sequential admission up to {horizon:,} units"
            self._runs, self._simulated = runs, 0
            if self._showing:
                self._shown.phase(self._simulating, total=runs, unit="runs")

    def simulated(self, runs: int) -> None:
        with self._lock:
            self._simulated = runs
            if self._showing:
                self._shown.count(runs)

    def row(self, row: PlanRow) -> None:
        with self._lock:
            self._rows += 1
            if self._showing:
                self._shown.count(self._rows, detail=f"{row.method}: {row.n:,} units")

    def stop(self) -> None:
        self._timer.cancel()


@contextlib.contextmanager
def _planning_progress(quiet: bool) -> Iterator[_PlanningProgress]:
    from invar.cli.progress import reporting

    with reporting(quiet) as shown:
        progress = _PlanningProgress(shown)
        try:
            yield progress
        finally:
            progress.stop()


def _toml_value(value: Any) -> str:
    # Imported here: `use --help` reads no module of the contract package.
    from invar.contract.declaration_toml import toml_value

    return toml_value(value, instead="the worker's identity holds it: write the contract in JSON")


@app.command("package")
def package_cmd(
    engine: Annotated[Engine, typer.Argument(help="The engine: hf, vllm or mlx.")],
    patch: PatchOpt = None,
    setting: SettingOpt = None,
    model: Annotated[
        Path | None, typer.Option("--model", help="A model folder: also print its model_dir and model_digest, and "
                                                  "the tokenizer digest the contract will fix.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Start an engine's worker once and print what a contract's package must state for it (TOML lines).

    A package's engine_version and settings must equal the worker's identity exactly, and its worker_digest the
    digest of the worker's code (the worker module and the core modules it imports); this prints them. With
    `--model`, the folder is read first (its tokenizer checked by the core), before any worker starts; then (text
    output) the worker loads it and the effective configuration it reports is printed field by field beside the
    folder's config.json: equal, premise (a field the package's settings make a premise) or refused (`use run`
    refuses it unless the package declares it in `known_premises`).
    """
    from invar.cli import outputs
    from invar.engines import worker_digest
    from invar.patches import select
    from invar.runner.engine import EngineSpec, probe_effective, probe_identity, session_premises

    folder: dict[str, str] = {}
    if model is not None:
        folder = _model_folder(model)
    settings = parse_launch_settings(engine.value, setting or [])
    patches, patch_dirs = select(patch or [], engine.value, "--patch")
    effective = None
    if model is not None and not json_out:
        identity, effective = probe_effective(engine, model, settings, patches, patch_dirs)
    else:
        identity = probe_identity(engine, settings, patches, patch_dirs)
    package = outputs.UsePackageOutput(
        engine=engine.value, engine_version=identity.engine_version,
        settings={k: v for k, v in identity.settings.items() if k != "patches"}, patches=patches or None,
        # The core's own digest of the files it started (`use run` checks the same before any worker starts).
        worker_digest=worker_digest(engine.value), model_dir=folder.get("model_dir"),
        model_digest=folder.get("model_digest"), tokenizer_digest=folder.get("tokenizer_digest"))
    if json_out:
        emit_model(package, exclude_none=True)  # patches and the model's fields are absent when not asked for
        return
    # The same fields as TOML lines, in the model's order, less the digest that is no declaration field.
    for name, value in package.model_dump(exclude_none=True, exclude={"tokenizer_digest"}).items():
        typer.echo(f"{name} = {_toml_value(value)}")
    if folder:
        # Not a declaration field: `use prepare` computes it from the folder and fixes it in the contract.
        typer.echo(f"# tokenizer_digest {folder['tokenizer_digest']} (fixed in the contract by use prepare)")
    if model is not None and effective is not None:
        from invar.formats.model_config import comparison, folder_config, read_config, show_value

        premises = session_premises(EngineSpec(engine, model, settings=settings))
        rows = comparison(folder_config(read_config(model)), effective, premises)
        typer.echo(f"# effective configuration: the folder's config.json | what the {engine.value} engine computes")
        for name, want, got, verdict in rows:
            shown = "-" if verdict == "not reported" else show_value(got)
            typer.echo(f"#   {name:<16} {show_value(want)} | {shown}  {verdict}")
        for name in (row[0] for row in rows if row[3] == "refused"):
            typer.echo(f"# use run refuses {name} unless the package declares it: known_premises = "
                       f"[{{field = \"{name}\", why = \"...\"}}]")


def _model_folder(model: Path) -> dict[str, str]:
    """What a package states about its model folder, after the core has read the folder's tokenizer."""
    from invar import canonical
    from invar.formats.tokenizer import ModelTokenizer, tokenizer_digest

    if not (model / "config.json").is_file():
        raise ContractError(f"--model {model}: no config.json there; name a model folder (config.json, weights and "
                            "tokenizer files)")
    ModelTokenizer.from_model_dir(model)
    return {"model_dir": str(model), "model_digest": canonical.tree_digest(model),
            "tokenizer_digest": tokenizer_digest(model)}


@app.command("run")
def run_cmd(
    contract: ContractArg,
    run: Annotated[
        Path | None, typer.Option("--run", help="Run directory; an existing run of this contract is resumed. "
                                                "Default: a fresh runs/use-<name>-<time>.")
    ] = None,
    call_timeout: CallTimeoutOpt = DEFAULT_CALL_TIMEOUT,
    workers: Annotated[
        int, typer.Option("--workers", help="Worker processes per package, at most 64 and never more than the "
                                            "package has calls left; the plan's calls are spread over them (the "
                                            "records and the decision are those of one worker).")
    ] = 1,
    ray: Annotated[
        str | None, typer.Option("--ray", metavar="HOST:PORT",
                                 help="Place the workers as actors on the Ray cluster whose head is at this address "
                                      "(every record is still kept here); a lost worker is replaced and its call "
                                      "issued again.")
    ] = None,
    calls_at_once: Annotated[
        int | None, typer.Option("--calls-at-once", metavar="N",
                                 help="At most N calls computing at once over all workers. Default: as many as "
                                      "this machine's cores hold, from what each package's engine computes on (one "
                                      "at a time where a vLLM CPU engine uses every core), otherwise one per "
                                      "worker. The calls, records and decision are the same.")
    ] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Execute a contract's plan through the packages' workers and keep every record; resume a stopped run.

    Ends with the run's chain head (keep it) and the command that decides the run.
    """
    from invar.cli import outputs
    from invar.cli.progress import reporting
    from invar.runner.engine import default_run_dir
    from invar.runner.options import check_sampling
    from invar.runner.use_run import MAX_WORKERS, admit_command, use_run

    check_sampling(temperature=0.0, top_p=1.0, max_tokens=1, call_timeout=call_timeout)
    if not 1 <= workers <= MAX_WORKERS:
        raise InvarError(f"--workers {workers}: must be ≥ 1 and at most {MAX_WORKERS} (worker processes per package; "
                         "each loads the model)")
    run_dir = run if run is not None else default_run_dir(f"use-{contract.name.removesuffix('.contract.json')}")
    with resumable(run_dir, f"invar use run {contract}"), reporting(quiet) as shown:
        show, phase = _run_progress(shown)
        outcome = use_run(contract, run_dir, call_timeout=call_timeout, progress=show, workers=workers, ray=ray,
                          phase=phase, calls_at_once=calls_at_once)
    if outcome.signal is not None:  # on stderr with the other lines about the command itself, in both modes
        print(f"invar: {outcome.signal} came while the run's last calls were under way; they were answered, and "
              "the run is complete", file=sys.stderr)
    if json_out:
        emit_model(outputs.UseRunOutput(
            run=str(outcome.run), contract=str(outcome.contract), contract_sha256=outcome.contract_sha256,
            chain_head=outcome.head, calls_total=outcome.calls_total, calls_reused=outcome.calls_reused,
            calls_issued=outcome.calls_issued, wall_s=round(outcome.wall_s, 3), already_closed=outcome.already_closed,
            sequential_stop=outcome.stop, signal=outcome.signal,
            admit=admit_command(outcome.run, outcome.contract, outcome.head)))
        return
    if outcome.already_closed:
        typer.echo(f"{run_dir}: the run is already complete; nothing to do")
    else:
        reused = f", {outcome.calls_reused} kept from before" if outcome.calls_reused else ""
        typer.echo(f"ran {outcome.calls_issued} of {outcome.calls_total} planned calls{reused} in "
                   f"{outcome.wall_s:.1f} s; records: {run_dir}")
    if outcome.stop is not None:
        typer.echo(f"sequential: the stopping rule ({outcome.stop['version']}) stopped at look {outcome.stop['look']} "
                   f"after {outcome.stop['units']:,} units ({outcome.stop['answer']}; use admit recomputes it)")
    if outcome.nonfinite is not None:
        typer.echo(f"stopped: {outcome.nonfinite.split('; ')[0]}; the run is closed there, and use admit decides it "
                   "Violated from that record")
    typer.echo(f"chain head {outcome.head} (keep it: it anchors these records)")
    typer.echo(f"decide with: {admit_command(run_dir, contract, outcome.head)}")


def _run_progress(shown: Reporter) -> tuple[Callable[[Progress], None], Callable[[str], None]]:
    """The progress and phase sinks of `use run`: the generating and measuring phases count requests, and name the
    planned calls done."""
    from invar.runner.use_run import Progress

    last = [Progress(0, 0, 0, 0)]

    def show(p: Progress) -> None:
        last[0] = p
        shown.count(p.requests_done, p.requests_total, detail=f"{p.calls_done}/{p.calls_total} calls")

    def phase(text: str) -> None:
        p = last[0]
        if text in ("generating", "measuring"):
            shown.phase(text, total=p.requests_total, unit="requests", done=p.requests_done)
        else:
            shown.phase(text)

    return show, phase


@app.command("admit")
def admit_cmd(
    contract: ContractOpt,
    run: Annotated[
        Path | None, typer.Argument(help="A run directory (holds records.sqlite); none for an imported contract.")
    ] = None,
    expect_head: ExpectHeadOpt = None,
    receipt: Annotated[
        Path | None, typer.Option("--receipt", help="Write a decision receipt (JSON) here; never overwrites.")
    ] = None,
    key: Annotated[
        Path | None, typer.Option("--key", help="Sign the receipt with this Ed25519 key (`invar keys new`).")
    ] = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Also write the decision as a JUnit XML file (one test case, "
                                                  "failed unless Admitted) for CI.")
    ] = None,
    summary: Annotated[
        Path | None, typer.Option("--summary", help="Also append a Markdown summary (headline, bound and plot) to "
                                                    "this file, e.g. \"$GITHUB_STEP_SUMMARY\".")
    ] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Decide admission of a run under the owner's contract: exit 0 Admitted, 10 Violated, 11 Unknown.

    With an imported contract (`use prepare` of a declaration with [imported]), give no run: the decision is made
    from the exports the contract pins, and says so."""
    import time

    from invar.cli import outputs
    from invar.cli.ci import append_summary, write_junit
    from invar.cli.decisions import headline, render_decision
    from invar.cli.progress import admission_steps, reporting
    from invar.contract.admit import admit
    from invar.contract.decide import EXIT_CODES
    from invar.contract.receipt import fingerprint, load_private_key, make_receipt, write_receipt
    from invar.imported import is_imported_contract

    started = time.monotonic()
    if is_imported_contract(contract):
        if run is not None:
            raise InvarError(f"{contract} decides from the exports it pins, not from a run; remove {run}")
        if receipt is not None or key is not None or expect_head is not None:
            raise InvarError("--receipt, --key and --expect-head anchor a recorded run; an imported decision has "
                             "none: remove them")
        admit_imported_cmd(contract, junit, summary, json_out, started)
    if run is None:
        from invar.contract.model import read_contract

        read_contract(contract)  # a contract that cannot be read says so first
        raise InvarError("give the run to decide: invar use admit RUN --contract CONTRACT")
    if key is not None and receipt is None:
        raise InvarError("--key signs a receipt; add --receipt PATH for the receipt to write")
    private = load_private_key(key) if key is not None else None  # a bad key fails before the long part
    from invar.parallel import helper

    # The run's records are checked in a second process on a second core while this one binds and scores them.
    with reporting(quiet) as shown, helper():
        decision = admit(contract, run, expect_head=expect_head, progress=admission_steps(shown))
        if receipt is not None:
            shown.phase("writing the receipt")
            write_receipt(receipt, make_receipt(decision, private, contract=contract))
    if junit is not None:
        write_junit(junit, headline(decision, "recorded"), time.monotonic() - started)
    if summary is not None:
        append_summary(summary, headline(decision, "recorded"))
    if json_out:
        # The decision's own model and the receipt's path; the parts a decision does not have (measurements,
        # sequential) are not set, and stay absent.
        printed = decision.output()
        emit_model(outputs.UseAdmitOutput(**{name: getattr(printed, name) for name in printed.model_fields_set},
                                          receipt=None if receipt is None else str(receipt)), exclude_unset=True)
    else:
        typer.echo(render_decision(decision))
        if receipt is not None:
            signed = "unsigned" if private is None else f"signed, key {fingerprint(private.public_key())[:16]}…"
            typer.echo(f"receipt    {receipt} (an in-toto statement in a DSSE envelope, {signed})")
    raise typer.Exit(EXIT_CODES[decision.answer])


def admit_imported_cmd(contract: Path, junit: Path | None, summary: Path | None, json_out: bool,
                       started: float) -> None:
    """`use admit` of an imported contract: decide from the exports it pins, report, exit with the answer's code."""
    import time

    from invar.cli.ci import append_summary, write_junit
    from invar.cli.decisions import headline, render_imported
    from invar.contract.decide import EXIT_CODES
    from invar.imported import admit_imported

    imported = admit_imported(contract)
    if junit is not None:
        write_junit(junit, headline(imported, "imported"), time.monotonic() - started)
    if summary is not None:
        append_summary(summary, headline(imported, "imported"))
    if json_out:
        emit_model(imported.output())
    else:
        typer.echo(render_imported(imported))
    raise typer.Exit(EXIT_CODES[imported.answer])


@app.command("summary")
def summary_cmd(
    contract: Annotated[Path, typer.Argument(help="An imported contract (`use prepare` of a declaration with "
                                                  "[imported]).")],
    confidence: ConfidenceOpt = 0.95,
    json_out: JsonOpt = False,
) -> None:
    """Summarise the two exports an imported contract pins, as `invar evaluate` reports a policy: each side's
    accuracy (or mean loss) with its interval, the paired wins, losses and ties, each export's digest and harness."""
    from invar.cli.imported import summary_imported_cmd

    summary_imported_cmd(contract, confidence, json_out)


@app.command("verify")
def verify_cmd(
    receipt: Annotated[Path, typer.Argument(help="A receipt written by `invar use admit --receipt`.")],
    run: Annotated[Path, typer.Option("--run", help="The run the receipt decided.")],
    contract: ContractOpt,
    public_key: Annotated[
        Path | None, typer.Option("--public-key", help="The issuer's public key (.pub), held independently: the "
                                                       "signature must be by it.")
    ] = None,
    trust_embedded_key: Annotated[
        bool, typer.Option("--trust-embedded-key", help="Without a key of your own: check the signature against the "
                                                        "key the receipt carries (or take an unsigned receipt), "
                                                        "which anyone could have signed.")
    ] = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Recompute a receipt's decision from the run's records, anchored at its head, and check its signature.

    Needs --public-key (the issuer's key) or --trust-embedded-key. Exit 0 when every field matches and the signature
    is valid; 2, naming what is wrong, otherwise.
    """
    from invar.cli import outputs
    from invar.cli.progress import admission_steps, reporting
    from invar.contract.receipt import verify_receipt
    from invar.parallel import helper

    with reporting(quiet) as shown, helper():  # the records checked on a second core, as by `use admit`
        check = verify_receipt(receipt, run, contract, public_key, trust_embedded_key=trust_embedded_key,
                               progress=admission_steps(shown))
    d = check.decision
    if json_out:
        emit_model(outputs.UseVerifyOutput(
            verified=True, answer=d.answer.value, chain_head=d.chain_head, contract_sha256=d.contract_sha256,
            signed=check.signed, key_sha256=check.key_fingerprint, key_checked=check.key_checked,
            format=check.format, trust=check.trust, warning=check.warning))
        return
    typer.echo(f"verified: {d.answer.value} under contract {d.contract_sha256[:16]}…, recomputed from {d.records} "
               f"records ending at head {d.chain_head}")
    if not check.signed:
        typer.echo(f"signature: none: {check.warning}")
    elif check.key_checked:
        typer.echo(f"signature: valid, by the key you gave ({check.key_fingerprint})")
    else:
        typer.echo(f"signature: valid for the key embedded in the receipt ({check.key_fingerprint}); {check.warning}")
