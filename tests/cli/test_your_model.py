"""The worked example of docs/your-model.md, run as written (scripts/your_model.sh): a model folder with a BPE
tokenizer and a chat template, a population of chat and plain units, the owner's scorer, from `infer` to
`use admit`; then what its records hold is checked against the core's own tokenizer and the pinned scorer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.venv_path import with_venv_bin

from invar import canonical
from invar.records import RunStore
from invar.tasks import ModelTokenizer
from invar.tasks.population import load_units

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

pytestmark = pytest.mark.engine


def test_the_worked_example_runs_from_a_model_folder_to_a_decision(tmp_path: Path) -> None:
    out = tmp_path / "your-model"
    env = {**os.environ, "PATH": with_venv_bin()}
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "your_model.sh"), str(out)], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Admitted: upper bound" in proc.stdout  # both packages answer every unit wrongly: no unit gets worse
    assert "use admit exit code 0" in proc.stdout
    assert "== 9. Anyone holding the run" in proc.stdout  # use verify recomputed the decision and checked the receipt

    tokenizer = ModelTokenizer.from_model_dir(out / "model")
    units = {u.id: u for u in load_units(out / "population.jsonl")}
    contract = json.loads((out / "your-model-bf16.contract.json").read_text())
    assert contract["scorer"]["sha256"] == canonical.file_sha256(out / "scorer.py")
    assert contract["reference"]["tokenizer_digest"] == tokenizer.digest
    with RunStore.open(out / "use-run") as store:
        store.verify()
        generates = [c for c in store.calls() if c.call.method == "generate"]
    assert len(generates) == 2
    seen = 0
    for rec in generates:
        assert rec.report is not None
        outputs = rec.report.report.result["outputs"]
        for req, o in zip(rec.call.params["requests"], outputs, strict=True):
            unit = units[req["request_id"]]
            messages = None if unit.messages is None else unit.chat()
            # The core rendered the chat template and tokenized it; the engine ran exactly those ids.
            assert req["prompt"] == tokenizer.render_prompt(prompt=unit.prompt, messages=messages)
            assert req["prompt_ids"] == tokenizer.prompt_ids(prompt=unit.prompt, messages=messages)
            assert o["prompt_tokens"].tolist() == req["prompt_ids"]
            seen += unit.messages is not None
    assert seen == 2 * 36  # the 36 chat units, under both packages

    with RunStore.open(out / "evaluate") as store:
        evaluation = store.meta()["evaluation"]
    assert evaluation["scorer"]["name"] == "scorer.py:loss"
    assert set(evaluation["by_kind"]) == {"chat", "plain"}


def test_the_example_models_script_takes_no_option_for_a_folder(tmp_path: Path) -> None:
    # `--help` once wrote a random model into a folder named --help in the working directory.
    script = str(REPO_ROOT / "scripts" / "example_model.py")
    env = {**os.environ, "PATH": with_venv_bin()}
    helped = subprocess.run(["python", script, "--help"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "python scripts/example_model.py OUT_DIR" in helped.stdout
    refused = subprocess.run(["python", script, "--out"], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "usage: python scripts/example_model.py OUT_DIR"
    assert list(tmp_path.iterdir()) == []
