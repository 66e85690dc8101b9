"""A shipped model folder's tokenizer files (no weights) copied for a test to change, as a user's own conversion
might leave them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
"""SmolLM2-135M-Instruct as scripts/build_smollm2.py converts it from its GGUF file."""
SMOLLM2_GGUF = ROOT / "models" / "smollm2-135m-instruct-q4_1"
TINY = ROOT / "models" / "tiny-arith"
FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "config.json")


def tokenizer_copy(source: Path, dest: Path, **config: object) -> Path:
    """`source`'s tokenizer and config files in the new folder `dest`, `tokenizer_config.json` updated with
    `config`."""
    dest.mkdir()
    for name in FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, dest / name)
    path = dest / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}), encoding="utf-8")
    return dest
