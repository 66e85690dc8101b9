"""`invar score` on the real Hugging Face engine, and `compare numerical` on what it records: an engine scoring its
own samples gives them back to the bit (teacher-forced Δ exactly 0, KL exactly 0); NF4 weights do not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from invar.records import RunStore

pytestmark = pytest.mark.engine

PROMPTS = ["23+18=", "5*2+83=", "958+218=", "77*3=", "640-59=", "9*4+62="]


def _invar(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def _ok(*args: str | Path) -> dict[str, Any]:
    out = _invar(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("score")
    paths = {name: root / name for name in ("fp32", "nf4", "self1", "self2", "nf4_scores")}
    _ok("infer", *PROMPTS, "--seed", "7", "--max-tokens", "5", "--run", paths["fp32"])
    _ok("infer", *PROMPTS, "--seed", "7", "--max-tokens", "5", "--quantization", "nf4", "--run", paths["nf4"])
    for name, extra in (("self1", ()), ("self2", ()), ("nf4_scores", ("--quantization", "nf4"))):
        _ok("score", "--from-run", paths["fp32"], "--capture-steps", "0,1,last", *extra, "--run", paths[name])
    return paths


def test_score_keeps_the_whole_vocabulary_as_float32_arrays_in_its_records(runs: dict[str, Path]) -> None:
    with RunStore.open(runs["self1"]) as store:
        (rec,) = [c for c in store.calls() if c.call.method == "score"]  # infer made one batch: one score call
    assert rec.report is not None
    result = rec.report.report.result
    assert result is not None
    for item, out in zip(rec.call.params["items"], result["outputs"], strict=True):
        vocab = out["vocab_logprobs"]
        assert isinstance(vocab, np.ndarray)
        assert vocab.dtype == np.float32
        assert vocab.shape == (len(item["vocab_steps"]), 18)
        assert item["vocab_steps"][-1] == item["response_tokens"].size - 1  # "last"
        # The captured row at each step holds the scored token's log-probability, to the bit.
        for row, step in zip(vocab, item["vocab_steps"], strict=True):
            token = int(item["response_tokens"][step])
            assert row[token].view(np.uint32) == out["logprobs"][step].view(np.uint32)


def test_an_engine_against_itself_is_exactly_zero(runs: dict[str, Path]) -> None:
    doc = _ok("compare", "numerical", runs["fp32"], runs["fp32"], "--cand-scores", runs["self1"],
              "--ref-scores", runs["self2"])
    assert doc["generation"]["identical"] == len(PROMPTS)
    tf = doc["teacher_forcing"]
    assert tf["identical"] == len(PROMPTS)  # the engine's score of its own samples: the sampled bits
    assert tf["delta"]["min"] == tf["delta"]["max"] == 0.0
    c = doc["captures"]
    assert c["identical"] == c["captures"] >= 2 * len(PROMPTS)
    assert c["kl_ref_cand"]["max"] == c["kl_cand_ref"]["max"] == 0.0
    assert doc["reference_self_consistency"] == {"units": len(PROMPTS), "identical": len(PROMPTS)}


def test_nf4_weights_move_the_distributions_beyond_the_capture_precision(runs: dict[str, Path]) -> None:
    doc = _ok("compare", "numerical", runs["fp32"], runs["nf4"], "--cand-scores", runs["nf4_scores"],
              "--ref-scores", runs["self1"])
    assert doc["generation"]["logprobs_identical_over_shared_prefix"] == 0
    assert doc["teacher_forcing"]["identical"] == 0
    c = doc["captures"]
    assert c["identical"] == 0
    assert c["kl_ref_cand"]["max"] > c["kl_ref_cand"]["max_bound"]
    assert not c["kl_ref_cand"]["mean_indistinguishable_from_0"]


def test_score_of_tokens_from_a_file(runs: dict[str, Path], tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"item_id": "a", "prompt": "23+18=", "tokens": [7, 4, 2]}) + "\n"
                     + json.dumps({"item_id": "b", "prompt": "2*3=", "tokens": [9, 2], "temperature": 0.5}) + "\n")
    doc = _ok("score", "--tokens", items, "--capture-steps", "every:2", "--run", tmp_path / "run")
    assert [(r["item_id"], len(r["logprobs"]), [c["step"] for c in r["captures"]]) for r in doc["items"]] == [
        ("a", 3, [0, 2]), ("b", 2, [0])]
    assert all(len(c["vocab_logprobs"]) == 18 for r in doc["items"] for c in r["captures"])
    with RunStore.open(tmp_path / "run") as store:
        assert store.verify().closed
