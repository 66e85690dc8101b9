"""The real model's build reproduces the pinned bytes, and the core reads its tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from invar import canonical
from invar.tasks import ModelTokenizer

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PINS = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-instruct.pins.json"


def _pins() -> dict[str, Any]:
    pins: dict[str, Any] = json.loads(PINS.read_text(encoding="utf-8"))
    return pins


@pytest.mark.parametrize("which", ["smollm2-135m-instruct", "smollm2-135m-instruct-mlx"])
def test_folder_matches_the_pins(smollm2_build: tuple[Path, Path], which: str) -> None:
    folder = {p.name: p for p in smollm2_build}[which]
    pinned = _pins()["folders"][which]
    assert {p.name: canonical.file_sha256(p) for p in sorted(folder.iterdir())} == pinned["files"]
    assert canonical.tree_digest(folder) == pinned["tree_digest"]


def test_mlx_folder_differs_only_by_a_top_level_rope_theta(smollm2_dir: Path, smollm2_mlx_dir: Path) -> None:
    main = json.loads((smollm2_dir / "config.json").read_text(encoding="utf-8"))
    mlx = json.loads((smollm2_mlx_dir / "config.json").read_text(encoding="utf-8"))
    assert "rope_theta" not in main
    assert mlx == {**main, "rope_theta": main["rope_parameters"]["rope_theta"]}
    assert mlx["rope_theta"] == 100000.0  # mlx-lm's Llama would otherwise use its default of 10,000
    others = sorted(p.name for p in smollm2_dir.iterdir() if p.name != "config.json")
    assert others == sorted(p.name for p in smollm2_mlx_dir.iterdir() if p.name != "config.json")
    for name in others:
        assert (smollm2_dir / name).read_bytes() == (smollm2_mlx_dir / name).read_bytes(), name


def test_core_reads_the_tokenizer_and_renders_a_chat(smollm2_dir: Path) -> None:
    tokenizer = ModelTokenizer.from_model_dir(smollm2_dir)
    raw = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    im_start, im_end = raw.token_to_id("<|im_start|>"), raw.token_to_id("<|im_end|>")
    assert im_start is not None
    assert im_end is not None
    assert type(raw.model).__name__ == "BPE"
    assert tokenizer.vocab_size == 49152
    assert tokenizer.chat_template is not None
    assert tokenizer.eos_token_ids == (im_end,)
    messages = [{"role": "system", "content": "You add numbers. Answer with the number only."},
                {"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.render_prompt(messages=messages)
    assert text == ("<|im_start|>system\nYou add numbers. Answer with the number only.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.prompt_ids(messages=messages)
    assert ids[0] == im_start
    assert ids.count(im_start) == 3
    assert ids.count(im_end) == 2
    assert tokenizer.decode(ids, stop_at_eos=False) == text
