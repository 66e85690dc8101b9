"""Small tokenizers and a random-weight Llama model, built at test time with the `tokenizers` library.

`build_bpe_tokenizer` trains a byte-level BPE (~400 ids) with chosen special tokens and writes a model folder's
tokenizer files; `build_tokenizer` does the same for each fast-tokenizer model type; `build_llama_model` adds a
random Llama beside a tokenizer. torch and transformers are imported inside `build_llama_model` only.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_WORDS = ("the", "model", "answer", "is", "add", "sum", "of", "and", "what", "tokens", "hello", "world", "system",
          "user", "assistant", "think", "please", "compute", "number", "Grüße", "naïve", "café", "x", "y")


def training_lines(n: int = 400, seed: int = 0) -> list[str]:
    """`n` lines of generated text: words, digits, arithmetic and punctuation (deterministic for `seed`)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 9))]
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        tail = rng.choice([f"{a}+{b}={a + b}", f"{a}-{b}={a - b}", f"{a}*{b}", "?", "!", ".", ",", "(ok)", "'s"])
        lines.append(" ".join(words) + " " + tail)
    return lines


def _write_config(folder: Path, tokenizer: Tokenizer, config: Mapping[str, Any],
                  generation_eos: Sequence[str] | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    body = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    if generation_eos is not None:
        ids = [tokenizer.token_to_id(t) for t in generation_eos]
        assert all(i is not None for i in ids), generation_eos
        (folder / "generation_config.json").write_text(
            json.dumps({"eos_token_id": ids if len(ids) > 1 else ids[0]}, indent=2) + "\n", encoding="utf-8")


def _bos_processor(bos: str, tokenizer: Tokenizer) -> processors.TemplateProcessing:
    bos_id = tokenizer.token_to_id(bos)
    return processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)])


def build_bpe_tokenizer(folder: str | Path, chat_template: str | None = None, *,
                        specials: Sequence[str] = CHATML_SPECIALS, bos_token: str | None = None,
                        eos_token: str | None = "<|im_end|>", pad_token: str | None = "<|endoftext|>",
                        added: Sequence[str] = (), generation_eos: Sequence[str] | None = ("<|im_end|>",),
                        vocab_size: int = 400, extra_config: Mapping[str, Any] | None = None) -> Path:
    """Train a byte-level BPE on `training_lines()` and write tokenizer.json, tokenizer_config.json (with
    `chat_template`, bos/eos/pad) and, unless `generation_eos` is None, generation_config.json into `folder`.

    `specials` become special added tokens (ids 0..len-1), `added` ordinary added tokens (e.g. `<think>`); a
    `bos_token` is put before a text prompt by the post-processor (as Llama-3's tokenizer does).
    """
    root = Path(folder)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(training_lines(), trainer=trainer)
    if added:
        tokenizer.add_tokens(list(added))
    tokenizer.post_processor = (_bos_processor(bos_token, tokenizer) if bos_token is not None
                                else processors.ByteLevel(trim_offsets=False))
    config: dict[str, Any] = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token,
                              "clean_up_tokenization_spaces": False, **(extra_config or {})}
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write_config(root, tokenizer, config, generation_eos)
    return root


def _with_byte_fallback(tokenizer: Tokenizer) -> Tokenizer:
    # sentencepiece-style: the 256 byte tokens <0x00>..<0xFF> stand in for any character the merges lack
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(data))


MODEL_KINDS = ("bpe_bytelevel", "bpe_byte_fallback", "unigram", "wordpiece", "wordlevel")


def build_tokenizer(folder: str | Path, kind: str) -> Path:
    """Train a tokenizer of model type `kind` (one of `MODEL_KINDS`) and write its tokenizer files into `folder`.

    bpe_bytelevel: GPT-2 style, `<|endoftext|>` specials; bpe_byte_fallback: Llama-2 style (Metaspace, byte
    fallback, `<s>` added by the post-processor); unigram: NFKC + Metaspace; wordpiece: BERT style (lower-cased,
    `[CLS] $A [SEP]`, `clean_up_tokenization_spaces=True`); wordlevel: whitespace-split words with `[UNK]`.
    """
    root = Path(folder)
    lines = training_lines()
    if kind == "bpe_bytelevel":
        return build_bpe_tokenizer(root, specials=("<|endoftext|>",), eos_token="<|endoftext|>", pad_token=None,
                                   generation_eos=None)
    if kind == "bpe_byte_fallback":
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                      limit_alphabet=60)
        tokenizer.train_from_iterator(lines, trainer=trainer)
        tokenizer = _with_byte_fallback(tokenizer)
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Metaspace(replacement="▁", prepend_scheme="first")])
        tokenizer.post_processor = _bos_processor("<s>", tokenizer)
        config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    elif kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
                                          show_progress=False)
        tokenizer.train_from_iterator(lines, trainer=trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tokenizer.token_to_id("</s>"))])
        config = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    elif kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                            limit_alphabet=60)
        tokenizer.train_from_iterator(lines, trainer=trainer)
        cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
        config = {"cls_token": "[CLS]", "sep_token": "[SEP]", "eos_token": "[SEP]", "unk_token": "[UNK]",
                  "pad_token": "[PAD]", "mask_token": "[MASK]", "clean_up_tokenization_spaces": True}
    elif kind == "wordlevel":
        tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"], show_progress=False)
        tokenizer.train_from_iterator(lines, trainer=trainer)
        config = {"eos_token": "[EOS]", "unk_token": "[UNK]"}
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {MODEL_KINDS}")
    _write_config(root, tokenizer, config, None)
    return root


def build_llama_model(folder: str | Path, seed: int = 0, chat_template: str | None = None) -> Path:
    """A random-weight Llama (float32, hidden 128, 2 layers, 4 heads, 2 KV heads, head_dim 32) beside a byte-level
    BPE tokenizer (`build_bpe_tokenizer`) in `folder`, saved with safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root = Path(folder)
    if not (root / "tokenizer.json").is_file():
        build_bpe_tokenizer(root, chat_template)
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|im_end|>")
    config = LlamaConfig(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), hidden_size=128,
                         intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=512, tie_word_embeddings=True,
                         eos_token_id=eos, pad_token_id=tokenizer.token_to_id("<|endoftext|>"), bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(root, safe_serialization=True)
    return root
