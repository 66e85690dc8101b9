"""`invar use run` of a plan /3 contract on the real Hugging Face engine: the measurements run after the sampling,
with the candidate scoring the reference's responses; admission recomputes them from the records; a run killed in
the measurement phase resumes to the same figures; `compare numerical` reads the run with its contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_use_run import write_declaration

from invar.contract.admit import admit
from invar.records import RunStore

pytestmark = pytest.mark.engine

UNITS = 16


def _invar(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("measure")
    decl = write_declaration(folder, "measured-nf4", units=UNITS, per_call=4)
    with decl.open("a", encoding="utf-8") as f:
        f.write('[measurements]\nteacher_forcing = true\ncapture_steps = [0, "last"]\n')
    out = _invar("use", "prepare", decl)
    assert out.returncode == 0, out.stderr
    assert "measurements" in out.stdout
    return folder / "measured-nf4.contract.json"


@pytest.fixture(scope="module")
def baseline(contract: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("baseline") / "run"
    out = _invar("use", "run", contract, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["calls_total"], doc["calls_issued"]) == (12 + 2 * UNITS, 12 + 2 * UNITS)  # solo: a call per unit
    return run


def _figures(run: Path, contract: Path) -> dict[str, Any]:
    d = admit(contract, run).output().model_dump(mode="json", exclude_unset=True)
    d["measurements"].pop("sources")  # names the run's folder
    return {k: d[k] for k in ("answer", "reason", "task_loss", "invariance", "measurements")}


def test_measurements_follow_the_sampling_and_are_decided_beside_it(contract: Path, baseline: Path) -> None:
    with RunStore.open(baseline) as store:
        calls = store.calls()
    methods = [c.call.method for c in calls if c.call.method in ("generate", "score")]
    assert methods.count("score") == 2 * UNITS
    # Measurements start once both packages have sampled: the candidate scores the reference's responses.
    assert methods.index("score") > max(i for i, m in enumerate(methods) if m == "generate")
    d = admit(contract, baseline)
    assert d.plan_version == "invar.plan/3"
    m = d.output().model_dump(mode="json", exclude_unset=True)["measurements"]
    assert m["teacher_forcing"]["units"] == UNITS
    assert m["reference_self_consistency"] == {"units": UNITS, "identical": UNITS}  # HF scores its own samples exactly
    assert m["teacher_forcing"]["identical"] == 0  # NF4 weights move every step
    caps = m["captures"]
    assert caps["captures"] >= 2 * UNITS - UNITS  # steps 0 and last (one step when the response is one token)
    assert caps["kl_ref_cand"]["max"] > caps["kl_ref_cand"]["max_bound"]
    out = _invar("use", "admit", baseline, "--contract", contract)
    assert out.returncode in (0, 10, 11), out.stderr
    assert "measure    teacher forcing on 16 units" in out.stdout


def test_a_run_killed_while_measuring_resumes_to_the_same_figures(contract: Path, baseline: Path,
                                                                  tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "invar.cli", "use", "run", str(contract), "--run", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    scored = 0
    while proc.poll() is None and time.monotonic() < deadline and scored < 6:
        time.sleep(0.2)
        try:
            with RunStore.open(run) as store:
                scored = sum(c.call.method == "score" and c.report is not None for c in store.calls())
        except Exception:  # the run may not exist yet, or a record is being written
            scored = 0
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    resumed = _invar("use", "run", contract, "--run", run, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["calls_reused"] >= 12 + min(scored, 6)
    assert _figures(run, contract) == _figures(baseline, contract)


def test_compare_numerical_reads_the_use_run(contract: Path, baseline: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    out = _invar("compare", "numerical", baseline, "--contract", contract, "--json", "--report", report)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["generation"]["units"] == UNITS
    decided = admit(contract, baseline).output().model_dump(mode="json", exclude_unset=True)
    assert doc["captures"] == decided["measurements"]["captures"]
    assert report.is_file()
