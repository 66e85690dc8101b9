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
    population: Annotated[Path | None, typer.Option("--population", help="Where the prompts come from (JSON "
                                                                         "lines with a prompt); default: the "
                                                                         "shipped evaluation population.")] = None,
    prompts: Annotated[int, typer.Option("--prompts", help="Prompts run alone and in one batch.")] = 8,
    trials: Annotated[int, typer.Option("--trials", help="Seeded random inputs per dtype (KernelBench's 5).")] = 5,
    json_out: JsonOpt = False,
) -> None:
    """Compare a kernel with the stock op: allclose at 1e-2 and 1e-4, bit identity and ULP, on random inputs and on
    the inputs the model feeds the op alone and batched; name the first input where the two verdicts disagree."""
    from invar.engines import DEFAULT_MODEL, worker_env
    from invar.home import HOME
    from invar.patches import check_engine, patch_digest, patch_dir, read_kernel

    if prompts < 1 or trials < 1:
        raise InvarError("--prompts and --trials: give at least 1 each")
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
    import sys

    argv = [sys.executable, "-P", "-m", "invar.workers.kernel_check", "--kernel", str(folder), "--digest",
            patch_digest(folder), "--model", str(model_dir.resolve()), "--population", str(pop.resolve()),
            "--prompts", str(prompts), "--trials", str(trials)]
    done = subprocess.run(argv, env=worker_env(engine="hf"), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise InvarError(one_line(lines[-1] if lines else f"the kernel check stopped with exit {done.returncode}"))
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if json_out:
        from invar.cli.common import emit_model
        from invar.outputs import KernelCheckOutput

        # The model that generates docs/schemas/kernel-check.schema.json is the one that prints the report.
        emit_model(KernelCheckOutput.model_validate(report))
        return
    typer.echo(_text(report))


def _row(name: str, v: dict[str, Any]) -> str:
    n = v["inputs"]
    close = "  ".join(f"allclose@{t} {k}/{n}" for t, k in v["allclose"].items())
    return (f"{name:<22} {close}  bit-identical {v['bit_identical']}/{n}  max ULP {v['max_ulp']}"
            f"{'  NaN/inf ' + str(v['nonfinite']) if v['nonfinite'] else ''}")


def _text(report: dict[str, Any]) -> str:
    lines = [f"kernel check: op {report['op']} ({', '.join(report['dtypes'])}) against the stock op; model "
             f"{report['model_dir']}, {report['prompts']} prompts",
             _row("random (KernelBench)", report["random"])]
    lines += [_row(f"model inputs, {layout}", v) for layout, v in report["model"].items()]
    first = report["first_disagreement"]
    if first is None:
        lines.append("no disagreement: every model input passes what every random input passed")
    else:
        lines.append(f"first disagreement: {first['layout']} input {first['index']} (shapes {first['shapes']}) fails "
                     f"{', '.join(first['fails'])} (max ULP {first['max_ulp']}"
                     f"{', NaN/inf where the stock op is finite' if first['nonfinite'] else ''})")
    lines.append("a diagnostic, not a decision: a contract decides the kernel (docs/kernels.md)")
    return "\n".join(lines)
