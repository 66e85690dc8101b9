"""One model folder per test session that is not the shipped one: a random-weight Llama with a byte-level BPE.

`any_model` builds it once (about 10 s, most of it importing torch and transformers):

- the tokenizer is trained at test time (`support.bpe_model.build_bpe_tokenizer`): byte-level BPE, ChatML
  specials (`<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2), a ChatML chat template in
  `tokenizer_config.json`, no BOS, no pad token, and a vocabulary of 397 ids (a prime: a multiple of nothing an
  engine pads to);
- the model is `support.bpe_model.build_llama_model`'s random Llama (float32, hidden 128, 2 layers, 4 heads, 2 KV
  heads, head_dim 32, tied embeddings), with `pad_token_id` removed and rope θ = 500,000 (Llama-3's, which
  transformers 5 writes under `rope_parameters` only);
- `generation_config.json` names two ids that end a response, `<|im_end|>` and `<|endoftext|>`, while
  `config.json` names `<|im_end|>` only (as Qwen2.5's and Llama-3's folders do);
- random weights almost never emit an end-of-sequence token, so two rows of the tied embedding are set: the row of
  `<|endoftext|>` to 1.5 x that of the token the greedy response to `EOS_PROMPTS[0]` gives at step 3, and the row
  of `<|im_end|>` likewise for `EOS_PROMPTS[1]`. Only those two ids' logits change (the embedding is tied, and
  neither id is in any prompt), so each of these prompts' greedy responses ends early with that id: one that only
  `generation_config.json` names, and one every file names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VOCAB_SIZE = 397
ROPE_THETA = 500_000.0
EOS_PROMPTS = ("what is the sum of 12 and 30?", "please compute the number")
"""Prompts whose greedy responses end with `<|endoftext|>` and `<|im_end|>` (see the module docstring)."""
EOS_STEP = 3
PROJ_SCALE, NORM_SCALE, EOS_SCALE = 8.0, 10.0, 1.05


def _greedy(model: object, ids: list[int], steps: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,  # type: ignore[attr-defined]
                             eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def build_any_model(root: Path) -> Path:
    """Write the folder the module docstring describes into `root`."""
    import torch
    from safetensors.torch import load_file, save_file
    from support.bpe_model import build_bpe_tokenizer, build_llama_model
    from transformers import LlamaForCausalLM

    build_bpe_tokenizer(root, CHATML_TEMPLATE, pad_token=None, vocab_size=VOCAB_SIZE)
    build_llama_model(root, seed=0)
    config_path = root / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    assert config["vocab_size"] == VOCAB_SIZE, config["vocab_size"]
    config["pad_token_id"] = None
    config["rope_parameters"] = {"rope_theta": ROPE_THETA, "rope_type": "default"}
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    endoftext, im_end = 0, 2
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, endoftext]}, indent=2) + "\n",
                                                 encoding="utf-8")

    from transformers import AutoTokenizer

    # Init-scale weights (std 0.02) make a near-uniform model that repeats its last token: scaled up, the layers
    # matter and the distribution has a clear top.
    weights_path = root / "model.safetensors"
    weights = load_file(weights_path)
    for name, tensor in weights.items():
        if name.endswith("proj.weight"):
            tensor.mul_(PROJ_SCALE)
    weights["model.norm.weight"].mul_(NORM_SCALE)
    save_file(weights, weights_path, metadata={"format": "pt"})
    tokenizer = AutoTokenizer.from_pretrained(root)
    model = LlamaForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    embed = weights["model.embed_tokens.weight"]
    for eos, prompt in zip((endoftext, im_end), EOS_PROMPTS, strict=True):
        greedy = _greedy(model, tokenizer(prompt)["input_ids"], EOS_STEP + 1)
        assert greedy[EOS_STEP] not in greedy[:EOS_STEP], (prompt, greedy)
        embed[eos] = EOS_SCALE * embed[greedy[EOS_STEP]]
    save_file(weights, weights_path, metadata={"format": "pt"})
    model = LlamaForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    for eos, prompt in zip((endoftext, im_end), EOS_PROMPTS, strict=True):
        greedy = _greedy(model, tokenizer(prompt)["input_ids"], EOS_STEP + 1)
        assert eos in greedy[1:], (prompt, greedy)
    return root


@pytest.fixture(scope="session")
def any_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_any_model(tmp_path_factory.mktemp("any-model") / "llama-bpe")
