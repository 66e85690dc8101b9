"""Special tokens are added once: a plain text prompt that already spells the BOS (a chat prompt rendered elsewhere
and given as text) is not given a second one, whichever command tokenizes it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from invar.errors import ContractError
from invar.tasks import ModelTokenizer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "tiny-arith"


def test_a_prompt_that_spells_the_bos_gets_no_second_one() -> None:
    vocab = ModelTokenizer.from_model_dir(SHIPPED)
    assert vocab.bos_token_id is not None
    plain = vocab.prompt_ids(prompt="37+58=")
    assert plain[0] == vocab.bos_token_id  # the shipped tokenizer adds a BOS to text
    assert vocab.prompt_ids(prompt="<s>37+58=") == plain
    assert vocab.text_ids("<s>37+58=") == plain
    # a BOS the text spells elsewhere is the text's own: kept, and the added one too
    assert vocab.prompt_ids(prompt="37+<s>58=") == [vocab.bos_token_id, *vocab.encode("37+<s>58=")]


CHAT_FIXTURES = ROOT / "tests" / "tasks" / "fixtures" / "chat"
TEXTS = ("37+58=", "<s>37+58=", "37+58=</s>", "<s>", "</s>", "a", " a b  ", "\n\t x", "héllo wörld", "日本語のテキスト",
         "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>hi", "<bos>hi<eos>", "<s><s>1", "1<s>", "x" * 50,
         "🙂 emoji", "tab\there", "ends with space ")


def _reference_checked(vocab: ModelTokenizer, text: str) -> Any:
    """The refusal rule as first written: every token's offsets marked, then every character looked at."""
    encoding = vocab._tokenizer.encode(text, add_special_tokens=False)
    covered = bytearray(len(text))
    for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
        if token_id == vocab._unk_id and token_id not in vocab._declared_text_ids(text, start, end):
            position = start if start < len(text) else 0
            piece = text[start:end] or text[position:position + 1]
            what = f"character {piece!r}" if len(piece) == 1 else repr(piece)
            raise ContractError(
                f"{what} at position {position} of {text!r} is not in the model's vocabulary "
                f"({vocab.path / 'tokenizer.json'} encodes it as the unknown token): use only text the tokenizer "
                "knows")
        covered[start:end] = b"\x01" * (end - start)
    for position, char in enumerate(text):
        if not covered[position] and not char.isspace():
            raise ContractError(
                f"character {char!r} at position {position} of {text!r} is not in the model's vocabulary "
                f"({vocab.path / 'tokenizer.json'} drops it): use only characters the tokenizer knows")
    return encoding


def _reference_text_ids(vocab: ModelTokenizer, text: str) -> list[int]:
    """`text_ids` as written before it knew a post-processor's fixed frame: the post-processor run on every text and
    the text's own ids searched for in what it made."""
    encoding = _reference_checked(vocab, text)
    bare = list(encoding.ids)
    full = list(vocab._tokenizer.post_process(encoding, None, True).ids)
    start = next((k for k in range(len(full) - len(bare) + 1) if full[k:k + len(bare)] == bare), None)
    if start is None:
        return full
    head, tail = full[:start], full[start + len(bare):]
    if head and bare[:len(head)] == head:
        head = []
    if tail and bare[len(bare) - len(tail):] == tail:
        tail = []
    return head + bare + tail


def test_text_ids_agree_with_the_post_processor_run_on_every_text() -> None:
    folders = [SHIPPED, *sorted(p for p in CHAT_FIXTURES.iterdir() if (p / "tokenizer.json").is_file())]
    framed = refused = 0
    for folder in folders:
        vocab = ModelTokenizer.from_model_dir(folder)
        framed += vocab._frame is not None
        texts = [*TEXTS, *(t for t in vocab.special_tokens.values()), *(t + "x" for t in vocab.special_tokens.values())]
        for text in texts:
            try:
                expected = _reference_text_ids(vocab, text)
            except ContractError as exc:  # the same refusal, word for word
                refused += 1
                with pytest.raises(ContractError, match=f"^{re.escape(str(exc))}$"):
                    vocab.text_ids(text)
                continue
            assert vocab.text_ids(text) == expected, (folder.name, text)
    assert refused  # some texts hold characters a vocabulary lacks
    assert framed >= 2  # the fast path is taken by the shipped tokenizer and the fixtures' template processors
