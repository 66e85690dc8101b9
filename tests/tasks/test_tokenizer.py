"""`ModelTokenizer`: the shipped model exactly as `Vocabulary`, every fast-tokenizer model type as transformers, the
eos resolution order, the refusal rules and the digest rule."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from support.bpe_model import MODEL_KINDS, build_bpe_tokenizer, build_tokenizer
from support.char_vocabulary import Vocabulary

from invar.contract.prepare import tokenizer_digest as prepare_tokenizer_digest
from invar.errors import ContractError, EvidenceError
from invar.formats.tokenizer import kept_files, tokenizer_digest, tokenizer_files
from invar.tasks import ModelTokenizer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "tiny-arith"

TEXTS = ["hello world", "The answer is 42.", "what's 12+7=19?", "  leading and trailing  ", "Grüße, naïve café!",
         "你好 🙂 ½", "tabs\tand\nnewlines", "sum of x and y isn't 3 , ok ?", "<|endoftext|>hello", "[CLS] model [SEP]",
         "<s> add </s>", ""]


def _population_prompts(n: int = 2000) -> list[str]:
    with (ROOT / "data" / "arith-eval.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for _, line in zip(range(n), f, strict=False)]


def test_shipped_model_encodes_as_vocabulary() -> None:
    core, vocab = ModelTokenizer.from_model_dir(SHIPPED), Vocabulary.from_model_dir(SHIPPED)
    prompts = _population_prompts()
    assert len(prompts) == 2000
    for prompt in prompts:
        assert core.encode(prompt, add_special_tokens=True) == vocab.encode(prompt, add_bos=True)
        assert core.encode(prompt, add_bos=True) == vocab.encode(prompt, add_bos=True)
        assert core.encode(prompt) == vocab.encode(prompt)
        assert core.prompt_ids(prompt=prompt) == vocab.encode(prompt, add_bos=True)
    for bad in ("1+a=", "2 + 3=", "4/2="):
        with pytest.raises(ContractError):
            vocab.encode(bad)
        with pytest.raises(ContractError, match="position"):
            core.encode(bad)


def test_shipped_model_decodes_as_vocabulary() -> None:
    core, vocab = ModelTokenizer.from_model_dir(SHIPPED), Vocabulary.from_model_dir(SHIPPED)
    assert (core.size, core.special_ids, core.bos_token_id, core.eos_token_id) == (
        vocab.size, vocab.special_ids, vocab.bos_token_id, vocab.eos_token_id)
    assert core.eos_token_ids == (vocab.eos_token_id,)
    rng = random.Random(0)
    for _ in range(3000):
        ids = [rng.randrange(vocab.size) for _ in range(rng.randint(0, 24))]
        assert core.decode(ids) == vocab.decode(ids), ids
        assert core.decode(ids, stop_at_eos=False) == vocab.decode(ids, stop_at_eos=False), ids
    for ids in ([vocab.size], [5, -1], [5, vocab.size + 7]):
        with pytest.raises(EvidenceError):
            vocab.decode(ids)
        with pytest.raises(EvidenceError, match="outside the vocabulary"):
            core.decode(ids)
    assert core.decode([5, vocab.eos_token_id, vocab.size]) == vocab.decode([5, vocab.eos_token_id, vocab.size])


def test_shipped_model_digest_is_the_pinned_one() -> None:
    assert tokenizer_files(SHIPPED) == ("tokenizer.json", "tokenizer_config.json")
    assert ModelTokenizer.from_model_dir(SHIPPED).digest == prepare_tokenizer_digest(SHIPPED)
    assert tokenizer_digest(SHIPPED) == prepare_tokenizer_digest(SHIPPED)


def _copy_shipped(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(SHIPPED / name, folder / name)
    return folder


def test_digest_binds_every_file_that_changes_the_core(tmp_path: Path) -> None:
    folder = _copy_shipped(tmp_path)
    base = tokenizer_digest(folder)
    assert base == prepare_tokenizer_digest(SHIPPED)
    seen = {base}
    # a byte of a bound file
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 64}))
    seen.add(tokenizer_digest(folder))
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
    tokenizer_json["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    seen.add(tokenizer_digest(folder))
    # each extra file, once present
    for name, body in (("chat_template.jinja", "{{ messages[0].content }}"),
                       ("chat_template.json", json.dumps({"chat_template": "x"})),
                       ("special_tokens_map.json", json.dumps({"eos_token": "</s>"}))):
        (folder / name).write_text(body)
        assert name in tokenizer_files(folder)
        seen.add(tokenizer_digest(folder))
    # eos ids from generation_config.json, by value; other generation settings do not count
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "temperature": 0.5}))
    assert tokenizer_digest(folder) in seen
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [2, 3]}))
    seen.add(tokenizer_digest(folder))
    assert len(seen) == 7  # the base, two edited files, three extras, the eos ids


def test_eos_resolution_order(tmp_path: Path) -> None:
    folder = build_bpe_tokenizer(tmp_path / "m", None, eos_token="<|endoftext|>",
                                 generation_eos=("<|im_end|>", "<|endoftext|>"))
    ids = {t: ModelTokenizer.from_model_dir(folder)._tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>",
                                                                                         "<|im_start|>")}
    # generation_config.json's list, in its order
    tok = ModelTokenizer.from_model_dir(folder)
    assert tok.eos_token_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])
    assert (tok.eos_token_id, tok.eos_source) == (ids["<|im_end|>"], "generation_config.json")
    (folder / "config.json").write_text(json.dumps({"eos_token_id": ids["<|im_start|>"]}))
    assert ModelTokenizer.from_model_dir(folder).eos_token_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])
    # no generation_config.json (or one without eos_token_id): config.json's
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 1.0}))
    assert ModelTokenizer.from_model_dir(folder).eos_token_ids == (ids["<|im_start|>"],)
    (folder / "generation_config.json").unlink()
    tok = ModelTokenizer.from_model_dir(folder)
    assert (tok.eos_token_ids, tok.eos_source) == ((ids["<|im_start|>"],), "config.json")
    # neither: tokenizer_config.json's eos_token
    (folder / "config.json").unlink()
    tok = ModelTokenizer.from_model_dir(folder)
    assert (tok.eos_token_ids, tok.eos_source) == ((ids["<|endoftext|>"],), "tokenizer_config.json")
    # decoding stops at any of them
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|im_end|>"], 7]}))
    tok = ModelTokenizer.from_model_dir(folder)
    assert tok.decode([30, 7, 31]) == tok.decode([30])
    assert tok.decode([30, ids["<|im_end|>"], 31]) == tok.decode([30])
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.vocab_size}))
    with pytest.raises(ContractError, match=r"generation_config\.json: eos token id"):
        ModelTokenizer.from_model_dir(folder)


def test_eos_resolution_agrees_with_transformers_generation(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = build_bpe_tokenizer(tmp_path / "m", None, generation_eos=("<|im_end|>", "<|endoftext|>"))
    generation = transformers.GenerationConfig.from_pretrained(str(folder))
    assert tuple(generation.eos_token_id) == ModelTokenizer.from_model_dir(folder).eos_token_ids


def test_missing_files_are_contract_errors(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"tokenizer\.json does not exist"):
        ModelTokenizer.from_model_dir(tmp_path)
    folder = build_bpe_tokenizer(tmp_path / "m", None)
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(ContractError, match=str(folder / "tokenizer_config.json")):
        ModelTokenizer.from_model_dir(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<nope>"}}))
    with pytest.raises(ContractError, match="eos_token '<nope>' is not in the vocabulary"):
        ModelTokenizer.from_model_dir(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"},
                                                              "bos_token": "<|im_start|>"}))
    tok = ModelTokenizer.from_model_dir(folder)  # {"content": ...} maps and plain strings alike
    assert tok.special_tokens == {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(ContractError, match="cannot be loaded"):
        ModelTokenizer.from_model_dir(folder)


def test_add_bos_without_a_bos_token_is_refused(tmp_path: Path) -> None:
    tok = ModelTokenizer.from_model_dir(build_bpe_tokenizer(tmp_path / "m", None))
    assert tok.bos_token_id is None
    with pytest.raises(ContractError, match="no bos_token"):
        tok.encode("hi", add_bos=True)
    assert tok.encode("hi", add_bos=False) == tok.encode("hi", add_special_tokens=True)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_model_types_match_transformers(kind: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = build_tokenizer(tmp_path / kind, kind)
    core = ModelTokenizer.from_model_dir(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert core.vocab_size == len(hf)
    assert core.special_ids == frozenset(i for i, t in hf.added_tokens_decoder.items() if t.special)
    encoded = 0
    for text in TEXTS:
        for special in (False, True):
            expected = hf(text, add_special_tokens=special)["input_ids"]
            try:
                ids = core.encode(text, add_special_tokens=special)
            except ContractError:
                # refused only where transformers' ids hold the unknown token or lost a character
                assert hf.unk_token_id in expected, (kind, text)
                continue
            encoded += 1
            assert ids == expected, (kind, text, special)
            assert core.decode(ids, stop_at_eos=False) == hf.decode(ids, skip_special_tokens=False), (kind, text)
    assert encoded >= 4, kind
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randrange(core.vocab_size) for _ in range(rng.randint(0, 16))]
        ids += rng.sample(sorted(core.special_ids), k=min(2, len(core.special_ids)))
        rng.shuffle(ids)
        assert core.decode(ids, stop_at_eos=False) == hf.decode(ids, skip_special_tokens=False), (kind, ids)
        stop = next((i for i, t in enumerate(ids) if t in core.eos_token_ids), len(ids))
        assert core.decode(ids) == hf.decode(ids[:stop], skip_special_tokens=False), (kind, ids)
    with pytest.raises(EvidenceError):
        core.decode([core.vocab_size])


def test_clean_up_tokenization_spaces_follows_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    wordpiece = ModelTokenizer.from_model_dir(build_tokenizer(tmp_path / "wp", "wordpiece"))
    assert wordpiece.clean_up_tokenization_spaces  # set, and WordPiece is not BPE
    bpe = build_bpe_tokenizer(tmp_path / "bpe", None, extra_config={"clean_up_tokenization_spaces": True})
    core = ModelTokenizer.from_model_dir(bpe)
    assert not core.clean_up_tokenization_spaces  # transformers ignores it for BPE
    hf = transformers.AutoTokenizer.from_pretrained(str(bpe))
    ids = core.encode("is it ok ? yes , it is .")
    assert core.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_unknown_and_dropped_characters_are_refused(tmp_path: Path) -> None:
    wordlevel = ModelTokenizer.from_model_dir(build_tokenizer(tmp_path / "wl", "wordlevel"))
    with pytest.raises(ContractError, match=r"'zebra' at position 6 of 'hello zebra'"):
        wordlevel.encode("hello zebra")
    assert wordlevel.encode("hello  world") == wordlevel.encode("hello world")  # whitespace splits words
    unigram = ModelTokenizer.from_model_dir(build_tokenizer(tmp_path / "ug", "unigram"))
    with pytest.raises(ContractError, match="position 6"):
        unigram.encode("hello 你")
    fallback = ModelTokenizer.from_model_dir(build_tokenizer(tmp_path / "bf", "bpe_byte_fallback"))
    ids = fallback.encode("hello 你好 🙂")  # bytes stand in for what the merges lack; nothing is unknown
    assert fallback._unk_id not in ids
    assert "你好🙂" in fallback.decode(ids)
    # a BPE without unknown token or bytes drops what it lacks: refused by the coverage rule
    folder = build_tokenizer(tmp_path / "bl", "bpe_bytelevel")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Whitespace"}
    data["decoder"] = None
    data["post_processor"] = None
    data["model"]["vocab"] = {k: v for k, v in data["model"]["vocab"].items() if len(k) == 1 and k.isascii()}
    data["model"]["merges"] = []
    vocab = {k: i for i, k in enumerate(data["model"]["vocab"])}
    data["model"]["vocab"] = vocab
    data["added_tokens"] = []
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "a"}))
    dropping = ModelTokenizer.from_model_dir(folder)
    assert dropping.encode("ab") == [vocab["a"], vocab["b"]]
    with pytest.raises(ContractError, match=r"character 'é' at position 1 of 'aé' .* drops it"):
        dropping.encode("aé")


def test_llama_model_folder_is_read(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from support.bpe_model import build_llama_model

    folder = build_llama_model(tmp_path / "llama", chat_template="{{ messages[0]['content'] }}")
    config = json.loads((folder / "config.json").read_text())
    assert (config["head_dim"], config["num_key_value_heads"], config["hidden_size"]) == (32, 2, 128)
    tok = ModelTokenizer.from_model_dir(folder)
    assert config["vocab_size"] == tok.vocab_size
    assert tok.eos_token_ids == (config["eos_token_id"],)
    assert tok.prompt_ids(messages=[{"role": "user", "content": "hi"}]) == tok.encode("hi")


MODEL_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
               "special_tokens_map.json", "generation_config.json", "config.json"]


@pytest.mark.parametrize("name", MODEL_FILES)
@pytest.mark.parametrize("odd", ["fifo", "link to /dev/zero", "huge"])
def test_every_model_file_the_core_reads_is_read_bounded_and_without_blocking(tmp_path: Path, name: str,
                                                                              odd: str) -> None:
    """A FIFO, a device or a file past its bound in a model folder's place is one line naming the file, never a
    hang, a read without end, nor taken for absent (issue 51)."""
    root = _copy_shipped(tmp_path)
    path = root / name
    path.unlink(missing_ok=True)
    if odd == "fifo":
        os.mkfifo(path)
        said = f"model file {path} is a FIFO, not a regular file"
    elif odd == "link to /dev/zero":
        path.symlink_to("/dev/zero")
        said = f"model file {path} is a character device, not a regular file"
    else:
        bound = (1 << 28) if name == "tokenizer.json" else (1 << 24)
        # Valid JSON (or template text), one byte past the bound: read whole, it would be taken.
        filler = b"{% if false %}" + b" " * bound + b"{% endif %}" if name == "chat_template.jinja" else \
            b'{"pad": "' + b"x" * bound + b'"}'
        path.write_bytes(filler)
        said = f"model file {path} holds {len(filler):,} bytes, over the {bound:,} a model file may hold"
    # What a run keeps of the folder reads every one of these files; the tokenizer, all but config.json (whose eos
    # id generation_config.json overrides here).
    with pytest.raises(ContractError, match=f"^{re.escape(said)}: a model folder holds the regular files"):
        kept_files(root)
    if name != "config.json":
        with pytest.raises(ContractError, match=f"^{re.escape(said)}: a model folder holds the regular files"):
            ModelTokenizer.from_model_dir(root)
