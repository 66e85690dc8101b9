"""bench/commands.py: the invar command and the plain script run the same recorded calls, and each one's time is
split into start-up, steady state and shutdown that add up to its whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from invar.contract.prepare import load_contract

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package

import commands  # noqa: E402


def test_the_use_run_contract_pairs_two_unpatched_hf_packages(tmp_path: Path) -> None:
    contract, _, plan = load_contract(commands.use_run_contract(tmp_path, 16, ROOT / "models" / "tiny-arith"))
    assert contract.reference.engine == contract.candidate.engine == "hf"
    assert not contract.candidate.patches
    assert contract.reference.settings["attn_implementation"] == "sdpa"
    assert contract.candidate.settings["attn_implementation"] == "eager"
    assert len(plan.units) == 16


@pytest.mark.engine
def test_evaluate_against_its_plain_script(tmp_path: Path) -> None:
    out = tmp_path / "commands.json"
    assert commands.main(["--engines", "hf", "--commands", "evaluate", "--reps", "1", "--count", "64",
                          "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"]["hf evaluate"]
    assert row["requests"] == 64
    assert row["calls"] == {"worker 0": 1}
    assert row["whole_cpu_ratio"]["median"] > 0  # each whole's CPU time was counted (also below: every time > 0)
    for who in ("invar", "native"):
        (times,) = row["raw"][who]
        assert min(times.values()) > 0, (who, times)
        assert times["startup"] + times["steady"] + times["shutdown"] == pytest.approx(times["whole"]), who
