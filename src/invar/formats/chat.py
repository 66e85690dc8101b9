"""The core renders a model's chat template itself, exactly as transformers' `apply_chat_template` does.

A conversation (`messages`) becomes model input only through the model folder's own Jinja template, rendered by
the core, so the prompt the decision is about is fixed by files the contract pins, not by whatever an engine's
template code does. The environment copies transformers' (`utils/chat_template_utils.py`,
`_cached_compile_jinja_template`): an `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with
the `loopcontrols` extension and a `{% generation %}` block tag, a `tojson` filter that does not escape HTML
(`json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`), and the globals
`raise_exception` and `strftime_now`. The variables are those `apply_chat_template` passes: `messages`,
`add_generation_prompt`, `tools=None`, `documents=None`, the named special tokens (`bos_token`, `eos_token`,
`unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`, those the tokenizer declares), and the owner's
keyword extras (e.g. `enable_thinking`), which override a special token of the same name.

The template is found as transformers finds it: `chat_template.jinja` in the folder first, else `chat_template`
in `tokenizer_config.json` (a string, or a list of `{name, template}` from which `default` is used), else the
legacy processor file `chat_template.json` (`{"chat_template": ...}`), which vLLM also reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from invar.errors import ContractError
from invar.regular_files import read_model_file

TEMPLATE_FILE = "chat_template.jinja"
"""The folder's own template file; transformers prefers it to `tokenizer_config.json`'s `chat_template`."""
LEGACY_TEMPLATE_FILE = "chat_template.json"
"""The processor's legacy template file, `{"chat_template": "..."}`."""
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens transformers passes to a template (`special_tokens_map`), in its order."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it; rendering keeps the body."""

    tags = {"generation"}  # noqa: RUF012 (jinja reads this class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers replaces jinja's own tojson, which escapes <, >, & and ' for HTML
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    # one environment per template, as transformers caches them; a template cannot alter its (immutable) globals
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template: its Jinja source and the file it was read from (named in errors)."""

    source: str
    """The Jinja text."""
    where: str
    """The file it came from, e.g. `models/x/tokenizer_config.json (chat_template)`."""

    def render(self, messages: Sequence[Mapping[str, Any]], special_tokens: Mapping[str, str],
               add_generation_prompt: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The text of `messages` (a list of `{role, content, ...}` maps) as the template renders it.

        `special_tokens` maps names such as `bos_token` to their text; `template_kwargs` are extra variables
        (e.g. `{"enable_thinking": False}`) and override a special token of the same name, as in transformers.
        Raises `ContractError` naming the template's file and jinja's message when it fails to compile or render
        (including the template's own `raise_exception`, e.g. a role it does not support).
        """
        try:
            template = _compile(self.source)
        except jinja2.TemplateError as exc:
            raise ContractError(f"{self.where}: the chat template does not compile ({_one_line(exc)}): "
                                "fix the template") from None
        variables: dict[str, Any] = {**special_tokens, **(template_kwargs or {})}
        try:
            return template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as exc:
            raise ContractError(f"{self.where}: the chat template refused these messages ({_one_line(exc)}): "
                                "change the messages or the template") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise ContractError(f"{self.where}: the chat template failed on these messages ({_one_line(exc)}): "
                                "change the messages or the template") from None


def _read_template_list(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        if isinstance(default, str):
            return default
        raise ContractError(f"{where}: chat_template lists templates {sorted(map(str, named))} but none named "
                            "'default' with a string template: add one")
    raise ContractError(f"{where}: chat_template must be a string or a list of {{name, template}}")


def find_template(model_dir: Path, tokenizer_config: Mapping[str, Any]) -> ChatTemplate | None:
    """The folder's chat template, looked up in transformers' order (see the module docstring); None if it has none.

    Raises `ContractError` naming the file when a template file is unreadable or malformed.
    """
    jinja_file = model_dir / TEMPLATE_FILE
    if jinja_file.exists():
        try:
            return ChatTemplate(read_model_file(jinja_file).decode("utf-8"), str(jinja_file))
        except UnicodeDecodeError as exc:
            raise ContractError(f"{jinja_file} is not UTF-8 text ({exc}): re-save the template") from None
    value = tokenizer_config.get("chat_template")
    if value is not None:
        where = f"{model_dir / 'tokenizer_config.json'} (chat_template)"
        return ChatTemplate(_read_template_list(value, where), where)
    legacy = model_dir / LEGACY_TEMPLATE_FILE
    if legacy.exists():
        try:
            data = json.loads(read_model_file(legacy).decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ContractError(f"{legacy} is not valid JSON ({exc}): re-save the template") from None
        source = data.get("chat_template") if isinstance(data, dict) else None
        if source is None:
            raise ContractError(f"{legacy}: expected an object with a chat_template field")
        return ChatTemplate(_read_template_list(source, str(legacy)), f"{legacy} (chat_template)")
    return None
