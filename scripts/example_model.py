"""Write a stand-in for "your model": a random-weight Llama with a byte-level BPE tokenizer (trained here with the
`tokenizers` library), ChatML special tokens and a chat template, saved as transformers saves any model folder.

    python scripts/example_model.py OUT_DIR

The worked example of docs/your-model.md runs on it (scripts/your_model.sh). Its weights are random, so every
answer is wrong: the example shows the path from a model folder to a decision, not a model's skill.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The builder is the one the test suite uses, so the example and the tests run the same kind of folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.bpe_model import build_llama_model

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def main() -> None:
    if sys.argv[1:] in (["--help"], ["-h"]):
        print(__doc__.strip())
        return
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):  # an option is not a folder to write a model into
        sys.exit("usage: python scripts/example_model.py OUT_DIR")
    out = Path(sys.argv[1])
    if (out / "config.json").is_file():
        print(f"{out}: a model is already there; kept")
        return
    build_llama_model(out, seed=0, chat_template=CHATML)
    print(f"{out}: random Llama, BPE tokenizer with a chat template")


if __name__ == "__main__":
    main()
