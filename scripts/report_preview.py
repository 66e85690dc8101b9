"""Draw the example report docs/compare.md shows: `invar compare numerical`'s HTML report of a synthetic comparison
(500 units, a candidate that parts on some of them, teacher forcing and captures at steps 0 and 1), and a preview PNG
of the page's lead (the headline, then the charts in the report's order) for readers without a browser at hand.

    .venv/bin/python scripts/report_preview.py [--out docs/compare] [--html]

Writes OUT/example-report-preview.png (and, with --html, OUT/example-report.html with its PNGs). The numbers are
synthetic and seeded, so the same script draws the same files; the decision is the contract method's bound
(paired-binary-score at δ = 0.05) on the synthetic losses against ε = 0.01, computed by invar.stats.bounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import textwrap
from pathlib import Path

import numpy as np

from invar.compare.numerical import Capture, NumericalComparison, Response, UnitPair, compare
from invar.compare.outputs import CompareDecision
from invar.compare.report import CHARTS, headline, write_report
from invar.stats.bounds import bound
from invar.tasks.arithmetic import population

ROOT = Path(__file__).resolve().parents[1]
EOS = 0
VOCAB = 18
EPSILON, DELTA = 0.01, 0.05


def _tokens(text: str) -> np.ndarray:
    return np.array([3 + int(ch) if ch.isdigit() else 2 for ch in text] + [EOS], dtype=np.int32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = (z - np.log(np.exp(z).sum(axis=-1, keepdims=True))).astype(np.float32)
    return out


def example(units: int = 500, seed: int = 7) -> NumericalComparison:
    """A candidate like a 4-bit-weight one against a float32 reference, with seeded numbers."""
    rng = np.random.default_rng(seed)
    pairs, captures = [], []
    for p in population("eval", seed=seed, count=units, id_prefix="u"):
        answer = str(p.answer)
        ref_text = answer if rng.random() > 0.2 else str(int(answer) + int(rng.integers(1, 9)))
        cand_text = ref_text
        if rng.random() < 0.07:  # parts, mostly after the leading digit
            at = min(len(ref_text) - 1, int(rng.choice([0, 1, 1, 1, 2])))
            digit = str((int(ref_text[at]) + int(rng.integers(1, 9))) % 10) if ref_text[at].isdigit() else "1"
            cand_text = ref_text[:at] + digit + ref_text[at + 1:]
        rt, ct = _tokens(ref_text), _tokens(cand_text)
        rl = (-rng.exponential(0.05, rt.size)).astype(np.float32)
        cl = rl.copy() if cand_text == ref_text else (-rng.exponential(0.05, ct.size)).astype(np.float32)
        shared = min(rt.size, ct.size)
        cl[:shared] = (rl[:shared] + rng.normal(0, 0.01, shared)).astype(np.float32) if rng.random() < 0.9 \
            else rl[:shared]
        taught = np.minimum(rl + rng.normal(0, 0.02, rl.size), 0).astype(np.float32)
        pairs.append(UnitPair(p.id, p.prompt, Response(rt, rl, "stop"), Response(ct, cl, "stop"),
                              int(ref_text != answer), int(cand_text != answer), ref_text, cand_text, taught, rl,
                              expected=answer))
        logits = rng.normal(0, 4, (2, VOCAB))
        captures.append((Capture(p.id, (0, 1), _log_softmax(logits)),
                         Capture(p.id, (0, 1), _log_softmax(logits + rng.normal(0, 0.08, logits.shape)))))
    result = compare(pairs, iter(captures), sources={
        "mode": "example", "reference": {"label": "reference: float32 (synthetic)"},
        "candidate": {"label": "candidate: 4-bit weights (synthetic)"}})
    d = np.array([u.candidate_loss - u.reference_loss for u in result.units  # type: ignore[operator]
                  ], dtype=np.float64)
    b = bound("paired-binary-score", d, -1.0, 1.0, DELTA)
    answer = "Admitted" if b.upper <= EPSILON else "Violated" if b.lower > EPSILON else "Unknown"
    reason = (f"the bound [{b.lower:.6g}, {b.upper:.6g}] contains ε = {EPSILON}: this evidence does not decide; more "
              "units may") if answer == "Unknown" else f"bound [{b.lower:.6g}, {b.upper:.6g}] against ε = {EPSILON}"
    decision = CompareDecision(answer=answer, reason=reason, standard="population", epsilon=str(EPSILON),
                               delta=str(DELTA), bound=b.output(), task_loss=None)
    return dataclasses.replace(result, decision=decision)


def preview(result: NumericalComparison, out: Path) -> None:
    """The report's lead as one PNG: the title and headline rows as text, then each chart, in the page's order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image
    import matplotlib.pyplot as plt

    title, rows = headline(result)
    charts = [matplotlib.image.imread(io.BytesIO(png)) for draw in CHARTS.values() if (png := draw(result))]
    lines = [(label, textwrap.wrap(text, 78)) for label, text in rows]
    line_in = 0.17  # inches per line of 8-point text
    head_in = 0.5 + line_in * sum(len(w) + 0.4 for _, w in lines)
    chart_in = 3.9
    fig = plt.figure(figsize=(8.0, head_in + chart_in * len(charts)), dpi=80)
    total = head_in + chart_in * len(charts)
    fig.text(0.03, 1 - 0.15 / total, title, fontsize=12, weight="bold", va="top")
    y = 0.5
    for label, wrapped in lines:
        fig.text(0.03, 1 - y / total, label, fontsize=8, weight="bold", va="top")
        fig.text(0.22, 1 - y / total, "\n".join(wrapped), fontsize=8, va="top")
        y += line_in * (len(wrapped) + 0.4)
    for i, image in enumerate(charts):
        top = head_in + chart_in * i
        ax = fig.add_axes((0.0, 1 - (top + chart_in) / total, 1.0, chart_in / total))
        ax.imshow(image)
        ax.axis("off")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    # 256 colours are plenty for charts and text, and keep the committed picture small.
    Image.open(buf).convert("RGB").quantize(256).save(out, format="PNG", optimize=True)


def main(out: Path, *, html: bool = False) -> list[Path]:
    """Write the preview PNG into `out` (and, with `html`, the report itself with its charts beside it)."""
    result = example()
    out.mkdir(parents=True, exist_ok=True)
    written = write_report(result, out / "example-report.html") if html else []
    target = out / "example-report-preview.png"
    preview(result, target)
    return [*written, target]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compare")
    parser.add_argument("--html", action="store_true", help="also write the report (HTML and its PNGs)")
    args = parser.parse_args()
    for path in main(args.out, html=args.html):
        print(path)
