"""What a model folder says about its special tokens, checked against what its tokenizer and template do.

A folder converted from another format (transformers' GGUF loader, for one) can say one thing and do another: its
metadata asks for a BOS that its `tokenizer.json` never adds (or the reverse), and its chat template ends each
turn with a token that `generation_config.json` does not list among the ids that end a response. Every command
then runs, and runs wrong: prompts without the BOS the model was trained on degenerate, and a response that ends
its turn is not stopped there. `use init` and `use prepare` check both before anything is pinned.

Decisions:
- **The tokenizer is what runs.** The core tokenizes every prompt with `tokenizer.json` (`ModelTokenizer`), so
  whether a BOS is added is what its post-processor adds to a text. The metadata that states it is
  `tokenizer_config.json`'s `add_bos_token` and, for a GGUF file in the folder, its `tokenizer.ggml.add_bos_token`
  (what llama.cpp follows; read from the file's header by `_gguf_add_bos`). Any that disagree with the tokenizer
  are refused, naming both and the fix: the core will not guess which one the model was trained with.
- **A turn ends where the template says.** The template is rendered on a user message and an assistant reply; the
  special token that follows the reply (after any whitespace) is the one the template ends a turn with. When it is
  not among the ids that end a response, the fix is to add it to `generation_config.json`'s `eos_token_id` (the
  file transformers, vLLM and the core all read): `use init --add-end-ids` does that and says so.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from invar.errors import ContractError
from invar.formats.tokenizer import GENERATION_CONFIG_FILE, ModelTokenizer
from invar.regular_files import read_model_file

GGUF_ADD_BOS = "tokenizer.ggml.add_bos_token"
_REPLY = "Invar-reply-0"
"""The assistant reply the template is rendered with, to find what follows it."""


def bos_statements(model_dir: Path) -> list[tuple[str, bool]]:
    """What the folder's metadata says about adding a BOS: (where it says it, whether to add one), for
    `tokenizer_config.json`'s `add_bos_token` and each GGUF file's `tokenizer.ggml.add_bos_token` that is set."""
    stated: list[tuple[str, bool]] = []
    config = json.loads(read_model_file(model_dir / "tokenizer_config.json"))  # ModelTokenizer read it already
    value = config.get("add_bos_token") if isinstance(config, dict) else None
    if isinstance(value, bool):
        stated.append(("tokenizer_config.json add_bos_token", value))
    for gguf_file in sorted(model_dir.glob("*.gguf")):
        found = _gguf_add_bos(gguf_file)
        if found is not None:
            stated.append((f"{gguf_file.name} {GGUF_ADD_BOS}", found))
    return stated


_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Bytes of each fixed-size GGUF value type (GGUF spec: uint8 … float64; 7 is bool, 8 string, 9 array)."""
_GGUF_BOOL, _GGUF_STRING, _GGUF_ARRAY = 7, 8, 9
_GGUF_KEY_BYTES = 65_536
"""The longest key read: GGUF keys are dotted names, so a longer one is a damaged file, not a key to read."""


def _gguf_add_bos(path: Path) -> bool | None:
    """`tokenizer.ggml.add_bos_token` from a GGUF file's key-value header (None when it is not set).

    Read by hand rather than with the gguf package's `GGUFReader`, which maps every tensor and token first: on the
    shipped SmolLM2 Q4_1 file that took 16 s here, this reader well under one (it skips the token arrays)."""
    size = path.stat().st_size
    fix = "replace it with the GGUF file the model was converted from"

    def take(f: Any, n: int) -> bytes:
        data = f.read(n)
        if len(data) != n:
            raise ContractError(f"{path}: its GGUF header ends early; {fix}")
        return bytes(data)

    def length(f: Any) -> int:
        n = int(struct.unpack("<Q", take(f, 8))[0])
        if n > size:
            raise ContractError(f"{path}: its GGUF header states a length past the file's end; {fix}")
        return n

    def skip(f: Any, kind: int) -> None:
        if kind == _GGUF_STRING:
            f.seek(length(f), 1)
        elif kind == _GGUF_ARRAY:
            inner, count = struct.unpack("<IQ", take(f, 12))
            if inner in _GGUF_SIZES:
                f.seek(_GGUF_SIZES[inner] * count, 1)
            else:
                for _ in range(min(count, size)):
                    skip(f, inner)
        elif kind in _GGUF_SIZES:
            f.seek(_GGUF_SIZES[kind], 1)
        else:
            raise ContractError(f"{path}: its GGUF header holds a value of unknown type {kind}; {fix}")

    with path.open("rb") as f:
        magic, version, _tensors, count = struct.unpack("<4sIQQ", take(f, 24))
        if magic != b"GGUF" or version not in (2, 3):
            raise ContractError(f"{path}: not a GGUF file of version 2 or 3 (little-endian); {fix}")
        for _ in range(count):
            size_of_key = length(f)
            if size_of_key > _GGUF_KEY_BYTES:
                raise ContractError(f"{path}: its GGUF header names a key of {size_of_key:,} bytes; {fix}")
            key = take(f, size_of_key)
            kind = struct.unpack("<I", take(f, 4))[0]
            if key == GGUF_ADD_BOS.encode() and kind == _GGUF_BOOL:
                return take(f, 1) != b"\x00"
            skip(f, kind)
    return None


