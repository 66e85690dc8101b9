"""The HTML report of a numerical comparison: one self-contained file (charts inline as base64 PNGs, no script, no
link outside it), so it opens in a browser on a machine with no network, and the same charts as PNG files beside it.

Charts: the distribution of KL at the captures (log scale, with the numerical error bound marked), the positions of
first divergence, and the teacher-forced Δ per step. Then the units that part most, with their prompts and both
responses as the core decoded them.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from invar.compare.numerical import NumericalComparison
from invar.errors import InvarError


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 3.6), dpi=110)
    return fig, ax


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    # No timestamp or software tag: the same comparison draws the same bytes.
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _kl_chart(result: NumericalComparison) -> bytes | None:
    caps = result.captures
    if not caps:
        return None
    fig, ax = _figure()
    floor = 1e-18
    for values, bounds, label in (([c.kl_ref_cand for c in caps], [c.bound_ref_cand for c in caps], "KL(ref ‖ cand)"),
                                  ([c.kl_cand_ref for c in caps], [c.bound_cand_ref for c in caps], "KL(cand ‖ ref)")):
        shown = np.log10(np.maximum(np.array(values, dtype=np.float64), floor))
        ax.hist(shown, bins=40, histtype="step", linewidth=1.5,
                label=f"{label}: {sum(abs(v) <= b for v, b in zip(values, bounds, strict=True))} of {len(values)} "
                      "within the error bound of 0")
    ax.axvline(math.log10(max(float(np.median([c.bound_ref_cand for c in caps])), floor)), color="grey",
               linestyle="--", label="median numerical error bound of KL(ref ‖ cand)")
    ax.set_xlabel(f"log10 KL (nats); values ≤ {floor:g} drawn at {math.log10(floor):g}")
    ax.set_ylabel("captures")
    ax.set_title("KL divergence at the capture steps")
    ax.legend(fontsize=7)
    return _png(fig)


def _divergence_chart(result: NumericalComparison) -> bytes:
    fig, ax = _figure()
    positions = [u.sequence.first_divergence for u in result.units]
    width = max((p for p in positions if p is not None), default=0) + 1
    counts = [sum(p == i for p in positions) for i in range(width)]
    labels = [str(i) for i in range(width)] + ["none"]
    ax.bar(range(width + 1), [*counts, sum(p is None for p in positions)],
           color=["#c0504d"] * width + ["#4f81bd"])
    ax.set_xticks(range(width + 1), labels)
    ax.set_xlabel("index of the first differing token (none: the whole response agrees)")
    ax.set_ylabel("units")
    ax.set_title("Where the sampled responses first part")
    return _png(fig)


def _teacher_chart(result: NumericalComparison) -> bytes | None:
    tf = result.teacher_forcing()
    if tf is None:
        return None
    from matplotlib.ticker import MaxNLocator

    fig, ax = _figure()
    steps = [r["step"] for r in tf["per_step"]]
    floor = 1e-12
    for key, label in (("mean_abs", "mean |Δ|"), ("max_abs", "max |Δ|")):
        ax.plot(steps, [max(r[key], floor) for r in tf["per_step"]], marker="o", label=label)
    ax.set_yscale("log")
    ax.axhline(tf["large_step"], color="grey", linestyle="--", label=f"large step ({tf['large_step']:g} nats)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step of the reference's response")
    ax.set_ylabel("|Δ log-prob| (nats)")
    ax.set_title(f"Teacher forcing: candidate − reference per step (0 drawn at {floor:g})")
    ax.legend(fontsize=7)
    return _png(fig)


CHARTS: dict[str, Callable[[NumericalComparison], bytes | None]] = {
    "kl": _kl_chart, "first-divergence": _divergence_chart, "teacher-forcing": _teacher_chart,
}
"""Chart name → how it is drawn (None when the comparison has no data for it)."""


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _dist_rows(prefix: str, d: dict[str, Any] | None) -> list[tuple[str, Any]]:
    if d is None:
        return []
    rows: list[tuple[str, Any]] = [(f"{prefix} mean ± s.e.", f"{d['mean']:.6g} ± {d['stderr']:.3g}"),
                                   (f"{prefix} max", f"{d['max']:.6g}")]
    rows += [(f"{prefix} {k} %", f"{v:.6g}") for k, v in d["percentiles"].items()]
    rows.append((f"{prefix} min", f"{d['min']:.6g}"))
    return rows


def render_html(result: NumericalComparison, charts: dict[str, bytes]) -> str:
    doc = result.to_json(per_unit=False)
    g = doc["generation"]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>invar compare numerical</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;}table{border-collapse:collapse;"
             "margin:1em 0;}th,td{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%;}"
             "th{background:#f4f4f4;}code{font-size:95%;}</style></head><body>",
             "<h1>Numerical comparison</h1>"]
    src = doc["sources"]
    parts.append(_table([(k, v.get("label", v) if isinstance(v, dict) else v) for k, v in src.items()
                         if k != "report"]))
    parts.append("<h2>Sampled responses</h2>")
    parts.append("<p>Same requests and seeds on both sides: paired, but sampling is not coupled across engines. "
                 "Per-token numbers are compared over the prefix both responses share.</p>")
    rows: list[tuple[str, Any]] = [
        ("units", g["units"]), ("bit-identical units", f"{g['identical']} ({100 * g['fraction_identical']:.3f} %)"),
        ("tokens identical", g["tokens_identical"]),
        ("log-probabilities bit-identical over the shared prefix", g["logprobs_identical_over_shared_prefix"]),
        ("first divergence: none", g["first_divergence"]["none"]),
    ]
    rows += _dist_rows("max ULP per unit", g["max_ulp"]) + _dist_rows("max |Δ logprob| per unit (nats)",
                                                                       g["max_abs_delta"])
    t = doc["task"]
    if t is not None:
        rows.append(("task loss (reference, candidate, worse, better)",
                     f"{t['reference_loss']}, {t['candidate_loss']}, {t['worse']}, {t['better']} of {t['units']}"))
    parts.append(_table(rows))
    for name, title in (("first-divergence", "First divergence"), ("teacher-forcing", "Teacher forcing"),
                        ("kl", "Full-vocabulary captures")):
        if name not in charts:
            continue
        parts.append(f"<h2>{title}</h2>")
        if name == "teacher-forcing":
            tf = doc["teacher_forcing"]
            parts.append(_table([("units", tf["units"]), ("bit-identical at every step", tf["identical"]),
                                 ("first |Δ| above the large-step threshold: none", tf["first_large_step"]["none"]),
                                 *_dist_rows("Δ (nats)", tf["delta"])]))
        if name == "kl":
            c = doc["captures"]
            parts.append(_table([
                ("captures", f"{c['captures']} at {c['units']} units ({c['context']} context)"),
                ("identical captures", c["identical"]),
                ("KL within its numerical error bound of 0", c["indistinguishable_from_0"]),
                *_dist_rows("KLD(ref‖cand)", c["kl_ref_cand"]),
                ("mean numerical error bound", f"{c['kl_ref_cand']['mean_bound']:.3g}"),
                *_dist_rows("KLD(cand‖ref)", c["kl_cand_ref"]),
                *_dist_rows("Δp", c["delta_p"]),
                ("RMS Δp", f"{100 * c['rms_delta_p']['value']:.4f} ± {100 * c['rms_delta_p']['stderr']:.4f} %"),
                ("same top p", f"{100 * c['same_top']['fraction']:.4f} ± {100 * c['same_top']['stderr']:.4f} %"),
            ]))
        data = base64.b64encode(charts[name]).decode("ascii")
        parts.append(f'<p><img alt="{name}" src="data:image/png;base64,{data}"></p>')
    worst = doc["worst"]
    if worst:
        parts.append("<h2>Units that part most</h2><table><tr><th>unit</th><th>prompt</th><th>reference</th>"
                     "<th>candidate</th><th>first divergence</th><th>max KL(ref‖cand)</th>"
                     "<th>max teacher-forced |Δ|</th></tr>")
        for u in worst:
            kl = max((cap["kl_ref_cand"] for cap in u["captures"]), default=None)
            tf = u["teacher_forcing"]
            cells = [u["unit_id"], u["prompt"], u["reference_text"], u["candidate_text"], u["first_divergence"],
                     "" if kl is None else f"{kl:.6g}", "" if tf is None else f"{tf['max_abs_delta']:.6g}"]
            parts.append("<tr>" + "".join(f"<td><code>{html.escape(str(c))}</code></td>" for c in cells) + "</tr>")
        parts.append("</table>")
    parts.append("<p>Computed by the core from verified records; definitions in docs/compare.md.</p></body></html>")
    return "\n".join(parts) + "\n"


def write_report(result: NumericalComparison, path: Path) -> list[Path]:
    """Write the HTML report to `path` and each chart as `<stem>-<chart>.png` beside it; returns the files."""
    charts = {name: png for name, draw in CHARTS.items() if (png := draw(result)) is not None}
    written = [path]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_html(result, charts), encoding="utf-8")
        for name, png in charts.items():
            target = path.with_name(f"{path.stem}-{name}.png")
            target.write_bytes(png)
            written.append(target)
    except OSError as exc:
        raise InvarError(f"--report {path}: cannot write the report ({exc.strerror or exc}); choose another path") \
            from None
    return written


__all__ = ["CHARTS", "render_html", "write_report"]
