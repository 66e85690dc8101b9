"""A model folder whose metadata and tokenizer disagree on the BOS, or whose chat template ends a turn with an id
that ends no response, is found (`invar.tasks.special_tokens`); the shipped folders agree.

The folders with the gaps are the shipped SmolLM2 (converted from its GGUF) and tiny model's tokenizer files, each
changed as a user's own conversion leaves them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.model_copies import SMOLLM2, SMOLLM2_GGUF, TINY, tokenizer_copy

from invar.errors import ContractError
from invar.tasks import ModelTokenizer
from invar.tasks.special_tokens import add_end_ids, adds_bos, check_bos, check_end_ids, proposed_end_ids, turn_end_id

# The SmolLM2 folders are built by the build script, not checked in: every test here reads them after it ran.
pytestmark = pytest.mark.usefixtures("smollm2_build")


@pytest.mark.parametrize("folder", [SMOLLM2, SMOLLM2_GGUF, TINY])
def test_the_shipped_folders_agree_with_themselves(folder: Path) -> None:
    tokenizer = ModelTokenizer.from_model_dir(folder)
    check_bos(tokenizer)
    check_end_ids(tokenizer, "--add-end-ids")


def test_metadata_that_asks_for_a_bos_the_tokenizer_does_not_add_is_refused(tmp_path: Path) -> None:
    folder = tokenizer_copy(SMOLLM2, tmp_path / "m", add_bos_token=True)
    tokenizer = ModelTokenizer.from_model_dir(folder)
    assert not adds_bos(tokenizer)
    with pytest.raises(ContractError, match=r"tokenizer_config.json add_bos_token asks for a BOS, but tokenizer.json "
                                            r"adds none .* add '<\|im_start\|>' to tokenizer.json's post_processor"):
        check_bos(tokenizer)


def test_metadata_that_says_no_bos_where_the_tokenizer_adds_one_is_refused(tmp_path: Path) -> None:
    folder = tokenizer_copy(TINY, tmp_path / "m", add_bos_token=False)
    tokenizer = ModelTokenizer.from_model_dir(folder)
    assert adds_bos(tokenizer)
    with pytest.raises(ContractError, match=re.escape("add_bos_token says no BOS, but tokenizer.json adds '<s>' to "
                                                      "every prompt; remove it")):
        check_bos(tokenizer)


def test_a_gguf_file_that_asks_for_a_bos_the_tokenizer_does_not_add_is_refused(tmp_path: Path) -> None:
    import gguf  # the engines extra (the llama.cpp folder's), used here only to write a GGUF header
    folder = tokenizer_copy(SMOLLM2, tmp_path / "m")
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    writer.add_add_bos_token(True)  # what llama.cpp follows: the metadata of the file it runs
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ContractError, match=r"model.gguf tokenizer.ggml.add_bos_token asks for a BOS, but "
                                            r"tokenizer.json adds none"):
        check_bos(ModelTokenizer.from_model_dir(folder))


def test_a_turn_end_that_ends_no_response_is_proposed_and_written(tmp_path: Path) -> None:
    folder = tokenizer_copy(SMOLLM2, tmp_path / "m")
    endoftext = ModelTokenizer.from_model_dir(folder).encode("<|endoftext|>")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": endoftext[0], "bos_token_id": 1}))
    tokenizer = ModelTokenizer.from_model_dir(folder)
    im_end = tokenizer.encode("<|im_end|>")[0]
    assert tokenizer.eos_token_ids == (endoftext[0],)
    assert proposed_end_ids(tokenizer) == (endoftext[0], im_end)
    with pytest.raises(ContractError, match=rf"ends a turn with '<\|im_end\|>' \(id {im_end}\), but the ids that end "
                                            rf"a response \(generation_config.json\) are \[{endoftext[0]}\]: .* set "
                                            rf"eos_token_id to \[{endoftext[0]}, {im_end}\] in generation_config.json "
                                            r"\(--add-end-ids writes it\)"):
        check_end_ids(tokenizer, "--add-end-ids")
    assert add_end_ids(tokenizer) == (endoftext[0], im_end)
    assert json.loads((folder / "generation_config.json").read_text()) == {"eos_token_id": [endoftext[0], im_end],
                                                                          "bos_token_id": 1}
    fixed = ModelTokenizer.from_model_dir(folder)
    assert fixed.eos_token_ids == (endoftext[0], im_end)
    check_end_ids(fixed, "--add-end-ids")


CHAT_FIXTURES = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "chat"


@pytest.mark.parametrize("family", sorted(p.name for p in CHAT_FIXTURES.iterdir() if p.is_dir()))
def test_each_familys_template_ends_a_turn_with_an_id_its_generation_config_lists(family: str) -> None:
    # The check finds each real template's turn end (<|eot_id|>, <|im_end|>, <end_of_turn>, </s>), and a folder
    # saved as the family ships it lists that id: none of them is refused.
    tokenizer = ModelTokenizer.from_model_dir(CHAT_FIXTURES / family)
    turn_end = turn_end_id(tokenizer)
    assert turn_end is not None
    assert tokenizer.special_tokens.get("eos_token") is not None
    assert turn_end in tokenizer.eos_token_ids
    assert proposed_end_ids(tokenizer) is None


@pytest.mark.parametrize("header", [b"not a gguf file at all, just text padded out" * 2,
                                    b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little")
                                    + (1).to_bytes(8, "little") + (2**40).to_bytes(8, "little")])
def test_a_damaged_gguf_header_is_one_line(tmp_path: Path, header: bytes) -> None:
    folder = tokenizer_copy(SMOLLM2, tmp_path / "m")
    (folder / "model.gguf").write_bytes(header)
    with pytest.raises(ContractError, match=r"model\.gguf: .*replace it with the GGUF file"):
        check_bos(ModelTokenizer.from_model_dir(folder))
