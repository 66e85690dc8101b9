"""The HTML report of a numerical comparison: one self-contained file (charts inline as base64 PNGs, no script, no
link outside it), so it opens in a browser on a machine with no network, and the same charts as PNG files beside it.

It leads with a headline (what was compared, on how many units, the task-loss change and, for a use run, the
decision and its bound), then where the responses part (first divergence, counted, on a log scale), how far
(teacher-forced Δ per step, KL per capture step with its numerical error bound), the units that part most with
their prompt, expected answer and both responses, and last the full tables. The text output opens with the same
headline (`headline`).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from invar.compare.numerical import Comparison
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


def _kl_chart(result: Comparison) -> bytes | None:
    caps = result.captures
    if not caps:
        return None
    fig, ax = _figure()
    floor = 1e-18
    steps = sorted({c.step for c in caps})
    at = {s: i for i, s in enumerate(steps)}
    # Every capture as a dot at its step (spread a little sideways so equal values stay visible), the mean per step
    # as a line, and the mean numerical error bound per step: a KL below its bound is indistinguishable from 0.
    rng = np.random.default_rng(0)  # a fixed spread: the same comparison draws the same bytes
    xs = np.array([at[c.step] for c in caps], dtype=np.float64) + rng.uniform(-0.18, 0.18, len(caps))
    ax.scatter(xs, [max(c.kl_ref_cand, floor) for c in caps], s=8, alpha=0.45, color="#4f81bd",
               label="KL(ref ‖ cand) of each capture")
    groups = {s: [c for c in caps if c.step == s] for s in steps}
    ax.plot(range(len(steps)), [max(float(np.mean([c.kl_ref_cand for c in g])), floor) for g in groups.values()],
            marker="o", color="#c0504d", label="mean per step")
    ax.plot(range(len(steps)), [max(float(np.mean([c.bound_ref_cand for c in g])), floor)
                                for g in groups.values()],
            linestyle="--", color="grey", label="mean numerical error bound per step")
    ax.set_yscale("log")
    ax.set_xticks(range(len(steps)), [f"{s}\n({sum(c.indistinguishable for c in groups[s])}/{len(groups[s])})"
                                      for s in steps])
    ax.set_xlabel("capture step (captures within their bound of 0 / captures)")
    ax.set_ylabel(f"KL (nats; ≤ {floor:g} drawn at {floor:g})")
    ax.set_title("KL(ref ‖ cand) at each capture step")
    ax.legend(fontsize=7)
    return _png(fig)


def _divergence_chart(result: Comparison) -> bytes:
    return _png(divergence_figure(result))


def divergence_figure(result: Comparison) -> Any:
    """The first-divergence chart as a matplotlib figure: a bar per position where units part and one for units
    whose tokens agree, on a log scale, each labelled with its count."""
    fig, ax = _figure()
    first = result.generation().first_divergence.model_dump()  # the count of units at each position (its keys in order)
    parted = [int(k) for k in first["positions"]]
    counts = [*first["positions"].values(), first["none"]]
    labels = [str(i) for i in parted] + ["none"]
    # Log scale, each bar labelled with its count: a handful of units that part must not vanish beside the many
    # that agree.
    bars = ax.bar(range(len(labels)), counts,
                  color=["#c0504d"] * len(parted) + ["#4f81bd"])
    ax.bar_label(bars, labels=[str(c) for c in counts], fontsize=8, padding=2)
    ax.set_yscale("log")
    ax.set_ylim(0.5, max([*counts, 1]) * 4)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("index of the first differing token (none: the token sequences agree)")
    ax.set_ylabel("units (log scale)")
    ax.set_title(f"Where the sampled responses first part: {sum(counts) - counts[-1]} of {sum(counts)} units")
    return fig


def _teacher_chart(result: Comparison) -> bytes | None:
    taught = result.teacher_forcing()
    if taught is None:
        return None
    tf = taught.model_dump()
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


CHARTS: dict[str, Callable[[Comparison], bytes | None]] = {
    "first-divergence": _divergence_chart, "teacher-forcing": _teacher_chart, "kl": _kl_chart,
}
"""Chart name → how it is drawn (None when the comparison has no data for it), in the report's order."""