def adds_bos(tokenizer: ModelTokenizer) -> bool:
    """Whether the tokenizer puts its BOS before a text prompt (what the core sends for a plain prompt)."""
    return tokenizer.bos_token_id is not None and tokenizer.text_ids("")[:1] == [tokenizer.bos_token_id]


def check_bos(tokenizer: ModelTokenizer) -> None:
    """Refuse a folder whose metadata asks for a BOS its tokenizer does not add, or says none where it adds one:
    one line naming the statement, what the tokenizer does, and the fix."""
    adds = adds_bos(tokenizer)
    for where, asks in bos_statements(tokenizer.path):
        if asks and not adds:
            bos = tokenizer.special_tokens.get("bos_token")
            raise ContractError(
                f"{tokenizer.path}: {where} asks for a BOS, but tokenizer.json adds none to a prompt, so the model "
                f"would read every prompt without it; add {bos or 'the BOS'!r} to tokenizer.json's post_processor "
                f"(a TemplateProcessing that puts it before $A), or set {where} to false if the model was trained "
                "without one")
        if adds and not asks:
            bos = tokenizer.special_tokens.get("bos_token")
            raise ContractError(
                f"{tokenizer.path}: {where} says no BOS, but tokenizer.json adds {bos!r} to every prompt; remove "
                f"it from tokenizer.json's post_processor, or set {where} to true if the model was trained with one")


def turn_end_id(tokenizer: ModelTokenizer) -> int | None:
    """The special token the chat template writes directly after an assistant's reply (None: no template, or the
    reply is followed by no special token)."""
    if tokenizer.chat_template is None:
        return None
    text = tokenizer.chat_template.render([{"role": "user", "content": "Hi"},
                                           {"role": "assistant", "content": _REPLY}],
                                          tokenizer.special_tokens, add_generation_prompt=False)
    at = text.rfind(_REPLY)
    # whitespace a template writes between the reply and its turn end (Mistral's ' ' + eos_token) is not the end
    rest = text[at + len(_REPLY):].lstrip() if at >= 0 else ""
    ids = tokenizer.encode(rest) if rest else []
    return ids[0] if ids and ids[0] in tokenizer.special_ids else None


def proposed_end_ids(tokenizer: ModelTokenizer) -> tuple[int, ...] | None:
    """The ids that should end a response when the chat template ends a turn with one the folder does not list: the
    folder's own ids and that one. None when nothing is missing."""
    turn_end = turn_end_id(tokenizer)
    if turn_end is None or turn_end in tokenizer.eos_token_ids:
        return None
    return (*tokenizer.eos_token_ids, turn_end)


def check_end_ids(tokenizer: ModelTokenizer, option: str) -> None:
    """Refuse a folder whose chat template ends a turn with an id that does not end a response, naming the ids to
    write and `option`, which writes them."""
    proposed = proposed_end_ids(tokenizer)
    if proposed is not None:
        raise ContractError(
            f"{tokenizer.path}: its chat template ends a turn with {_name(tokenizer, proposed[-1])}, but the ids that "
            f"end a response ({tokenizer.eos_source}) are {list(tokenizer.eos_token_ids)}: a response would run on "
            f"past its turn; set eos_token_id to {list(proposed)} in {GENERATION_CONFIG_FILE} ({option} writes it)")


def check_model_tokens(tokenizer: ModelTokenizer, chat: bool, option: str) -> None:
    """The checks `use prepare` and `use init` make on a package's folder: the BOS always, the end of a turn when
    the population holds chat units (the template renders their prompts, and their replies end with its turn end)."""
    check_bos(tokenizer)
    if chat:
        check_end_ids(tokenizer, option)


def add_end_ids(tokenizer: ModelTokenizer) -> tuple[int, ...] | None:
    """Write the proposed end ids into the folder's `generation_config.json` (created if missing, its other settings
    kept) and return them; None when nothing was missing."""
    proposed = proposed_end_ids(tokenizer)
    if proposed is None:
        return None
    path = tokenizer.path / GENERATION_CONFIG_FILE
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if not isinstance(data, dict):
        raise ContractError(f"{path}: expected a JSON object; fix the file")
    data["eos_token_id"] = list(proposed)
    try:
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ContractError(f"{path}: cannot write the end ids ({exc.strerror or exc}); set eos_token_id to "
                            f"{list(proposed)} there yourself") from None
    return proposed


def _name(tokenizer: ModelTokenizer, token_id: int) -> str:
    return f"{tokenizer.decode([token_id], stop_at_eos=False)!r} (id {token_id})"
