"""`invar compare numerical REF_RUN CAND_RUN`: figures known in advance from runs written with chosen numbers, and
every refusal one line with exit 2. The commands run in one process (`cli`), none starts an engine worker."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import headless
import numpy as np
import pytest
from compare_builders import Scored, capture, generate_run, score_run, units
from scipy.special import rel_entr
from support.cli_batch import InvarSession, Ran


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines, run one after another in one process (tests/support/cli_batch.py: each as
    `python -m invar.cli` runs it, its own exit status, stdout and stderr), so the module pays the CLI's start-up
    once instead of once per command."""
    with InvarSession(bound_s=300) as session:
        yield session


def _json(cli: InvarSession, *args: str | Path) -> dict[str, Any]:
    out = cli.run("compare", "numerical", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _one_line_refusal(out: Ran, *phrases: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    for phrase in phrases:
        assert phrase in out.stderr, out.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A reference run, an identical candidate, a candidate that differs, and score runs of the reference's
    responses by each side, with captures at steps 0 and 1."""
    root = tmp_path_factory.mktemp("compare")
    ref_units = units(8)
    cand_units = units(8, {2: "7"})  # unit 2 answers "7": tokens part at step 0 (or later)
    for u, c in zip(ref_units, cand_units, strict=True):
        if len(c.tokens) == len(u.tokens):
            c.logprobs = u.lp().copy()
    moved = cand_units[5].logprobs
    assert moved is not None
    moved[0] = np.nextafter(moved[0], np.float32(0))  # one ulp on unit 5, step 0
    out = {"ref": generate_run(root / "ref", ref_units), "same": generate_run(root / "same", units(8)),
           "cand": generate_run(root / "cand", cand_units)}
    ref_caps = [capture(i, 2) for i in range(8)]
    cand_caps = [c.copy() for c in ref_caps]
    cand_caps[3] = capture(100, 2)  # unit 3's captures: another distribution
    out["ref_scores"] = score_run(root / "ref_scores", [Scored(u, u.lp(), [0, 1], ref_caps[i])
                                                        for i, u in enumerate(ref_units)], out["ref"])
    taught = [u.lp().copy() for u in ref_units]
    taught[4][1] -= np.float32(0.5)
    out["cand_scores"] = score_run(root / "cand_scores", [Scored(u, taught[i], [0, 1], cand_caps[i])
                                                          for i, u in enumerate(ref_units)], out["ref"])
    out["self_scores"] = score_run(root / "self_scores", [Scored(u, u.lp(), [0, 1], ref_caps[i])
                                                          for i, u in enumerate(ref_units)], out["ref"])
    return out


def test_a_run_against_an_identical_one_is_identical_everywhere_with_kl_zero(cli: InvarSession,
                                                                             runs: dict[str, Path]) -> None:
    doc = _json(cli, runs["ref"], runs["same"], "--cand-scores", runs["self_scores"], "--ref-scores",
                runs["ref_scores"])
    g = doc["generation"]
    assert (g["units"], g["identical"], g["fraction_identical"]) == (8, 8, 1.0)
    assert g["first_divergence"] == {"none": 8, "positions": {}}
    tf = doc["teacher_forcing"]
    assert (tf["units"], tf["identical"]) == (8, 8)
    assert tf["delta"]["max"] == tf["delta"]["min"] == 0.0
    c = doc["captures"]
    assert (c["captures"], c["identical"], c["indistinguishable_from_0"]) == (16, 16, 16)
    assert c["kl_ref_cand"]["max"] == c["kl_cand_ref"]["max"] == 0.0
    assert (c["same_top"]["fraction"], c["rms_delta_p"]["value"]) == (1.0, 0.0)
    assert doc["reference_self_consistency"] == {"units": 8, "identical": 8}


def test_a_candidate_that_differs_is_located_and_measured(cli: InvarSession, runs: dict[str, Path]) -> None:
    doc = _json(cli, runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"], "--ref-scores",
                runs["ref_scores"])
    by_id = {u["unit_id"]: u for u in doc["units"]}
    ids = list(by_id)
    g = doc["generation"]
    assert (g["identical"], g["tokens_identical"]) == (6, 7)
    u2 = by_id[ids[2]]
    assert u2["first_divergence"] is not None
    assert u2["candidate_text"] == "7"
    assert (u2["reference_loss"], u2["candidate_loss"]) == (0, 1)
    u5 = by_id[ids[5]]
    assert (u5["first_divergence"], u5["logprobs_identical"], u5["max_ulp"]) == (None, False, 1)
    assert doc["task"] == {"units": 8, "reference_loss": 0, "candidate_loss": 1, "worse": 1, "better": 0}
    tf = by_id[ids[4]]["teacher_forcing"]
    assert tf["first_large_step"] == 1
    assert tf["deltas"][1] == pytest.approx(-0.5)
    assert doc["teacher_forcing"]["identical"] == 7
    # Unit 3: KL of the two known captures, as scipy computes it.
    ref_cap, cand_cap = capture(3, 2), capture(100, 2)
    for step in (0, 1):
        p = np.exp(ref_cap[step].astype(np.float64))
        q = np.exp(cand_cap[step].astype(np.float64))
        got = by_id[ids[3]]["captures"][step]
        assert got["kl_ref_cand"] == pytest.approx(float(rel_entr(p / p.sum(), q / q.sum()).sum()), rel=1e-9)
        assert got["kl_cand_ref"] == pytest.approx(float(rel_entr(q / q.sum(), p / p.sum()).sum()), rel=1e-9)
        assert not got["indistinguishable_from_0"]
    assert doc["captures"]["identical"] == 14
    assert doc["worst"][0]["unit_id"] == ids[3]  # the largest KL first


def test_the_report_is_self_contained_html_with_pngs(cli: InvarSession, runs: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "out.html"
    out = cli.run("compare", "numerical", runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"],
                  "--ref-scores", runs["ref_scores"], "--report", report)
    assert out.returncode == 0, out.stderr
    html = report.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert "http://" not in html  # nothing is fetched
    assert "https://" not in html
    assert html.count("data:image/png;base64,") >= 3
    pngs = sorted(p.name for p in tmp_path.glob("out-*.png"))
    assert pngs == ["out-first-divergence.png", "out-kl.png", "out-teacher-forcing.png"]
    for name in pngs:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Outline(HTMLParser):
    """The report's skeleton: its headings and sections in order, and its text outside the inline images."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []
        self.text: list[str] = []
        self._heading: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.order.append(f"section#{dict(attrs).get('id')}")
        if tag in ("h1", "h2"):
            self._heading = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._heading:
            self._heading = None

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self.order.append(f"{self._heading}:{data}")
        self.text.append(data)


def test_the_report_leads_with_a_headline_then_where_how_far_worst_and_tables(cli: InvarSession, runs: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    report = tmp_path / "out.html"
    out = cli.run("compare", "numerical", runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"],
                  "--ref-scores", runs["ref_scores"], "--report", report)
    assert out.returncode == 0, out.stderr
    outline = _Outline()
    outline.feed(report.read_text(encoding="utf-8"))
    assert outline.order == [f"h1:{runs['cand']} (hf float32 none) against {runs['ref']} (hf float32 none)",
                             "section#headline", "section#where", "h2:Where they part", "section#how-far",
                             "h2:How far", "section#worst", "h2:Units that part most", "section#tables",
                             "h2:All figures"]
    text = " ".join(outline.text)
    head = text[:text.index("Where they part")]
    assert "8 units" in head
    assert "6 of 8 units bit-identical" in head
    assert "reference 0 → candidate 1 of 8 units: change +1" in head  # the task-loss change
    assert "1 of 8 units part; most at token 1 (1 unit)" in head
    # No Python reprs anywhere: sources in words, a unit that does not part says so.
    assert "None" not in text
    assert "{'" not in text
    assert "none (same tokens)" in text
    worst = text[text.index("Units that part most"):text.index("All figures")]
    assert "42+37=" in worst  # unit 2: prompt, expected answer, both responses
    assert "79 79 7 token 1" in " ".join(worst.split())
    # The percentile tables come last, after every chart.
    assert text.index("max ULP per unit 99.9 %") > text.index("Units that part most")


def test_the_report_renders_in_headless_chromium(cli: InvarSession, runs: dict[str, Path], tmp_path: Path) -> None:
    """The report as a reader's browser draws it: the page is screenshotted, and the picture holds the headline's
    text near its top and the charts' colours below; skipped, naming why, where no Chromium can be had."""
    report = tmp_path / "out.html"
    out = cli.run("compare", "numerical", runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"],
                  "--ref-scores", runs["ref_scores"], "--report", report)
    assert out.returncode == 0, out.stderr
    pixels = headless.screenshot(report, tmp_path / "screenshot.png", width=1100, height=2400)
    assert pixels.shape == (2400, 1100, 3)
    assert float(np.std(pixels)) > 0.05  # not one flat colour
    assert headless.colours(pixels) >= 20
    assert headless.drawn_fraction(pixels) > 0.03  # not an empty white page
    top = pixels[:300]  # the title and the headline's table
    assert headless.drawn_fraction(top) > 0.01
    assert headless.saturated(pixels) > 2000  # the charts' bars and lines are drawn in colour


def test_the_first_divergence_chart_counts_every_bar_on_a_log_scale(runs: dict[str, Path]) -> None:
    from invar.compare.numerical import compare
    from invar.compare.report import divergence_figure
    from invar.compare.runs import pair_runs, read_generate_run

    pairs, _ = pair_runs(read_generate_run(runs["ref"], "REF_RUN"), read_generate_run(runs["cand"], "CAND_RUN"))
    fig = divergence_figure(compare(pairs))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"  # a handful of units that part stays visible beside the many that agree
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "none"]
    assert [t.get_text() for t in ax.texts] == ["1", "7"]  # each bar's count written on it


def test_the_text_output_labels_units_and_shows_kl_per_capture_step(cli: InvarSession, runs: dict[str, Path]) -> None:
    out = cli.run("compare", "numerical", runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"],
                  "--ref-scores", runs["ref_scores"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"compare numerical: {runs['cand']} (hf float32 none) against {runs['ref']} (hf float32 none)"
    assert lines[4].startswith("task loss ")
    assert "change +1" in lines[4]
    ulp = next(line for line in lines if line.startswith("max ULP per unit"))
    assert "ULP;" in ulp
    assert "nats" not in ulp  # a count of float32 steps, not a size in nats
    doc = _json(cli, runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"], "--ref-scores",
                runs["ref_scores"])
    at = lines.index("KL(ref‖cand) per capture step:")
    for line, row in zip(lines[at + 1:at + 3], doc["captures"]["by_step"], strict=True):
        assert line.split()[:8] == ["step", str(row["step"]), "n", str(row["n"]), "mean",
                                    f"{row['mean_kl_ref_cand']:.6g}", "max", f"{row['max_kl_ref_cand']:.6g}"]
        assert f"within bound of 0 {row['indistinguishable_from_0']}" in line
    assert [r["indistinguishable_from_0"] for r in doc["captures"]["by_step"]] == [7, 7]  # unit 3's two captures
    assert doc["decision"] is None  # two runs: no contract, no decision


def test_a_unit_whose_first_token_differs_has_no_shared_prefix_not_a_delta_of_0(cli: InvarSession,
                                                                                tmp_path: Path) -> None:
    ref_units = units(4)
    first = ref_units[1].text[0]
    cand_units = units(4, {1: str((int(first) + 1) % 10)})
    ref, cand = generate_run(tmp_path / "ref", ref_units), generate_run(tmp_path / "cand", cand_units)
    doc = _json(cli, ref, cand)
    row = next(u for u in doc["units"] if u["unit_id"] == ref_units[1].unit_id)
    assert (row["first_divergence"], row["shared"], row["expected"]) == (0, 0, ref_units[1].text)
    out = cli.run("compare", "numerical", ref, cand)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith(ref_units[1].unit_id))
    assert "first divergence at token 0, no shared prefix" in line
    assert "max |Δ|" not in line


def test_comparing_two_runs_shows_each_part_on_stderr_and_quiet_shows_none(cli: InvarSession, runs: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    args = ("compare", "numerical", runs["ref"], runs["cand"], "--cand-scores", runs["cand_scores"], "--json",
            "--report", tmp_path / "r.html")
    shown = cli.run(*args)
    quiet = cli.run(*args[:-1], tmp_path / "q.html", "--quiet")
    assert shown.returncode == quiet.returncode == 0, shown.stderr
    lines = [re.fullmatch(r"invar: (.+)… \d+\.\d s", line) for line in shown.stderr.splitlines()]
    assert all(lines), shown.stderr
    assert [m[1] for m in lines if m is not None] == [
        "reading REF_RUN (every record verified)", "reading CAND_RUN (every record verified)",
        "reading --cand-scores (every record verified)", "comparing the numbers", "writing the report"]
    assert quiet.stderr == ""
    first, second = json.loads(shown.stdout), json.loads(quiet.stdout)
    first["sources"].pop("report"), second["sources"].pop("report")
    assert first == second


def test_runs_with_other_requests_or_seeds_are_one_line(cli: InvarSession,
                                                        runs: dict[str, Path], tmp_path: Path) -> None:
    other = units(8)
    other[6].seed += 1
    out = cli.run("compare", "numerical", "--quiet", runs["ref"], generate_run(tmp_path / "seeds", other))
    _one_line_refusal(out, "different requests", "seed")
    out = cli.run("compare", "numerical", "--quiet", runs["ref"], generate_run(tmp_path / "fewer", units(6)))
    _one_line_refusal(out, "different requests", "in REF_RUN only")


def test_a_run_whose_records_fail_verification_is_one_line(cli: InvarSession,
                                                           runs: dict[str, Path], tmp_path: Path) -> None:
    bad = generate_run(tmp_path / "bad", units(8))
    conn = sqlite3.connect(bad / "records.sqlite")
    conn.execute("DROP TRIGGER log_no_update")
    seq, body = conn.execute("SELECT seq, body FROM log WHERE kind = 'report' ORDER BY seq DESC LIMIT 1").fetchone()
    conn.execute("UPDATE log SET body = ? WHERE seq = ?", (body[:-1] + bytes([body[-1] ^ 1]), seq))
    conn.commit()
    conn.close()
    # The message names the run that failed (the candidate here), not only the record (issue 27).
    _one_line_refusal(cli.run("compare", "numerical", "--quiet", runs["ref"], bad), f"CAND_RUN {bad}: record {seq}",
                      "altered")
    _one_line_refusal(cli.run("compare", "numerical", "--quiet", bad, runs["ref"]), f"REF_RUN {bad}: record {seq}",
                      "altered")


def test_a_capture_of_another_vocabulary_size_is_one_line(cli: InvarSession,
                                                          runs: dict[str, Path], tmp_path: Path) -> None:
    ref_units = units(8)
    wide = [Scored(u, u.lp(), [0], np.zeros((1, 30), np.float32) - np.log(np.float32(30))) for u in ref_units]
    scores = score_run(tmp_path / "wide", wide, runs["ref"])
    out = cli.run("compare", "numerical", "--quiet", runs["ref"], runs["same"], "--cand-scores", scores, "--ref-scores",
                  runs["ref_scores"])
    _one_line_refusal(out, "vocabulary of 18 tokens", "30")


def test_a_step_beyond_a_responses_end_is_one_line(cli: InvarSession, runs: dict[str, Path], tmp_path: Path) -> None:
    ref_units = units(8)
    far = [Scored(u, u.lp(), [9], capture(i, 1)) for i, u in enumerate(ref_units)]
    scores = score_run(tmp_path / "far", far, runs["ref"])
    out = cli.run("compare", "numerical", "--quiet", runs["ref"], runs["same"], "--cand-scores", scores)
    _one_line_refusal(out, "step 9 is beyond the response's end")
    # invar score refuses such a step before any worker starts.
    out = cli.run("score", "--from-run", runs["ref"], "--capture-steps", "0,9", "--run", tmp_path / "never")
    _one_line_refusal(out, "step 9 is beyond the response's end")
    assert not (tmp_path / "never").exists()


def test_scores_of_other_tokens_than_the_references_are_one_line(cli: InvarSession, runs: dict[str, Path]) -> None:
    out = cli.run("compare", "numerical", "--quiet", runs["cand"], runs["ref"], "--cand-scores", runs["cand_scores"])
    _one_line_refusal(out, "other tokens than REF_RUN's response")
