"""`invar use plan --plot FILE`: power against n per bound method, with the contract's n and the target power, so
"how many units do I need" reads off the picture. Drawn with matplotlib (Agg: no display), imported only here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from invar.errors import InvarError
from invar.stats.planning import PowerCurve


def draw_power(curves: Sequence[PowerCurve], *, target: float, contract_n: int, contract_method: str | None,
               assumption: str, out: Path) -> None:
    """Write the power curves to `out` (PNG): one line per method, its planned n marked, the target power and the
    contract's n as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.2), dpi=110)
    for c in curves:
        mine = c.method == contract_method
        line, = ax.plot(c.n, c.power, marker=".", linewidth=2.4 if mine else 1.4,
                        label=f"{c.method}: n = {c.required_n:,}" + (" (the contract's method)" if mine else ""))
        ax.plot([c.required_n], [c.power[c.n.index(c.required_n)]], marker="o", color=line.get_color())
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target power {target:g}")
    ax.axvline(contract_n, color="black", linestyle=":", linewidth=1.2, label=f"the contract's n = {contract_n:,}")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("units n (log scale)")
    ax.set_ylabel("P(admit) when the assumption holds")
    ax.set_title(f"Power against n: {assumption}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the curves, not over them
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # No timestamp or software tag: the same plan draws the same bytes.
        fig.savefig(out, format="png", metadata={"Software": None})
    except OSError as exc:
        raise InvarError(f"--plot {out}: cannot write the plot ({exc.strerror or exc}); choose another path") from None
    finally:
        plt.close(fig)


__all__ = ["draw_power"]
