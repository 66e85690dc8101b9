"""Special tokens are added once: a plain text prompt that already spells the BOS (a chat prompt rendered elsewhere
and given as text) is not given a second one, whichever command tokenizes it."""

from __future__ import annotations

from pathlib import Path

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
