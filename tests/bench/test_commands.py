"""bench/commands.py: the invar command and the plain script run the same recorded calls, and each one's time is
split into start-up, steady state and shutdown that add up to its whole."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from invar import canonical
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


def test_the_use_run_contract_declares_the_digest_of_the_model_it_is_given(tmp_path: Path) -> None:
    other = tmp_path / "other-model"  # as the larger model: not the folder the walkthrough declares
    shutil.copytree(ROOT / "models" / "tiny-arith", other)
    with (other / "generation_config.json").open("a", encoding="utf-8") as f:
        f.write("\n")
    (tmp_path / "contract").mkdir()
    contract, _, _ = load_contract(commands.use_run_contract(tmp_path / "contract", 16, other))
    assert contract.reference.model_digest == contract.candidate.model_digest == canonical.tree_digest(other)
    assert canonical.tree_digest(other) != canonical.tree_digest(ROOT / "models" / "tiny-arith")


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
        parts = ("startup", "steady", "shutdown", "whole", "whole_cpu")
        assert min(times[k] for k in parts) > 0, (who, times)
        assert times["startup"] + times["steady"] + times["shutdown"] == pytest.approx(times["whole"]), who
        assert times["peak_rss_roots_mb"] > 50, (who, times)  # the core, or the plain script, held a model or more
    # invar's core stays small; its worker holds the engine and the model (the plain HF script has no children)
    (invar,), (native,) = row["raw"]["invar"], row["raw"]["native"]
    assert invar["peak_rss_descendants_mb"] > 50
    assert invar["processes"] >= 2
    assert native["peak_rss_descendants_mb"] == 0


def test_the_vllm_use_run_contract_pairs_two_vllm_packages_that_differ_only_in_max_num_seqs(tmp_path: Path) -> None:
    model = ROOT / "models" / "tiny-arith"
    declaration = ROOT / "contracts" / "arith-vllm.toml"
    contract, _, plan = load_contract(commands.vllm_use_run_contract(tmp_path, 16, model, declaration))
    assert contract.reference.engine == contract.candidate.engine == "vllm"
    assert contract.reference.settings["max_num_seqs"] == 256
    assert contract.candidate.settings["max_num_seqs"] == 128
    assert {k: v for k, v in contract.reference.settings.items() if k != "max_num_seqs"} == {
        k: v for k, v in contract.candidate.settings.items() if k != "max_num_seqs"}
    assert contract.reference.model_digest == canonical.tree_digest(model)
    assert len(plan.units) == 16


@pytest.mark.engine
def test_use_run_against_its_two_plain_scripts_in_turn(tmp_path: Path) -> None:
    out = tmp_path / "commands.json"
    assert commands.main(["--engines", "hf", "--commands", "use-run", "--reps", "1", "--units", "16",
                          "--native-scripts", "in-turn", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"]["hf use-run"]
    assert len(row["calls"]) == 2  # the two packages' workers, each with its plain script
    (native,) = row["raw"]["native"]
    assert native["startup"] + native["steady"] + native["shutdown"] == pytest.approx(native["whole"])
    # In turn, never more than one script at a time (together, the two would run at once: two processes).
    assert native["processes"] == 1
