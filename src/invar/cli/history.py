"""`invar inspect history RUN`: a training run's cycles, recomputed from its records (`invar.loop.history`).

Prints one table per concern (rewards and advantages; the objective, core against learner; the learner–engine gap;
the importance weights; checkpoints and wall time), or `--json`, and draws the curves per cycle with `--plot`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invar.cli.common import ExpectHeadOpt, JsonOpt, RunDir, emit_model

if TYPE_CHECKING:
    from invar.loop.history import History


def history(
    run: RunDir,
    expect_head: ExpectHeadOpt = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Draw the curves per cycle into this PNG.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per cycle: reward and accuracy, advantages, objective (core vs learner), learner–engine gap, importance
    weights, staleness, checkpoint and wall time per phase, all recomputed from the run's records."""
    from rich.console import Console  # rich, too: `inspect --help` needs none of it
    from rich.table import Table

    from invar.loop.history import CONFIDENCE, read_history  # the training loop's modules cost `inspect`'s start

    h = read_history(run, expect_head=expect_head)
    if plot is not None:
        draw(h, plot)
    if as_json:
        from invar.cli.outputs import HistoryCycle, InspectHistoryOutput  # the models cost a text-only start

        emit_model(InspectHistoryOutput(
            run=str(h.run), chain_head=h.head, closed=h.closed, config=h.config.canonical(),
            cycles=[HistoryCycle.model_validate(c, from_attributes=True) for c in h.cycles],
            plot=None if plot is None else str(plot)))
        return
    console = Console()
    state = "closed" if h.closed else "[bold yellow]INCOMPLETE[/] (no closing record: stopped, or still running)"
    console.print(f"[bold green]verified[/] {run}: {h.config.backend} training run {h.config.name!r}, "
                  f"{len(h.cycles)} of {h.config.cycles} cycles published; {state}; chain head {h.head}")
    t = Table("cycle", "reward", f"accuracy [{CONFIDENCE:.0%} interval]", "A mean ± std", "A min..max",
              "zero-var groups", title="rewards and advantages")
    for c in h.cycles:
        lo, hi = c.accuracy_interval
        t.add_row(str(c.cycle), f"{c.reward_mean:.3f}", f"{c.accuracy:.3f} [{lo:.3f}, {hi:.3f}]",
                  f"{c.advantage_mean:+.3f} ± {c.advantage_std:.3f}",
                  f"{c.advantage_min:+.2f}..{c.advantage_max:+.2f}", f"{c.zero_variance_groups}/{c.groups}")
    console.print(t)
    t = Table("cycle", "loss (core)", "loss (learner)", "|Δ|", "kl (core)", "grad norm",
              title="objective before the step: the core's recomputation against the learner's report")
    for c in h.cycles:
        t.add_row(str(c.cycle), f"{c.loss_core:+.6g}", f"{c.loss_learner:+.6g}", f"{c.loss_abs_diff:.1e}",
                  f"{c.kl_core:.3g}", f"{c.grad_norm:.3g}")
    console.print(t)
    t = Table("cycle", "tokens", "exactly equal", "p50", "p99", "max", "k3 mean", "k3 max",
              title="learner − engine log-probability of each sampled token at T (|gap| in nats)")
    for c in h.cycles:
        g = c.gap
        t.add_row(str(c.cycle), str(g.tokens), f"{g.equal} ({g.equal / g.tokens:.1%})", f"{g.p50:.2g}",
                  f"{g.p99:.2g}", f"{g.max:.2g}", f"{g.k3_mean:.2g}", f"{g.k3_max:.2g}")
    console.print(t)
    t = Table("cycle", "w min", "w mean", "w max", "w = 1 exactly", f"{h.config.objective.importance}d"
              if h.config.objective.importance != "none" else "handled", "ESS / N",
              title=f"importance weights exp(proximal − behavior), {h.config.objective.importance} at "
                    f"{h.config.objective.importance_cap}")
    for c in h.cycles:
        w = c.importance
        t.add_row(str(c.cycle), f"{w.min:.6f}", f"{w.mean:.6f}", f"{w.max:.6f}", str(w.exactly_one),
                  str(w.handled), f"{w.ess:.4f}")
    console.print(t)
    t = Table("cycle", "staleness", "sampled from", "published", "generate s", "learner s", "publish s",
              title="checkpoints and wall time per phase")
    for c in h.cycles:
        t.add_row(str(c.cycle), str(c.staleness), "base model" if c.policy is None else c.policy[:12] + "…",
                  c.checkpoint[:12] + "…",
                  *(f"{c.wall_s.get(k, float('nan')):.2f}" for k in ("generate", "learner", "publish")))
    console.print(t)
    if plot is not None:
        console.print(f"curves: {plot}")


def draw(h: History, out: Path) -> None:
    """Curves per cycle: accuracy with its interval, the objective (core and learner), the gap, the mismatch KL,
    the importance weights, and the wall time per phase."""
    import matplotlib

    from invar.loop.history import CONFIDENCE

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [c.cycle for c in h.cycles]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    ax = axes[0][0]
    ax.plot(x, [c.accuracy for c in h.cycles], marker=".", label="accuracy")
    ax.fill_between(x, [c.accuracy_interval[0] for c in h.cycles], [c.accuracy_interval[1] for c in h.cycles],
                    alpha=0.25, label=f"{CONFIDENCE:.0%} interval")
    ax.set_title("rollout accuracy (reward mean)")
    ax.legend()
    ax = axes[0][1]
    ax.plot(x, [c.loss_core for c in h.cycles], marker=".", label="core")
    ax.plot(x, [c.loss_learner for c in h.cycles], linestyle="--", label="learner")
    ax.set_title("objective before the step")
    ax.legend()
    ax = axes[0][2]
    for name in ("p50", "p99", "max"):
        ax.plot(x, [max(getattr(c.gap, name), 1e-12) for c in h.cycles], marker=".", label=f"{name} |gap|")
    ax.set_yscale("log")
    ax.set_title("learner − engine log-prob (nats; 1e-12 = equal)")
    ax.legend()
    ax = axes[1][0]
    ax.plot(x, [max(c.gap.k3_mean, 1e-16) for c in h.cycles], marker=".", label="mean")
    ax.plot(x, [max(c.gap.k3_max, 1e-16) for c in h.cycles], marker=".", label="max")
    ax.set_yscale("log")
    ax.set_title("k3 mismatch KL per token")
    ax.legend()
    ax = axes[1][1]
    ax.plot(x, [c.importance.mean for c in h.cycles], marker=".", label="w mean")
    ax.plot(x, [c.importance.ess for c in h.cycles], marker=".", label="ESS / N")
    ax.plot(x, [c.gap.equal / c.gap.tokens for c in h.cycles], marker=".", label="fraction w = 1 exactly")
    ax.set_title("importance weights")
    ax.legend()
    ax = axes[1][2]
    bottom = [0.0] * len(x)
    for k in ("generate", "learner", "publish"):
        heights = [c.wall_s.get(k, 0.0) for c in h.cycles]
        ax.bar(x, heights, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, heights, strict=True)]
    ax.set_title("wall time per phase (s)")
    ax.legend()
    for row in axes:
        for a in row:
            a.set_xlabel("cycle")
    fig.suptitle(f"{h.config.name}: {h.config.backend}, {len(h.cycles)} cycles")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
