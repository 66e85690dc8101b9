"""A character-level tokenizer folder built with the `tokenizers` library, for tests that need only what the core
reads of a model (its tokenizer files and config), not weights."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from invar import canonical


def write_char_model(folder: Path, specials: Sequence[str], chars: str, *, eos: str = "</s>", bos: str = "<s>",
                     unk: str = "<pad>") -> str:
    """One token per character of `chars` after the special tokens (ids 0..); no post-processor, so a prompt is
    encoded without BOS. Writes tokenizer.json, tokenizer_config.json and config.json; returns the tree digest."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate((*specials, *chars))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(specials))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos, "bos_token": bos}))
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": len(vocab)}))
    return canonical.tree_digest(folder)
