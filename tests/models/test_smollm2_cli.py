"""`invar infer --chat` on the real instruct model: a prompt sent as a user message through the model's chat
template (what an instruct model answers), the conversation in the output and the ids in the records.

A plain prompt gives SmolLM2-135M-Instruct no turn to answer: greedy, it ends at once (`<|im_end|>` as its first
token), so `--chat` is how a person asks it something from the command line.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from support.cli_runs import invar

from invar.records import RunStore
from invar.tasks import ModelTokenizer

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "infer.schema.json"


def test_infer_chat_sends_the_rendered_conversation_and_the_model_answers(smollm2_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "infer-chat"
    question = "What is the capital of France?"
    done = invar("infer", "--chat", "--system", "Answer in a few words.", question, "--engine", "hf",
                 "--model", smollm2_dir, "--temperature", "0", "--max-tokens", "12", "--run", run, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8"))).validate(result)
    row = result["outputs"][0]
    messages = [{"role": "system", "content": "Answer in a few words."}, {"role": "user", "content": question}]
    assert row["messages"] == messages
    assert row["prompt"] == question
    assert "Paris" in row["text"], row["text"]
    tok = ModelTokenizer.from_model_dir(smollm2_dir)
    with RunStore.open(run) as store:
        generate = [r.call for r in store.calls() if r.call.method == "generate"]
        assert store.meta()["run"]["chat"] is True
    assert [int(t) for t in generate[0].params["requests"][0]["prompt_ids"]] == tok.prompt_ids(messages=messages)


def test_system_without_chat_is_refused_in_one_line(smollm2_dir: Path, tmp_path: Path) -> None:
    done = invar("infer", "--system", "Be brief.", "hello", "--model", smollm2_dir, "--run", tmp_path / "r")
    assert done.returncode == 2
    refusal = "invar: error: --system is a chat message: add --chat (or drop --system)"
    assert done.stderr.strip().splitlines() == [refusal]
    assert not (tmp_path / "r").exists()
