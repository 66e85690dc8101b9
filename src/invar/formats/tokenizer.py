"""The core's own tokenizer: a model folder's `tokenizer.json`, run by the `tokenizers` library, never by an engine.

The core scores responses from the token ids a worker reports, never from the worker's text, and it tokenizes
prompts itself, so both directions come from the files a contract pins. `ModelTokenizer` loads `tokenizer.json`
with `tokenizers.Tokenizer.from_str` (any fast-tokenizer model: byte-level or byte-fallback BPE, Unigram,
WordPiece, WordLevel) and reads `tokenizer_config.json` for the named special tokens, the decode clean-up switch
and the chat template (rendered by `invar.formats.chat`). Decoding keeps special tokens as their text, as
`AutoTokenizer.decode(ids, skip_special_tokens=False)` does, so a response containing one never passes as an
answer; it stops before the first id that ends a response. On the shipped character-level model it gives exactly
what `Vocabulary` gives. Every file of the folder it reads is read whole by `invar.regular_files`, bounded and
without blocking, so a FIFO or a huge file in the folder is one line naming it, never a hang.

What the core computes from a folder is bound by `tokenizer_digest` (see `tokenizer_files` for the rule), which
equals `invar.contract.prepare.tokenizer_digest` for a folder holding only `tokenizer.json`,
`tokenizer_config.json` and eos ids that agree with the tokenizer's own `eos_token`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Encoding, Tokenizer
from tokenizers.processors import ByteLevel, TemplateProcessing

from invar import canonical
from invar.errors import ContractError, EvidenceError
from invar.formats.chat import LEGACY_TEMPLATE_FILE, SPECIAL_TOKEN_NAMES, TEMPLATE_FILE, ChatTemplate, find_template
from invar.regular_files import MODEL_FILE_BYTES, TOKENIZER_FILE_BYTES, read_model_file


class PromptUnit(Protocol):
    """What `ModelTokenizer.unit_prompt` reads of a population unit (`invar.tasks.population.Unit`)."""

    @property
    def prompt(self) -> str | None: ...

    @property
    def messages(self) -> Sequence[Any] | None: ...

    def chat(self) -> list[dict[str, str]]: ...


BASE_FILES = ("tokenizer.json", "tokenizer_config.json")
"""Files every model folder must hold; `invar.contract.prepare.TOKENIZER_FILES` pins the same two."""
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
EXTRA_FILES = (TEMPLATE_FILE, LEGACY_TEMPLATE_FILE, SPECIAL_TOKENS_MAP_FILE)
"""Files that, when present, change what the core renders or which special tokens it names."""
GENERATION_CONFIG_FILE = "generation_config.json"
MODEL_CONFIG_FILE = "config.json"


def _read_json(path: Path, required: bool = True) -> Any:
    if not path.exists():
        if not required:
            return None
        raise ContractError(f"{path} does not exist: the model folder must hold the tokenizer files it was saved with")
    try:
        return json.loads(read_model_file(path).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ContractError(f"{path} is not valid JSON ({exc}): re-save the file") from None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # older files store {"content": ..., "lstrip": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_files(model_dir: str | Path) -> tuple[str, ...]:
    """Names of the files in `model_dir` whose bytes the tokenizer digest binds, in a fixed order.

    The rule: always `tokenizer.json` and `tokenizer_config.json`; then each of `chat_template.jinja`,
    `chat_template.json`, `special_tokens_map.json` that is present. `generation_config.json` and `config.json`
    are not bound by their bytes (they hold sampling and architecture settings the core does not use, and binding
    them would change the shipped model's pinned digest); the one thing the core takes from them, the ids that end
    a response, is bound by value instead: `tokenizer_digest` adds the resolved `eos_token_ids` whenever they
    differ from the id of `tokenizer_config.json`'s `eos_token`. So every input of encoding, decoding and template
    rendering is bound, and a folder with no extras and agreeing eos ids keeps the digest
    `invar.contract.prepare.tokenizer_digest` gives it.
    """
    root = Path(model_dir)
    # Present is what exists: a FIFO or a folder under a tokenizer file's name is refused when read, not skipped.
    return BASE_FILES + tuple(name for name in EXTRA_FILES if (root / name).exists())


def _eos_from(value: Any, where: Path) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ContractError(f"{where}: eos_token_id must be an integer or a non-empty list of integers")
    return tuple(dict.fromkeys(values))  # repeated ids say nothing more


def resolve_eos_ids(model_dir: Path, tokenizer_eos_id: int | None) -> tuple[tuple[int, ...], str]:
    """The ids that end a response, shape [E] (E >= 1, first is the main one), and the file they came from.

    Transformers' generation takes them from the model's generation config: `generation_config.json`'s
    `eos_token_id` when that file exists (`GenerationConfig.from_pretrained`), else `config.json`'s top-level
    `eos_token_id` (the fallback in `adjust_generation_fn`), and `_prepare_special_tokens` treats an int or a list
    alike as a set of stop ids. The core follows that order, skipping a file whose `eos_token_id` is missing or
    null (where transformers would then never stop, the core falls through), and ends with the tokenizer's own
    `eos_token`. Raises `ContractError` when none of them names an id.
    """
    for name in (GENERATION_CONFIG_FILE, MODEL_CONFIG_FILE):
        path = model_dir / name
        data = _read_json(path, required=False)
        if isinstance(data, dict):
            ids = _eos_from(data.get("eos_token_id"), path)
            if ids is not None:
                return ids, name
    if tokenizer_eos_id is not None:
        return (tokenizer_eos_id,), "tokenizer_config.json"
    raise ContractError(f"{model_dir}: no eos_token_id in generation_config.json or config.json and no eos_token in "
                        "tokenizer_config.json: declare the token that ends a response")


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    """A model folder's tokenizer: ids are in [0, vocab_size); `decode` and `encode` run `tokenizer.json`."""

    path: Path
    """The model folder."""
    vocab_size: int
    """Number of token ids, added tokens included."""
    special_ids: frozenset[int]
    """Ids of added tokens marked special (e.g. `<s>`, `<|im_end|>`)."""
    bos_token_id: int | None
    """Id of `tokenizer_config.json`'s `bos_token`, if it names one."""
    eos_token_ids: tuple[int, ...]
    """Ids that end a response (see `resolve_eos_ids`), shape [E], E >= 1."""
    eos_source: str
    """The file `eos_token_ids` came from."""
    special_tokens: Mapping[str, str]
    """Named special tokens and their text, e.g. {"bos_token": "<s>"}, as passed to a chat template."""
    chat_template: ChatTemplate | None
    """The folder's chat template, if it has one."""
    clean_up_tokenization_spaces: bool
    """Whether `decode` applies transformers' `clean_up_tokenization` (never for a BPE model, as transformers)."""
    digest: str
    """Hex sha256 binding every input the core takes from the folder (see `tokenizer_files`)."""
    _tokenizer: Tokenizer = field(repr=False, compare=False)
    _unk_id: int | None = field(repr=False, compare=False)
    _frame: tuple[list[int], list[int]] | None = field(default=None, repr=False, compare=False)
    """The ids the post-processor puts before and after every text's own ids, where they are the same for every text
    (`_fixed_frame`): `text_ids` then adds them without running the post-processor per text."""

    @property
    def eos_token_id(self) -> int:
        """The main id that ends a response (the first of `eos_token_ids`)."""
        return self.eos_token_ids[0]

    @property
    def size(self) -> int:
        """Number of token ids (`vocab_size`; `Vocabulary.size`'s name)."""
        return self.vocab_size

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ModelTokenizer:
        """Load `tokenizer.json` and `tokenizer_config.json` (both required) and the optional extras of a folder.

        Raises `ContractError` naming the file and what to change when one is missing, malformed, or names a
        special token the vocabulary lacks.
        """
        root = Path(path)
        tokenizer_path = root / "tokenizer.json"
        if not tokenizer_path.exists():
            raise ContractError(f"{tokenizer_path} does not exist: save the model's fast tokenizer (tokenizer.json) "
                                "into the folder")
        config_path = root / "tokenizer_config.json"
        config = _read_json(config_path)
        if not isinstance(config, dict):
            raise ContractError(f"{config_path}: expected a JSON object")
        raw = read_model_file(tokenizer_path, TOKENIZER_FILE_BYTES)
        try:
            tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # the library raises its own untyped errors for malformed files
            raise ContractError(f"{tokenizer_path} cannot be loaded by the tokenizers library "
                                f"({' '.join(str(exc).split())}): re-save the tokenizer") from None
        legacy = _read_json(root / SPECIAL_TOKENS_MAP_FILE, required=False)
        legacy = legacy if isinstance(legacy, dict) else {}
        special_tokens: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            # transformers reads special_tokens_map.json only to fill what the config leaves unset
            text = _token_text(config.get(name))
            if text is None:
                text = _token_text(legacy.get(name))
            if text is not None:
                special_tokens[name] = text

        def token_id(name: str) -> int | None:
            text = special_tokens.get(name)
            if text is None:
                return None
            found = tokenizer.token_to_id(text)
            if found is None:
                raise ContractError(f"{config_path}: {name} {text!r} is not in the vocabulary of {tokenizer_path}")
            return found

        bos_id = token_id("bos_token")
        own_eos_id = token_id("eos_token")
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        eos_ids, eos_source = resolve_eos_ids(root, own_eos_id)
        for eos in eos_ids:
            if not 0 <= eos < vocab_size:
                raise ContractError(f"{root / eos_source}: eos token id {eos} is outside the vocabulary of "
                                    f"{vocab_size} tokens")
        unk_text = special_tokens.get("unk_token")
        unk_id = None if unk_text is None else tokenizer.token_to_id(unk_text)
        if unk_id is None:
            unk_id = _model_unk_id(tokenizer)
        model_type = type(tokenizer.model).__name__
        clean_up = bool(config.get("clean_up_tokenization_spaces", False)) and (
            model_type != "BPE"
            or bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)))
        return cls(
            path=root,
            vocab_size=vocab_size,
            special_ids=frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special),
            bos_token_id=bos_id,
            eos_token_ids=eos_ids,
            eos_source=eos_source,
            special_tokens=special_tokens,
            chat_template=find_template(root, config),
            clean_up_tokenization_spaces=clean_up,
            digest=_digest(root, eos_ids, own_eos_id),
            _tokenizer=tokenizer,
            _unk_id=unk_id,
            _frame=_fixed_frame(tokenizer),
        )

    def encode(self, text: str, add_special_tokens: bool = False, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, shape [T], as the tokenizer encodes it; the post-processor's tokens (e.g. BOS) too
        when `add_special_tokens` (as engines tokenize a text prompt).

        `add_bos` is `Vocabulary.encode`'s name for the same switch and, when given, decides it; `add_bos=True`
        on a tokenizer without a `bos_token` raises `ContractError`, as `Vocabulary` does. Text that spells a
        special token (e.g. `<s>`) is encoded as that token, as engines do.

        The rule for refusing text (`ContractError` naming the character and its position): a text is refused
        when its encoding holds the unknown token, or when a character other than whitespace is covered by no
        token (a tokenizer without an unknown token drops it). Either way the model would not see what the text
        says. Whitespace that a pre-tokenizer splits on and drops is how WordPiece/WordLevel define words and is
        accepted; so is text that a normalizer rewrites (e.g. lower-cases), which is why the rule is not "decoding
        gives the text back".
        """
        if add_bos is not None:
            if add_bos and self.bos_token_id is None:
                raise ContractError(f"{self.path / 'tokenizer_config.json'} has no bos_token: "
                                    "encode with add_bos=False")
            add_special_tokens = add_bos
        encoding = self._checked(text)
        if add_special_tokens:
            # what `Tokenizer.encode` does after encoding the text's own ids: the text is not encoded twice
            encoding = self._tokenizer.post_process(encoding, None, True)
        return list(encoding.ids)

    def _checked(self, text: str) -> Encoding:
        """The text's own encoding (no special tokens added), once the refusal rule of `encode` has passed."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        unk = self._unk_id
        covered = bytearray(len(text))
        if unk is not None and unk in encoding.ids:
            for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
                if token_id == unk and token_id not in self._declared_text_ids(text, start, end):
                    position = start if start < len(text) else 0
                    piece = text[start:end] or text[position:position + 1]
                    what = f"character {piece!r}" if len(piece) == 1 else repr(piece)
                    raise ContractError(
                        f"{what} at position {position} of {text!r} is not in the model's vocabulary "
                        f"({self.path / 'tokenizer.json'} encodes it as the unknown token): use only text the "
                        "tokenizer knows")
                covered[start:end] = b"\x01" * (end - start)
        else:
            for start, end in encoding.offsets:
                covered[start:end] = b"\x01" * (end - start)
        # Most texts are covered whole: the characters are looked at one by one only where one is not.
        if covered.count(0):
            for position, char in enumerate(text):
                if not covered[position] and not char.isspace():
                    raise ContractError(
                        f"character {char!r} at position {position} of {text!r} is not in the model's vocabulary "
                        f"({self.path / 'tokenizer.json'} drops it): use only characters the tokenizer knows")
        return encoding

    def _declared_text_ids(self, text: str, start: int, end: int) -> frozenset[int]:
        # the unknown token written out in the text (e.g. "<unk>") is that token, not an unknown character
        spelled = self._tokenizer.token_to_id(text[start:end])
        return frozenset() if spelled is None else frozenset({spelled})

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of token ids `ids` (shape [T], any integer type), special tokens kept as their text, as
        `AutoTokenizer.decode(ids, skip_special_tokens=False)`; stops before the first of `eos_token_ids` when
        `stop_at_eos`.

        Raises `EvidenceError` for an id outside [0, vocab_size) before that stop (tokens of some other model).
        """
        stop = frozenset(self.eos_token_ids) if stop_at_eos else frozenset()
        kept: list[int] = []
        for raw in ids:
            token_id = int(raw)
            if not 0 <= token_id < self.vocab_size:
                raise EvidenceError(
                    f"token id {token_id} is outside the vocabulary of {self.vocab_size} tokens: "
                    "the tokens come from a different model than the one named"
                )
            if token_id in stop:
                break
            kept.append(token_id)
        text = self._tokenizer.decode(kept, skip_special_tokens=False)
        return _clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    def render_prompt(self, prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
                      template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The text a model is given: `prompt` itself, or `messages` rendered by the chat template with the
        generation prompt added. Exactly one of `prompt` and `messages` must be given.

        Raises `ContractError` when both or neither are given, when `messages` are given to a model without a chat
        template, or when the template fails on them.
        """
        if prompt is not None and messages is None:
            if template_kwargs:
                raise ContractError("template keyword arguments apply only to chat messages: drop them or use messages")
            return prompt
        if messages is None or prompt is not None:
            raise ContractError("give exactly one of a plain prompt and chat messages")
        if self.chat_template is None:
            raise ContractError(f"{self.path} has no chat template (no chat_template.jinja, no chat_template in "
                                "tokenizer_config.json): give a plain prompt instead of messages")
        return self.chat_template.render(messages, self.special_tokens, add_generation_prompt=True,
                                         template_kwargs=template_kwargs)

    def prompt_ids(self, prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
                   template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of the model's input, shape [T]: a plain `prompt` encoded with special tokens (as engines
        tokenize a text prompt, e.g. with BOS), or `messages` rendered (`render_prompt`) and encoded without them,
        as `apply_chat_template(..., tokenize=True)` does (the template writes its own BOS).

        Raises `ContractError` as `render_prompt` and `encode` do.
        """
        text = self.render_prompt(prompt, messages, template_kwargs)
        if prompt is not None:
            return self.text_ids(text)
        # a rendered template holds special tokens and characters of the owner's messages alike; only the latter
        # can be unknown, and the same refusal rule applies
        return self.encode(text, add_special_tokens=False)


    def unit_prompt(self, unit: PromptUnit) -> tuple[str, list[int]]:
        """A population unit as the model is given it: (the text, its token ids). A plain prompt as it is, encoded
        with the tokenizer's special tokens (as an engine adds them to text); chat messages rendered by the chat
        template with the generation prompt and encoded without them (the template writes its own). A use's plan
        and a training cycle's requests both come from here."""
        messages = None if unit.messages is None else unit.chat()
        text = self.render_prompt(prompt=unit.prompt, messages=messages)
        return text, self.text_ids(text) if unit.prompt is not None else self.encode(text, add_special_tokens=False)

    def text_ids(self, text: str) -> list[int]:
        """Token ids of a plain text prompt, shape [T]: encoded with the special tokens the tokenizer's
        post-processor adds (e.g. BOS), except one the text already spells at the place it would be added. A text
        that begins with the BOS text (a chat prompt rendered elsewhere and given as text) gets no second BOS, and
        one that ends with an EOS the post-processor appends gets no second EOS: special tokens are never added
        twice. Raises `ContractError` as `encode` does."""
        encoding = self._checked(text)
        bare = encoding.ids
        frame = self._frame
        if frame is not None and not (bare and bare[0] in frame[0]):
            # The fixed frame is where the search below finds the text's ids, unless they begin with one of the
            # head's ids (then the search may find them earlier, and runs).
            head, tail = frame
        else:
            full = self._tokenizer.post_process(encoding, None, True).ids
            split = _split(full, bare)
            if split is None:  # a post-processor that rewrites the text's ids: nothing to compare, keep what it made
                return full
            head, tail = split
        if head and bare[:len(head)] == head:
            head = []
        if tail and bare[len(bare) - len(tail):] == tail:
            tail = []
        return head + bare + tail


def _split(full: list[int], bare: list[int]) -> tuple[list[int], list[int]] | None:
    """(head, tail) with `full == head + bare + tail`, at the first place `bare` occurs in `full`; None if nowhere."""
    start = next((k for k in range(len(full) - len(bare) + 1) if full[k:k + len(bare)] == bare), None)
    return None if start is None else (full[:start], full[start + len(bare):])


_FRAME_PROBES = ("a", "0", "1 2", "x y z", "\u00e9")
"""Texts whose post-processed ids show a post-processor's frame: any texts will do that encode to some ids."""


def _fixed_frame(tokenizer: Tokenizer) -> tuple[list[int], list[int]] | None:
    """The (head, tail) ids a one-sequence post-processor wraps every text in, where they do not depend on the text:
    no post-processor, a `TemplateProcessing` (special tokens around `$A`) or a `ByteLevel` one (it trims offsets, not
    ids), seen the same around every probe's ids. None for any other post-processor (it may rewrite the text's ids),
    which `text_ids` then runs per text."""
    processor = tokenizer.post_processor
    if processor is not None and not isinstance(processor, TemplateProcessing | ByteLevel):
        return None
    frames = set()
    for probe in _FRAME_PROBES:
        encoding = tokenizer.encode(probe, add_special_tokens=False)
        if not encoding.ids:
            continue
        split = _split(tokenizer.post_process(encoding, None, True).ids, encoding.ids)
        if split is None:
            return None
        frames.add((tuple(split[0]), tuple(split[1])))
    if len(frames) != 1:
        return None
    head, tail = frames.pop()
    return list(head), list(tail)


def _model_unk_id(tokenizer: Tokenizer) -> int | None:
    unk = getattr(tokenizer.model, "unk_token", None)  # BPE, WordPiece, WordLevel
    if isinstance(unk, str):
        return tokenizer.token_to_id(unk)
    unk_index = getattr(tokenizer.model, "unk_id", None)  # Unigram
    return unk_index if isinstance(unk_index, int) else None


def _clean_up_tokenization(text: str) -> str:
    # transformers' PreTrainedTokenizerBase.clean_up_tokenization, verbatim in effect
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
            .replace(" 've", "'ve").replace(" 're", "'re"))


