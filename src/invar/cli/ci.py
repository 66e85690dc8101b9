"""What `use admit` leaves for a CI system besides its exit status: a JUnit XML file and a GitHub job summary.

Decision: one test case per decision, named by the contract; Admitted passes, Violated and Unknown are failures
whose text holds the bound and ε (Unknown is not a pass: the evidence did not establish the requirement, and its exit
status 11 fails the job too). The file follows the Ant/Jenkins JUnit schema that CI systems read (a `testsuite` root
with `properties`, `system-out` and `system-err`). The job summary is Markdown: the headline and a text plot of the
bound against ε, which renders in any summary without an image host.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from invar.errors import InvarError


@dataclass(frozen=True)
class Headline:
    """What a CI report states of one decision."""

    name: str
    """The contract's name: the test case."""
    answer: str
    reason: str
    evidence: str
    """`recorded` (a run Invar made) or `imported` (scores another harness exported)."""
    epsilon: Decimal
    lower: float | None
    upper: float | None
    estimate: float
    n: int
    method: str | None
    contract_sha256: str


def junit_xml(h: Headline, seconds: float) -> bytes:
    """The JUnit XML of one decision: a suite of one test case, failed unless Admitted."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    failed = h.answer != "Admitted"
    suite = ET.Element("testsuite", {
        "name": "invar.use.admit", "timestamp": now, "hostname": socket.gethostname() or "localhost",
        "tests": "1", "failures": "1" if failed else "0", "errors": "0", "skipped": "0", "time": f"{seconds:.3f}"})
    props = ET.SubElement(suite, "properties")
    for name, value in (("contract_sha256", h.contract_sha256), ("evidence", h.evidence), ("epsilon", str(h.epsilon)),
                        ("method", h.method or "none"), ("n", str(h.n))):
        ET.SubElement(props, "property", {"name": name, "value": value})
    case = ET.SubElement(suite, "testcase", {"name": h.name, "classname": f"invar.use.admit.{h.evidence}",
                                             "time": f"{seconds:.3f}"})
    if failed:
        failure = ET.SubElement(case, "failure", {"message": f"{h.answer}: {h.reason}", "type": h.answer})
        failure.text = _bound_text(h)
    ET.SubElement(suite, "system-out").text = f"{h.answer}: {h.reason}\n{_bound_text(h)}\n"
    ET.SubElement(suite, "system-err").text = ""
    body: bytes = ET.tostring(suite, encoding="unicode").encode("utf-8")
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + body + b"\n"


def _bound_text(h: Headline) -> str:
    if h.lower is None or h.upper is None:
        return f"mean loss increase {h.estimate:.6g} over {h.n} items; ε = {h.epsilon} (finite domain, no bound)"
    return (f"bound [{h.lower:.6g}, {h.upper:.6g}] on the mean loss increase ({h.method}, n = {h.n}, estimate "
            f"{h.estimate:.6g}); ε = {h.epsilon}")


PLOT_WIDTH = 60
"""Characters across the summary's plot."""


def text_plot(h: Headline) -> str:
    """The bound as a bar on a line from the lowest to the highest of (0, lower, ε, upper): `[===]` the bound, `|`
    ε, `0` zero, `*` the estimate."""
    eps = float(h.epsilon)
    lower = h.estimate if h.lower is None else h.lower
    upper = h.estimate if h.upper is None else h.upper
    left, right = min(0.0, lower, eps), max(0.0, upper, eps)
    span = (right - left) or 1.0

    def at(x: float) -> int:
        return round((x - left) / span * (PLOT_WIDTH - 1))

    row = [" "] * PLOT_WIDTH
    for i in range(at(lower), at(upper) + 1):
        row[i] = "="
    row[at(lower)], row[at(upper)] = "[", "]"
    row[at(h.estimate)] = "*"
    row[at(0.0)] = "0" if row[at(0.0)] == " " else row[at(0.0)]
    row[at(eps)] = "|"
    return (f"{''.join(row)}\n{left:<+.4g}{'':^{PLOT_WIDTH - 20}}{right:>+.4g}\n"
            f"[=] bound {lower:.4g} to {upper:.4g}   * estimate {h.estimate:.4g}   | ε = {h.epsilon}   0 zero")


def summary_markdown(h: Headline) -> str:
    """The job summary: the headline, the numbers, and the plot."""
    mark = {"Admitted": "✅", "Violated": "❌"}.get(h.answer, "⚠️")
    source = "scores imported from the exports (the exporter's word, not recomputed from calls)" \
        if h.evidence == "imported" else "recomputed from the run's records"
    bound = "none (finite domain)" if h.lower is None else f"[{h.lower:.6g}, {h.upper:.6g}]"
    return (f"### {mark} `{h.name}`: {h.answer}\n\n{h.reason}\n\n"
            f"| evidence | n | method | bound on the mean loss increase | ε |\n|---|---|---|---|---|\n"
            f"| {source} | {h.n} | {h.method or 'none'} | {bound} | {h.epsilon} |\n\n"
            f"```text\n{text_plot(h)}\n```\n\ncontract sha256 `{h.contract_sha256}`\n\n")


def write_junit(path: Path, h: Headline, seconds: float) -> None:
    """Write the JUnit file whole (a temporary file renamed into place), so a CI system never reads half of one."""
    data = junit_xml(h, seconds)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".junit-", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise InvarError(f"--junit {path}: cannot write it ({exc.strerror or exc}); choose a writable path") from None


def append_summary(path: Path, h: Headline) -> None:
    """Append the summary to `path` (GitHub gives each step one file, `$GITHUB_STEP_SUMMARY`, to append to)."""
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(summary_markdown(h))
    except OSError as exc:
        raise InvarError(f"--summary {path}: cannot append to it ({exc.strerror or exc}); choose a writable path") \
            from None


__all__ = ["Headline", "append_summary", "junit_xml", "summary_markdown", "text_plot", "write_junit"]