def _words(value: Any) -> str:
    """A source as a person reads it: a run by its label or path, a mapping as `key value` pairs; never a repr."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        for key in ("label", "run"):
            if isinstance(value.get(key), str):
                return str(value[key])
        return "; ".join(f"{k.replace('_', ' ')} {_words(v)}" for k, v in value.items() if v not in (None, [], {}))
    if isinstance(value, list | tuple):
        return ", ".join(_words(v) for v in value)
    return str(value)


def _name(doc: dict[str, Any], role: str) -> str:
    side = doc["sources"].get(role)
    return _words(side) if side is not None else role


def headline(result: Comparison) -> tuple[str, list[tuple[str, str]]]:
    """The report's title and its headline rows (label, text): what was compared, on how many units, how many are
    bit-identical and where they part, the task-loss change and, for a use run, the decision and its bound."""
    doc = result.body().model_dump()
    g, src = doc["generation"], doc["sources"]
    n = g["units"]
    title = f"{_name(doc, 'candidate')} against {_name(doc, 'reference')}"
    compared = f"{n} units, same requests and seeds on both sides"
    if src.get("mode") == "use run":
        compared += f"; use run {src.get('run')} under contract {src.get('contract')}"
    rows = [("compared", compared),
            ("identical", f"{g['identical']} of {n} units bit-identical ({100 * g['fraction_identical']:.3g} %); "
                          f"token sequences identical on {g['tokens_identical']}"),
            ("where they part", _parted(g["first_divergence"], n))]
    t = doc["task"]
    d = None if result.decision is None else result.decision.model_dump()
    if t is not None:
        change = t["candidate_loss"] - t["reference_loss"]
        rows.append(("task loss", f"reference {t['reference_loss']} → candidate {t['candidate_loss']} of "
                                  f"{t['units']} units: change {change:+d} ({change / t['units']:+.4g} per unit; "
                                  f"worse on {t['worse']}, better on {t['better']})"))
    elif d is not None and d.get("task_loss") is not None:
        tl = d["task_loss"]
        rows.append(("task loss", f"mean increase {tl['mean_difference_float']:+.4g} per unit over {tl['n']} units "
                                  f"(worse on {tl['worse']}, better on {tl['better']})"))
    if d is not None:
        rows.append(("decision", f"{d['answer'] or 'none'}: {d['reason']}"))
        b = d.get("bound")
        if b is not None:
            rows.append(("bound", f"mean loss increase in [{b['lower']:.4g}, {b['upper']:.4g}] (estimate "
                                  f"{b['estimate']:.4g}, n = {b['n']}) by {b['version']}, against ε = "
                                  f"{d['epsilon']} at δ = {d['delta']}"))
    return title, rows


def _units(k: int) -> str:
    return f"{k} unit" if k == 1 else f"{k} units"


def _parted(fd: dict[str, Any], n: int) -> str:
    parted = n - fd["none"]
    if not parted:
        return f"nowhere: every unit's two token sequences agree ({n} of {n})"
    top = sorted(fd["positions"].items(), key=lambda kv: -kv[1])[:3]
    return (f"{parted} of {n} units part; most at token " + ", ".join(f"{k} ({_units(v)})" for k, v in top)
            + f"; {fd['none']} agree to the last token")


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_words(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _dist_rows(prefix: str, d: dict[str, Any] | None) -> list[tuple[str, Any]]:
    if d is None:
        return []
    rows: list[tuple[str, Any]] = [(f"{prefix} mean ± s.e.", f"{d['mean']:.6g} ± {d['stderr']:.3g}"),
                                   (f"{prefix} max", f"{d['max']:.6g}")]
    rows += [(f"{prefix} {k} %", f"{v:.6g}") for k, v in d["percentiles"].items()]
    rows.append((f"{prefix} min", f"{d['min']:.6g}"))
    return rows


def _img(name: str, charts: dict[str, bytes]) -> str:
    data = base64.b64encode(charts[name]).decode("ascii")
    return f'<p><img alt="{name}" src="data:image/png;base64,{data}"></p>'


def _cell(value: Any) -> str:
    return f"<td><code>{html.escape(_words(value))}</code></td>"


def render_html(result: Comparison, charts: dict[str, bytes]) -> str:
    doc = result.body().model_dump()
    g = doc["generation"]
    title, rows = headline(result)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>invar compare numerical: {html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:62em;margin:2em auto;}table{border-collapse:collapse;"
             "margin:1em 0;}th,td{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%;"
             "vertical-align:top;}th{background:#f4f4f4;}code{font-size:95%;white-space:pre-wrap;}"
             "#headline table{font-size:110%;}#headline th{width:9em;}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             '<section id="headline">', _table(list(rows)), "</section>"]
    parts.append('<section id="where"><h2>Where they part</h2>')
    parts.append(f"<p>{html.escape(_parted(g['first_divergence'], g['units']))}. Same requests and seeds on both "
                 "sides: paired, but sampling is not coupled across engines; per-token numbers are compared over "
                 "the prefix both responses share.</p>")
    parts.append(_img("first-divergence", charts) if "first-divergence" in charts else "")
    parts.append("</section>")
    tf, c = doc["teacher_forcing"], doc["captures"]
    if tf is not None or c is not None:
        parts.append('<section id="how-far"><h2>How far</h2>')
        if tf is not None and "teacher-forcing" in charts:
            parts.append(f"<p>Teacher forcing: the candidate scores the reference's own responses. "
                         f"{tf['identical']} of {tf['units']} units bit-identical at every step; largest |Δ| "
                         f"{tf['abs_delta']['max']:.3g} nats; "
                         f"{_units(tf['units'] - tf['first_large_step']['none'])} with a step of |Δ| above "
                         f"{tf['large_step']:g} nats.</p>")
            parts.append(_img("teacher-forcing", charts))
        if c is not None and "kl" in charts:
            k = c["kl_ref_cand"]
            parts.append(f"<p>Full-vocabulary captures: {c['captures']} at {c['units']} units; "
                         f"{c['indistinguishable_from_0']} within their numerical error bound of 0; mean KL(ref ‖ "
                         f"cand) {k['mean']:.3g} (mean bound {k['mean_bound']:.3g}), max {k['max']:.3g} nats; same "
                         f"top token at {100 * c['same_top']['fraction']:.4g} % of captures.</p>")
            parts.append(_img("kl", charts))
            parts.append("<table><tr><th>capture step</th><th>captures</th><th>mean KL(ref‖cand)</th>"
                         "<th>max</th><th>mean error bound</th><th>within bound of 0</th><th>same top</th></tr>")
            for r in c["by_step"]:
                parts.append(f"<tr><td>{r['step']}</td><td>{r['n']}</td><td>{r['mean_kl_ref_cand']:.4g}</td>"
                             f"<td>{r['max_kl_ref_cand']:.4g}</td><td>{r['mean_bound_ref_cand']:.3g}</td>"
                             f"<td>{r['indistinguishable_from_0']}</td><td>{r['same_top']}</td></tr>")
            parts.append("</table>")
        parts.append("</section>")
    worst = doc["worst"]
    if worst:
        parts.append('<section id="worst"><h2>Units that part most</h2><table><tr><th>unit</th><th>prompt</th>'
                     "<th>expected</th><th>reference</th><th>candidate</th><th>first divergence</th>"
                     "<th>max KL(ref‖cand)</th><th>max teacher-forced |Δ|</th></tr>")
        for u in worst:
            kl = max((cap["kl_ref_cand"] for cap in u["captures"]), default=None)
            taught = u["teacher_forcing"]
            fd = u["first_divergence"]
            cells = [u["unit_id"], u["prompt"], u["expected"], u["reference_text"], u["candidate_text"],
                     "none (same tokens)" if fd is None else f"token {fd}",
                     None if kl is None else f"{kl:.6g}", None if taught is None else f"{taught['max_abs_delta']:.6g}"]
            parts.append("<tr>" + "".join(_cell(x) for x in cells) + "</tr>")
        parts.append("</table></section>")
    parts.append('<section id="tables"><h2>All figures</h2>')
    parts.append(_table([(k, v) for k, v in doc["sources"].items() if k != "report"]))
    rows2: list[tuple[str, Any]] = [
        ("units", g["units"]), ("bit-identical units", f"{g['identical']} ({100 * g['fraction_identical']:.3f} %)"),
        ("tokens identical", g["tokens_identical"]),
        ("log-probabilities bit-identical over the shared prefix", g["logprobs_identical_over_shared_prefix"]),
        ("units whose responses share a prefix", g["with_shared_prefix"]),
        ("first divergence: none", g["first_divergence"]["none"]),
    ]
    rows2 += _dist_rows("max ULP per unit", g["max_ulp"]) + _dist_rows("max |Δ logprob| per unit (nats)",
                                                                        g["max_abs_delta"])
    parts.append("<h3>Sampled responses</h3>" + _table(rows2))
    if tf is not None:
        parts.append("<h3>Teacher forcing</h3>" + _table([
            ("units", tf["units"]), ("bit-identical at every step", tf["identical"]),
            ("first |Δ| above the large-step threshold: none", tf["first_large_step"]["none"]),
            *_dist_rows("Δ (nats)", tf["delta"])]))
    if c is not None:
        parts.append("<h3>Full-vocabulary captures</h3>" + _table([
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
    parts.append("</section>")
    parts.append("<p>Computed by the core from verified records; definitions in docs/compare.md.</p></body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def write_report(result: Comparison, path: Path) -> list[Path]:
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


__all__ = ["CHARTS", "divergence_figure", "headline", "render_html", "write_report"]
