"""The shipped model's character-level tokenizer as the core reads it (`ModelTokenizer`): its ids, what it decodes,
and what it refuses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from invar.errors import ContractError, EvidenceError
from invar.tasks import ModelTokenizer, load_population, score

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-arith"
EVAL = ROOT / "data" / "arith-eval.jsonl"


@pytest.fixture(scope="module")
def vocab() -> ModelTokenizer:
    return ModelTokenizer.from_model_dir(MODEL)


def test_shipped_vocabulary(vocab: ModelTokenizer) -> None:
    assert vocab.size == 18
    assert [vocab.decode([i], stop_at_eos=False) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert vocab.decode(range(4, 18)) == "0123456789+-*="
    assert (vocab.eos_token_ids, vocab.bos_token_id) == ((2,), 1)
    assert vocab.special_ids == {0, 1, 2, 3}


def test_encode_decode_round_trip_on_the_population(vocab: ModelTokenizer) -> None:
    digest = EVAL.with_suffix(".sha256").read_text().split()[0]
    for problem in load_population(EVAL, digest)[:2000]:
        text = problem.prompt + problem.answer
        ids = vocab.encode(text)
        assert len(ids) == len(text)
        assert vocab.decode(ids) == text
    assert vocab.encode("1+2=", add_bos=True) == [1, 5, 14, 6, 17]


def test_decode_stops_at_eos_and_renders_other_specials(vocab: ModelTokenizer) -> None:
    nine, five, eos, bos, pad, unk = 13, 9, 2, 1, 0, 3
    assert vocab.decode([nine, five, eos, nine]) == "95"
    assert vocab.decode([nine, five, eos, nine], stop_at_eos=False) == "95</s>9"
    assert vocab.decode(np.array([nine, bos, five], dtype=np.int32)) == "9<s>5"
    assert vocab.decode([pad, unk]) == "<pad><unk>"
    assert vocab.decode([eos]) == ""
    # A special token inside a response never passes as an answer.
    assert score("37+58=", vocab.decode([nine, bos, five, eos])) == 1
    assert score("37+58=", vocab.decode([nine, five, eos])) == 0


def test_encode_names_the_first_unknown_character(vocab: ModelTokenizer) -> None:
    with pytest.raises(ContractError, match=r"character ' ' at position 2 of '37 \+ 5=' is not in the model"):
        vocab.encode("37 + 5=")
    # Text that spells a special token is that token, as engines encode it; no shipped prompt holds one.
    assert vocab.encode("<s>1") == [1, 5]


def test_decode_rejects_ids_outside_the_vocabulary(vocab: ModelTokenizer) -> None:
    with pytest.raises(EvidenceError, match="token id 18 is outside the vocabulary of 18 tokens"):
        vocab.decode([4, 18])
    with pytest.raises(EvidenceError, match="token id -1"):
        vocab.decode([-1])


def copy_tokenizer(tmp_path: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL / name, tmp_path / name)
    return tmp_path


def test_from_model_dir_names_a_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"tokenizer\.json does not exist"):
        ModelTokenizer.from_model_dir(tmp_path)
    folder = copy_tokenizer(tmp_path)
    (folder / "tokenizer_config.json").write_text("{")
    with pytest.raises(ContractError, match=r"tokenizer_config\.json"):
        ModelTokenizer.from_model_dir(folder)
