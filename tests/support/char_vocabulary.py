"""The character-level reader the core used before `invar.tasks.ModelTokenizer`, kept as a test reference: the
tokenizer tests show the core's reader gives exactly its ids and text on the shipped model, so no figure moved.

Originally: the core's own character-level detokenizer, read from a model folder's `tokenizer.json`.

The core scores responses from the token ids a worker reports, never from the worker's text, so it needs the
id → text map itself. It reads `tokenizer.json` and `tokenizer_config.json` with the `json` module (no
tokenizer library) and accepts only what it can reproduce exactly: a WordLevel vocabulary whose ordinary tokens
are single characters, no normalizer, and special tokens declared as such. Special tokens other than the one that
ends decoding are rendered as their text (e.g. `<s>`), so a response containing one never passes as an answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar.errors import ContractError, EvidenceError


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ContractError(f"{path} does not exist: the model folder must hold the tokenizer files it was saved with")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ContractError(f"{path} is not valid JSON ({exc}): re-save the tokenizer") from None


def _special_name(config: Mapping[str, Any], key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):  # older tokenizer_config files store {"content": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Vocabulary:
    """A character-level vocabulary: token id `i` is the text `tokens[i]`."""

    tokens: tuple[str, ...]
    """Text of each id; special tokens by their content, e.g. `</s>`."""
    special_ids: frozenset[int]
    """Ids of special tokens (never produced by `encode` from text)."""
    eos_token_id: int
    """The token that ends a response."""
    bos_token_id: int | None
    """The token put before a prompt, if the tokenizer adds one."""

    @property
    def size(self) -> int:
        """Number of token ids."""
        return len(self.tokens)

    @classmethod
    def from_model_dir(cls, path: str | Path) -> Vocabulary:
        """Read `tokenizer.json` and `tokenizer_config.json` from a model folder.

        Raises `ContractError` naming the file and the problem when the tokenizer is not character level.
        """
        root = Path(path)
        tokenizer = _read_json(root / "tokenizer.json")
        config = _read_json(root / "tokenizer_config.json")
        where = root / "tokenizer.json"
        model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
        if not isinstance(model, dict) or model.get("type") != "WordLevel" or not isinstance(model.get("vocab"), dict):
            raise ContractError(f"{where}: expected a WordLevel model with a vocab map (a character-level tokenizer)")
        if tokenizer.get("normalizer") is not None:
            raise ContractError(f"{where}: a normalizer rewrites text before lookup; save the tokenizer without one")
        vocab: dict[str, Any] = model["vocab"]
        added = tokenizer.get("added_tokens", [])
        if not isinstance(added, list) or not all(isinstance(t, dict) and isinstance(t.get("content"), str)
                                                  for t in added):
            raise ContractError(f"{where}: added_tokens must be a list of objects with a string content")
        specials = {t["content"] for t in added if t.get("special")}
        by_id: dict[int, str] = {}
        for text, token_id in vocab.items():
            if not isinstance(token_id, int) or token_id in by_id:
                raise ContractError(f"{where}: token {text!r} has a missing or repeated id {token_id!r}")
            if text not in specials and len(text) != 1:
                raise ContractError(
                    f"{where}: token {text!r} is neither one character nor a special token: "
                    "the core reads only character-level vocabularies"
                )
            by_id[token_id] = text
        if sorted(by_id) != list(range(len(by_id))):
            raise ContractError(f"{where}: token ids must be exactly 0..{len(by_id) - 1}")
        tokens = tuple(by_id[i] for i in range(len(by_id)))
        ids = {text: i for i, text in enumerate(tokens)}
        eos = _special_name(config, "eos_token")
        if eos is None or eos not in ids:
            raise ContractError(f"{root / 'tokenizer_config.json'}: eos_token is missing or not in the vocabulary")
        bos = _special_name(config, "bos_token")
        if bos is not None and bos not in ids:
            raise ContractError(f"{root / 'tokenizer_config.json'}: bos_token {bos!r} is not in the vocabulary")
        return cls(
            tokens=tokens,
            special_ids=frozenset(ids[t] for t in specials if t in ids),
            eos_token_id=ids[eos],
            bos_token_id=None if bos is None else ids[bos],
        )

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of `text`, one per character, after the BOS id when `add_bos` (as engines tokenize prompts).

        Raises `ContractError` naming the first character outside the vocabulary.
        """
        lookup = {t: i for i, t in enumerate(self.tokens) if i not in self.special_ids}
        ids: list[int] = []
        if add_bos:
            if self.bos_token_id is None:
                raise ContractError("this vocabulary has no BOS token: encode with add_bos=False")
            ids.append(self.bos_token_id)
        for position, char in enumerate(text):
            token_id = lookup.get(char)
            if token_id is None:
                raise ContractError(
                    f"character {char!r} at position {position} of {text!r} is not in the model's vocabulary: "
                    "use only characters the tokenizer knows"
                )
            ids.append(token_id)
        return ids

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of token ids `ids` (shape [T], any integer type); stops before the first EOS when `stop_at_eos`.

        Raises `EvidenceError` for an id outside the vocabulary (tokens of some other model).
        """
        parts: list[str] = []
        for raw in ids:
            token_id = int(raw)
            if not 0 <= token_id < len(self.tokens):
                raise EvidenceError(
                    f"token id {token_id} is outside the vocabulary of {len(self.tokens)} tokens: "
                    "the tokens come from a different model than the one named"
                )
            if stop_at_eos and token_id == self.eos_token_id:
                break
            parts.append(self.tokens[token_id])
        return "".join(parts)
