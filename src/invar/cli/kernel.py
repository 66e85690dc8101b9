"""`invar kernel check`: a function kernel against the stock op, on KernelBench-style random inputs and on the
model's own inputs, side by side, with the first input where they disagree.

The comparison runs torch, so it runs in a worker process (`invar.workers.kernel_check`); this module hashes the
folder, checks its `kernel.toml` in the core, starts the process and prints what it reports. It is a diagnostic
beside the decision, never the decision: a contract decides a kernel (docs/kernels.md).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from invar.cli.common import JsonOpt
from invar.errors import InvarError, one_line

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Kernels: check one against the stock op, on random inputs and on the model's own.")


@app.command("check")
def check_cmd(
    kernel: Annotated[Path, typer.Argument(help="The kernel's folder (kernel.py + kernel.toml), anywhere.")],
    model: Annotated[Path | None, typer.Option("--model", help="The model folder whose inputs the op is checked "
                                                               "on; default: the shipped tiny model.")] = None,
    population: Annotated[Path | None, typer.Option("--population", help="Where the prompts come from (a "
                                                                         "population: units with a prompt or "
                                                                         "chat messages); default: the shipped "
                                                                         "evaluation population.")] = None,
    prompts: Annotated[int, typer.Option("--prompts", help="Prompts run alone and in one batch.")] = 8,
    trials: Annotated[int, typer.Option("--trials", help="Seeded random inputs per dtype (KernelBench's 5).")] = 5,
    steps: Annotated[int, typer.Option("--steps", help="Greedy decode steps after each prefill, through a KV "
                                                       "cache, as the engine runs them.")] = 2,
    json_out: JsonOpt = False,
) -> None:
    """Compare a kernel with the stock op: allclose at 1e-2 and 1e-4, bit identity and ULP, on random inputs, on
    the inputs the model feeds the op alone and batched, and on the same tensors called again (a kernel that
    remembers); name the first input where the verdicts disagree."""
    from invar.engines import DEFAULT_MODEL, worker_env
    from invar.formats.tokenizer import ModelTokenizer
    from invar.home import HOME
    from invar.patches import check_engine, patch_digest, patch_dir, read_kernel
    from invar.tasks.population import load_units

    if prompts < 1 or trials < 1 or steps < 0:
        raise InvarError("--prompts and --trials: give at least 1 each; --steps: 0 or more")
    folder = patch_dir(str(kernel) if "/" in str(kernel) else f"./{kernel}").resolve()
    if read_kernel(folder) is None:
        raise InvarError(f"{kernel}: no kernel.toml there; invar kernel check checks a function kernel "
                         "(docs/kernels.md)")
    check_engine(folder, "hf", str(folder))
    model_dir = model if model is not None else DEFAULT_MODEL
    pop = population if population is not None else HOME / "data" / "arith-eval.jsonl"
    for what, path, kind in (("--model", model_dir, "folder"), ("--population", pop, "file")):
        if not (path.is_dir() if kind == "folder" else path.is_file()):
            raise InvarError(f"{what} {path}: no such {kind}")
    # The prompts as use run sends them: rendered (a chat unit through the model's template) and tokenized by the
    # core, so the op sees the ids an engine is given.
    vocab = ModelTokenizer.from_model_dir(model_dir)
    ids = [vocab.unit_prompt(unit)[1] for unit in load_units(pop)[:prompts]]
    import sys

    argv = [sys.executable, "-P", "-m", "invar.workers.kernel_check", "--kernel", str(folder), "--digest",
            patch_digest(folder), "--model", str(model_dir.resolve()), "--trials", str(trials), "--steps",
            str(steps)]
    done = subprocess.run(argv, env=worker_env(engine="hf"), capture_output=True, text=True,
                          input=json.dumps(ids), check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise InvarError(one_line(lines[-1] if lines else f"the kernel check stopped with exit {done.returncode}"))
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if json_out:
        from invar.cli.common import emit_model
        from invar.cli.outputs import KernelCheckOutput

        # The model that generates docs/schemas/kernel-check.schema.json is the one that prints the report.
        emit_model(KernelCheckOutput.model_validate(report))
        return
    typer.echo(_text(report))


def _row(name: str, v: dict[str, Any]) -> str:
    n = v["inputs"]
    close = "  ".join(f"allclose@{t} {k}/{n}" for t, k in v["allclose"].items())
    return (f"{name:<22} {close}  bit-identical {v['bit_identical']}/{n}  max ULP {v['max_ulp']}"
            f"{'  NaN/inf ' + str(v['nonfinite']) if v['nonfinite'] else ''}")


def _where(first: dict[str, Any]) -> str:
    return (f"{first['layout']} input {first['index']} (shapes {first['shapes']}) fails {', '.join(first['fails'])} "
            f"(max ULP {first['max_ulp']}{', NaN/inf where the stock op is finite' if first['nonfinite'] else ''})")


def _text(report: dict[str, Any]) -> str:
    lines = [f"kernel check: op {report['op']} ({', '.join(report['dtypes'])}) against the stock op; model "
             f"{report['model_dir']}, {report['prompts']} prompts, {report['steps']} decode steps",
             _row("random (KernelBench)", report["random"])]
    lines += [_row(f"model inputs, {layout}", v) for layout, v in report["model"].items()]
    first = report["first_disagreement"]
    if first is None:
        lines.append("no disagreement: every model input passes what every random input passed")
    else:
        lines.append(f"first disagreement: {_where(first)}")
    reuse = report["reuse"]
    lines += [_row("reuse, repeated", reuse["repeated"]),
              _row("reuse, model replay", reuse["replay"]) + f"  ({reuse['weights_kept']} with the model's weights)"]
    again = reuse["first_disagreement"]
    lines.append("reuse: the same tensors called again agree with the stock op as a new call does" if again is None
                 else f"reuse: the kernel answers from an earlier call: {_where(again)}")
    lines.append("a diagnostic, not a decision: a contract decides the kernel (docs/kernels.md)")
    return "\n".join(lines)
