"""Tokenization through the real commands: what the model reads is what the core meant it to read.

`score --tokens` adds special tokens once (a rendered prompt that spells the BOS gets no second one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from invar.engines import DEFAULT_MODEL
from invar.records import RunStore
from invar.tasks import ModelTokenizer


def _invar(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


@pytest.mark.engine
def test_score_tokens_adds_the_bos_once_to_a_prompt_that_spells_it(tmp_path: Path) -> None:
    vocab = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    answer = vocab.encode("95")
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"item_id": name, "prompt": prompt, "tokens": answer}) + "\n"
                             for name, prompt in (("plain", "37+58="), ("spelled", "<s>37+58="))))
    out = _invar("score", "--tokens", items, "--model", DEFAULT_MODEL, "--run", tmp_path / "run", "--json")
    assert out.returncode == 0, out.stderr
    with RunStore.open(tmp_path / "run") as store:
        (call,) = [c for c in store.calls() if c.call.method == "score"]
    sent = {item["item_id"]: [int(t) for t in item["prompt_ids"]] for item in call.call.params["items"]}
    assert sent["plain"][0] == vocab.bos_token_id
    assert sent["spelled"] == sent["plain"]  # one BOS, not two
    scored = {item["item_id"]: item["logprobs"] for item in json.loads(out.stdout)["items"]}
    assert scored["spelled"] == scored["plain"]
