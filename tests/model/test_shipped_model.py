"""The shipped model folder: its files match SHA256SUMS, and transformers reproduces the model card's numbers.

The greedy count is exact: the card's figure was produced by the same procedure (transformers `generate`, one
prompt at a time, on every 100th problem of the evaluation population), so any change to the weights, the
tokenizer or the engine's numerics that flips an answer shows up here.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from invar.tasks import MAX_ANSWER_CHARS, ModelTokenizer, Problem, load_population, score

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-arith"
EVAL = ROOT / "data" / "arith-eval.jsonl"


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return load_population(EVAL, EVAL.with_suffix(".sha256").read_text().split()[0])


def test_sha256sums_cover_every_file_and_match() -> None:
    listed = {}
    for line in (MODEL / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        listed[name] = digest
    on_disk = {p.name for p in MODEL.iterdir() if p.is_file()} - {"SHA256SUMS"}
    assert set(listed) == on_disk
    for name, digest in listed.items():
        assert hashlib.sha256((MODEL / name).read_bytes()).hexdigest() == digest, name


def test_config_names_the_special_tokens_engines_stop_at() -> None:
    vocab = ModelTokenizer.from_model_dir(MODEL)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((MODEL / name).read_text())
        assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0), name
    config = json.loads((MODEL / "config.json").read_text())
    assert config["vocab_size"] == vocab.size
    assert config["head_dim"] >= 32  # vLLM's CPU attention rejects 16
    assert config["max_position_embeddings"] >= 128


@pytest.fixture(scope="module")
def hf() -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL)
    model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL)
    return model, tokenizer


@pytest.mark.engine
def test_core_vocabulary_agrees_with_transformers_tokenizer(hf: tuple[Any, Any], problems: list[Problem]) -> None:
    _, tokenizer = hf
    vocab = ModelTokenizer.from_model_dir(MODEL)
    assert len(tokenizer) == vocab.size
    assert tokenizer.eos_token_id == vocab.eos_token_id
    assert tokenizer.bos_token_id == vocab.bos_token_id
    for p in problems:
        ids = tokenizer(p.prompt).input_ids
        assert ids == vocab.encode(p.prompt, add_bos=True), p.prompt
        response = [*vocab.encode(p.answer), vocab.eos_token_id]
        assert tokenizer.decode(response, skip_special_tokens=True) == vocab.decode(response) == p.answer
        assert tokenizer.decode(ids) == vocab.decode(ids, stop_at_eos=False)


def card_count() -> tuple[int, int]:
    card = (MODEL / "MODEL_CARD.md").read_text()
    match = re.search(r"fixed 200-problem sample\s.*?: (\d+)/(\d+)", card, flags=re.DOTALL)
    assert match is not None, "MODEL_CARD.md states no count for the fixed 200-problem sample"
    return int(match[1]), int(match[2])


@pytest.mark.engine
def test_transformers_greedy_count_matches_the_model_card(hf: tuple[Any, Any], problems: list[Problem]) -> None:
    torch = pytest.importorskip("torch")
    model, tokenizer = hf
    vocab = ModelTokenizer.from_model_dir(MODEL)
    sample = problems[::100]
    correct = 0
    with torch.no_grad():
        for p in sample:
            enc = tokenizer(p.prompt, return_tensors="pt")
            out = model.generate(**enc, do_sample=False, max_new_tokens=MAX_ANSWER_CHARS + 2)
            response = out[0, enc.input_ids.shape[1] :].tolist()
            correct += 1 - score(p.prompt, vocab.decode(response))
    assert (correct, len(sample)) == card_count()
