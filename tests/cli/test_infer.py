"""`invar infer` through the real command line and the real HF worker on the shipped model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from support.cli_batch import InvarSession

from invar.records import RunStore
from invar.tasks import ModelTokenizer

CLI_BOUND_S = 300  # seconds a command may take in the module's session (tests/cli/conftest.py)


@pytest.mark.engine
def test_infer_prints_tokens_text_logprobs_and_keeps_the_records(cli: InvarSession, tmp_path: Path,
                                                                 model: Path) -> None:
    args = ["infer", "37+58=", "123+456=", "--seed", "5", "--max-tokens", "6", "--model", str(model)]
    out = cli.run(*args, "--json", "--run", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    vocab = ModelTokenizer.from_model_dir(model)
    rows = doc["outputs"]
    assert [r["prompt"] for r in rows] == ["37+58=", "123+456="]
    assert [r["seed"] for r in rows] == [5, 6]
    for r in rows:
        assert r["text"] == vocab.decode(r["tokens"])
        assert len(r["logprobs"]) == len(r["tokens"])
        assert all(x <= 0 for x in r["logprobs"])
        assert r["finish_reason"] in ("stop", "length")

    with RunStore.open(tmp_path / "run") as store:
        store.verify()
        calls = store.calls()
        meta = store.meta()
    assert [c.call.method for c in calls] == ["load_model", "generate"]
    assert meta["run"]["command"] == "infer"
    assert meta["run"]["model_digest"] == doc["model_digest"]
    recorded = calls[1].report
    assert recorded is not None
    assert recorded.report.result is not None
    for r, o in zip(rows, recorded.report.result["outputs"], strict=True):
        assert r["tokens"] == o["tokens"].tolist()
        # JSON carries each float32 exactly (float64 repr of the float32 value).
        assert np.array_equal(np.asarray(r["logprobs"], dtype=np.float32), o["logprobs"])

    # The same call again, printed for people: the same tokens (the engine is deterministic for a seed).
    text = cli.run(*args, "--run", str(tmp_path / "again"))
    assert text.returncode == 0, text.stderr
    printed = [json.loads(m) for m in re.findall(r"tokens:\s+(\[[^\]]*\])", text.stdout)]
    assert printed == [r["tokens"] for r in rows]
    assert f"37+58={rows[0]['text']}" in text.stdout


def test_a_prompt_outside_the_vocabulary_is_one_line_before_any_worker(cli: InvarSession, tmp_path: Path,
                                                                       model: Path) -> None:
    out = cli.run("infer", "12+x=", "--model", str(model), "--run", str(tmp_path / "run"))
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "character 'x' at position 3 of '12+x=' is not in the model's vocabulary" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()  # refused by the core before a run or a worker was started


def test_a_missing_model_folder_is_one_line_and_starts_nothing(cli: InvarSession, tmp_path: Path) -> None:
    out = cli.run("infer", "1+1=", "--model", str(tmp_path / "nowhere"), "--run", str(tmp_path / "run"))
    assert out.returncode == 2
    assert out.stderr.strip() == f"invar: error: --model {tmp_path / 'nowhere'}: no such folder; pass the folder " \
                                 "that holds the model"
    assert not (tmp_path / "run").exists()


@pytest.mark.engine
def test_infer_shows_the_prompt_ids_the_model_read_as_the_records_hold_them(cli: InvarSession, tmp_path: Path,
                                                                            model: Path) -> None:
    # A tokenizer that drops (or doubles) a BOS is only visible in the ids: --json and the text both show them.
    out = cli.run("infer", "37+58=", "--max-tokens", "2", "--model", str(model), "--json", "--run",
                  str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["outputs"][0]
    assert row["prompt_ids"] == ModelTokenizer.from_model_dir(model).prompt_ids(prompt="37+58=")
    with RunStore.open(tmp_path / "run") as store:
        sent = store.calls()[1].call.params["requests"][0]["prompt_ids"]
    assert row["prompt_ids"] == [int(t) for t in sent]
    text = cli.run("infer", "37+58=", "--max-tokens", "2", "--model", str(model), "--run", str(tmp_path / "again"))
    assert text.returncode == 0, text.stderr
    assert f"prompt ids: {row['prompt_ids']}" in text.stdout
