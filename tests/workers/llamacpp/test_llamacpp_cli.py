"""The commands on a GGUF model: `invar infer --engine llamacpp` with the GGUF folder or the GGUF file in it (the same
model, the same digest, the same tokens), and a GGUF file outside such a folder refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.cli_runs import invar

pytestmark = pytest.mark.engine


def test_infer_takes_the_folder_or_the_gguf_file_in_it(gguf_dir: Path, tmp_path: Path) -> None:
    gguf = next(gguf_dir.glob("*.gguf"))
    outputs = []
    for i, model in enumerate((gguf_dir, gguf)):
        done = invar("infer", "--chat", "What is 4 + 6?", "--engine", "llamacpp", "--model", model,
                     "--temperature", "0", "--max-tokens", "6", "--run", tmp_path / f"run{i}", "--json", "--quiet")
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert outputs[0]["model_digest"] == outputs[1]["model_digest"]
    assert [o["tokens"] for o in outputs[0]["outputs"]] == [o["tokens"] for o in outputs[1]["outputs"]]


def test_a_gguf_file_without_its_tokenizer_is_refused_in_one_line(gguf_dir: Path, tmp_path: Path) -> None:
    gguf = next(gguf_dir.glob("*.gguf"))
    os.link(gguf, tmp_path / gguf.name)
    done = invar("infer", "x", "--engine", "llamacpp", "--model", tmp_path / gguf.name, "--quiet")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "has no tokenizer.json, tokenizer_config.json, config.json" in lines[0]
    assert "Traceback" not in done.stderr
