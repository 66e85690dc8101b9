"""`invar train`: run the training loop of a configuration, keep every record, resume a stopped run.

The loop lives in `invar.runner.train` (cycles, checks, publication, resume); this module parses options, shows
progress and prints.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invar.cli.common import JsonOpt, QuietOpt, emit_model, resumable
from invar.cli.options import DEFAULT_CALL_TIMEOUT, CallTimeoutOpt
from invar.cli.train_fields import FIELDS

# The configuration, the training loop, the runner and the progress display are imported when the command runs; its
# help reads only the configuration's fields, from their table (`invar.cli.train_fields`).
if TYPE_CHECKING:
    from invar.cli.progress import Reporter
    from invar.runner.train import Progress


def train(
    config: Annotated[Path, typer.Argument(help="The training configuration (TOML); see configs/.")],
    run: Annotated[
        Path | None, typer.Option("--run", help="Run directory; an existing run of this configuration is resumed. "
                                                "Default: a fresh runs/train-<name>-<time>.")
    ] = None,
    call_timeout: CallTimeoutOpt = DEFAULT_CALL_TIMEOUT,
    ray: Annotated[
        str | None, typer.Option("--ray", metavar="HOST:PORT",
                                 help="Place the inference workers as actors on the Ray cluster whose head is at "
                                      "this address (the learner and every record stay here).")
    ] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    from invar.cli.progress import reporting
    from invar.loop.config import read_config
    from invar.runner.engine import default_run_dir
    from invar.runner.options import check_sampling
    from invar.runner.train import train as run_training

    check_sampling(temperature=0.0, top_p=1.0, max_tokens=1, call_timeout=call_timeout)
    run_dir = run if run is not None else default_run_dir(f"train-{read_config(config).name}")
    with resumable(run_dir, f"invar train {config}"), reporting(quiet) as shown:
        outcome = run_training(config, run_dir, call_timeout=call_timeout, progress=_progress(shown), ray=ray)
    if outcome.signal is not None:  # on stderr with the other lines about the command itself, in both modes
        print(f"invar: {outcome.signal} came while the last cycle was under way; it finished, and the run is "
              "complete", file=sys.stderr)
    ck = outcome.checkpoint
    if json_out:
        from invar.cli.outputs import TrainCheckpoint, TrainOutput  # the models cost a start that prints text nothing

        emit_model(TrainOutput(
            run=str(outcome.run), config=str(outcome.config), config_digest=outcome.config_digest,
            chain_head=outcome.head, cycles=outcome.cycles, cycles_reused=outcome.cycles_reused,
            cycles_run=0 if outcome.already_closed else outcome.cycles - outcome.cycles_reused,
            checkpoint=None if ck is None else TrainCheckpoint(cycle=ck.cycle, path=str(ck.path), digest=ck.digest),
            wall_s=round(outcome.wall_s, 3), already_closed=outcome.already_closed, signal=outcome.signal,
            history=f"invar inspect history {outcome.run}"))
        return
    if outcome.already_closed:
        typer.echo(f"{run_dir}: the run is already complete; nothing to do")
    else:
        kept = f", {outcome.cycles_reused} kept from before" if outcome.cycles_reused else ""
        typer.echo(f"trained {outcome.cycles - outcome.cycles_reused} of {outcome.cycles} cycles{kept} in "
                   f"{outcome.wall_s:.1f} s; records: {run_dir}")
    if ck is not None:
        typer.echo(f"checkpoint of cycle {ck.cycle}: {ck.path} (digest {ck.digest})")
    typer.echo(f"chain head {outcome.head} (keep it: it anchors these records)")
    typer.echo(f"history: invar inspect history {run_dir}")


def _help() -> str:
    lines = ["Run the training loop the core owns: every cycle samples G responses per prompt from the published "
             "checkpoint, the core scores them and computes advantages, the learner takes one step, the core "
             "recomputes the objective and checks the checkpoint, then publishes it. Ends with the run's chain head.",
             "Configuration fields (TOML; paths relative to the file; docs/training.md explains each):"]
    for name, default, doc in FIELDS:
        lines.append(f"{name} = {default}: {doc}")
    return "\n\n".join(lines)


train.__doc__ = _help()


_DOING = {"generate": "generating", "learn": "learning", "publish": "checking and publishing"}


def _progress(shown: Reporter) -> Callable[[Progress], None]:
    """The training loop's phases as shown: the workers' start, then each cycle's phase, with the last published
    cycle's reward and gap."""
    last = [""]

    def show(p: Progress) -> None:
        if p.reward is not None:
            last[0] = f"; cycle {p.cycle} reward {p.reward:.3f}, gap max {p.gap_max:.2g}"
        if p.phase == "start":
            shown.phase("starting the inference and learner workers and loading the model")
        elif p.phase in _DOING:
            shown.phase(f"{_DOING[p.phase]} (cycle {p.cycle + 1} of {p.cycles}{last[0]})")

    return show
