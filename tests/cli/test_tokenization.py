"""Tokenization through the real commands: what the model reads is what the core meant it to read.

`score --tokens` adds special tokens once (a rendered prompt that spells the BOS gets no second one); `use init` and
`use prepare` find a folder whose metadata and tokenizer disagree on the BOS or the end of a turn, and `use init`
adds the missing turn end when asked."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from support.cli_batch import InvarSession
from support.model_copies import SMOLLM2, tokenizer_copy

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.records import RunStore
from invar.tasks import ModelTokenizer

CLI_BOUND_S = 600  # seconds a command may take in the module's session (tests/cli/conftest.py)


@pytest.mark.engine
def test_score_tokens_adds_the_bos_once_to_a_prompt_that_spells_it(cli: InvarSession, tmp_path: Path) -> None:
    vocab = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
    answer = vocab.encode("95")
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"item_id": name, "prompt": prompt, "tokens": answer}) + "\n"
                             for name, prompt in (("plain", "37+58="), ("spelled", "<s>37+58="))))
    out = cli.run("score", "--tokens", items, "--model", DEFAULT_MODEL, "--run", tmp_path / "run", "--json")
    assert out.returncode == 0, out.stderr
    with RunStore.open(tmp_path / "run") as store:
        (call,) = [c for c in store.calls() if c.call.method == "score"]
    sent = {item["item_id"]: [int(t) for t in item["prompt_ids"]] for item in call.call.params["items"]}
    assert sent["plain"][0] == vocab.bos_token_id
    assert sent["spelled"] == sent["plain"]  # one BOS, not two
    scored = {item["item_id"]: item["logprobs"] for item in json.loads(out.stdout)["items"]}
    assert scored["spelled"] == scored["plain"]


def _chat_population(where: Path) -> Path:
    path = where / "chat.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"What is {i}+1?"}],
                                        "answer": str(i + 1)}) + "\n" for i in range(4)), encoding="utf-8")
    return path


@pytest.mark.engine
@pytest.mark.usefixtures("smollm2_build")
def test_use_init_adds_the_turn_end_a_conversion_left_out_and_prepare_refuses_a_bos_gap(cli: InvarSession,
                                                                                        tmp_path: Path) -> None:
    """SmolLM2's tokenizer files as a user's GGUF conversion leaves them: generation_config.json ends a response at
    <|endoftext|> only, while the chat template ends each turn with <|im_end|>. `use init` refuses the folder naming
    the fix, then with --add-end-ids writes it and says so; `use prepare` then accepts it, and refuses it again once
    its tokenizer_config.json asks for a BOS that tokenizer.json does not add."""
    folder = tokenizer_copy(SMOLLM2, tmp_path / "smollm2")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "bos_token_id": 1}))
    population = _chat_population(tmp_path)
    decl = tmp_path / "use.toml"
    args = ("use", "init", decl, "--model", folder, "--population", population, "--scorer", "exact-match",
            "--every-unit", "--no-invariance", "--max-tokens", "4", "--candidate-dtype", "bfloat16")
    refused = cli.run(*args, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert ("ends a turn with '<|im_end|>' (id 2), but the ids that end a response (generation_config.json) are [0]"
            in refused.stderr)
    assert "set eos_token_id to [0, 2] in generation_config.json (invar use init --add-end-ids writes it)" in \
        refused.stderr
    assert not decl.exists()

    fixed = cli.run(*args, "--add-end-ids", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert f"wrote eos_token_id [0, 2] to {folder / 'generation_config.json'}" in fixed.stdout
    assert json.loads((folder / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": [0, 2]}
    prepared = cli.run("use", "prepare", decl, "--json", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr

    # The same folder, its metadata now asking for a BOS its tokenizer never adds: refused at prepare, the fix named.
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "add_bos_token": True}))
    text = decl.read_text(encoding="utf-8")
    old = tomllib.loads(text)["reference"]["model_digest"]
    decl.write_text(text.replace(old, canonical.tree_digest(folder)), encoding="utf-8")
    bos = cli.run("use", "prepare", decl, "--out", tmp_path / "again", cwd=tmp_path)
    assert bos.returncode == 2, bos.stderr
    assert bos.stderr.strip().count("\n") == 0, bos.stderr
    assert "reference.model_dir: " in bos.stderr
    assert "tokenizer_config.json add_bos_token asks for a BOS, but tokenizer.json adds none to a prompt" in bos.stderr
    assert "add '<|im_start|>' to tokenizer.json's post_processor" in bos.stderr
    again = cli.run(*args, "--force", cwd=tmp_path)  # and at init, before any worker starts
    assert again.returncode == 2
    assert "asks for a BOS, but tokenizer.json adds none" in again.stderr