def _digest(root: Path, eos_ids: tuple[int, ...], own_eos_id: int | None) -> str:
    bound: dict[str, Any] = {name: canonical.sha256(read_model_file(root / name, _limit(name)))
                             for name in tokenizer_files(root)}
    if eos_ids != ((own_eos_id,) if own_eos_id is not None else ()):
        bound["eos_token_ids"] = list(eos_ids)
    return canonical.digest(bound)


def tokenizer_digest(model_dir: str | Path) -> str:
    """Hex sha256 over the files `tokenizer_files` names and, where they differ from the tokenizer's own
    `eos_token`, the resolved eos ids (see `tokenizer_files`). Raises `ContractError` as `from_model_dir` does."""
    return ModelTokenizer.from_model_dir(model_dir).digest


def kept_files(model_dir: str | Path) -> dict[str, bytes]:
    """The bytes of every file the core's tokenizer reads from `model_dir` (name → bytes), for a run to keep.

    A run that keeps them can be decided, and its text recomputed, away from the model folder: `from_kept` loads
    the same tokenizer from them, and its `digest` is checked against the contract's as the folder's would be.
    """
    root = Path(model_dir)
    names = (*tokenizer_files(root), GENERATION_CONFIG_FILE, MODEL_CONFIG_FILE)
    return {name: read_model_file(root / name, _limit(name)) for name in names if (root / name).exists()}


def _limit(name: str) -> int:
    """The most bytes the core reads of the model folder's file `name`."""
    return TOKENIZER_FILE_BYTES if name == "tokenizer.json" else MODEL_FILE_BYTES


def from_kept(files: Mapping[str, bytes], scratch: str | Path) -> ModelTokenizer:
    """The tokenizer of a run's kept files (see `kept_files`), written into the empty folder `scratch` and loaded
    from there. Raises `EvidenceError` when a base file is missing or a name is not a plain file name."""
    root = Path(scratch)
    for name in BASE_FILES:
        if not isinstance(files.get(name), bytes):
            raise EvidenceError(f"the run's kept tokenizer lacks {name}; decide it beside the model folder")
    for name, data in files.items():
        if name not in (*BASE_FILES, *EXTRA_FILES, GENERATION_CONFIG_FILE, MODEL_CONFIG_FILE) or \
                not isinstance(data, bytes):
            raise EvidenceError(f"the run's kept tokenizer holds {name!r}, which is not a tokenizer file")
        (root / name).write_bytes(data)
    return ModelTokenizer.from_model_dir(root)
