"""The core's chat-template rendering against transformers' `apply_chat_template`, on real templates.

The fixture half compares with ids and texts transformers produced (`fixtures/make_chat_fixtures.py`) and needs no
transformers; the live half rebuilds each family's tokenizer and asks transformers now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.bpe_model import build_bpe_tokenizer

from invar.errors import ContractError
from invar.formats.chat import ChatTemplate, find_template
from invar.formats.tokenizer import ModelTokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAMILIES = sorted(p.stem for p in (FIXTURES / "chat_templates").glob("*.json"))


def _spec(family: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "chat_templates" / f"{family}.json").read_text(encoding="utf-8"))


def _cases(family: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / "chat" / family / "expected.json").read_text(encoding="utf-8"))["cases"]


def test_families_cover_the_required_templates() -> None:
    # each family's current template beside an older one: Llama 3.1 (its date and tools), Qwen2.5, Mistral v0.3,
    # Gemma 3 (the system turn folded into the first user turn), Phi-3.5
    assert {"smollm2", "llama3", "llama3.1", "qwen2.5", "qwen3", "gemma", "gemma3", "mistral", "mistral-v0.3",
            "phi3.5"} <= set(FAMILIES)
    for family in FAMILIES:
        spec = _spec(family)
        assert spec["source"]
        stored = ModelTokenizer.from_model_dir(FIXTURES / "chat" / family).chat_template
        assert stored is not None
        assert stored.source == spec["template"]
    qwen = {(c["name"], json.dumps(c["template_kwargs"])) for c in _cases("qwen3")}
    assert ("system_user", '{"enable_thinking": false}') in qwen
    assert ("system_user", '{"enable_thinking": true}') in qwen


@pytest.mark.parametrize("family", FAMILIES)
def test_core_matches_transformers_fixture(family: str) -> None:
    tokenizer = ModelTokenizer.from_model_dir(FIXTURES / "chat" / family)
    cases = _cases(family)
    assert len(cases) >= 4
    for case in cases:
        kwargs = case["template_kwargs"]
        if "error" in case:
            with pytest.raises(ContractError, match="chat template refused"):
                tokenizer.prompt_ids(messages=case["messages"], template_kwargs=kwargs)
            continue
        label = f"{family}/{case['name']}/{kwargs}"
        assert tokenizer.render_prompt(messages=case["messages"], template_kwargs=kwargs) == case["text"], label
        assert tokenizer.prompt_ids(messages=case["messages"], template_kwargs=kwargs) == case["ids"], label


def test_qwen3_thinking_switch_changes_the_prompt() -> None:
    tokenizer = ModelTokenizer.from_model_dir(FIXTURES / "chat" / "qwen3")
    messages = [{"role": "user", "content": "hi"}]
    off = tokenizer.render_prompt(messages=messages, template_kwargs={"enable_thinking": False})
    on = tokenizer.render_prompt(messages=messages, template_kwargs={"enable_thinking": True})
    assert off == on + "<think>\n\n</think>\n\n"


def test_gemma_refuses_a_system_turn_naming_the_file() -> None:
    tokenizer = ModelTokenizer.from_model_dir(FIXTURES / "chat" / "gemma")
    with pytest.raises(ContractError, match=r"tokenizer_config\.json \(chat_template\).*System role not supported"):
        tokenizer.render_prompt(messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])


@pytest.mark.parametrize("family", FAMILIES)
def test_core_matches_transformers_live(family: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    import make_chat_fixtures as make  # tests/tasks/fixtures is not a package; see below

    folder = make.build_family(_spec(family), tmp_path / family)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    core = ModelTokenizer.from_model_dir(folder)
    for case in make.expected_cases(folder, _spec(family)):
        if "error" in case:
            with pytest.raises(ContractError):
                core.prompt_ids(messages=case["messages"], template_kwargs=case["template_kwargs"])
            continue
        assert core.render_prompt(messages=case["messages"], template_kwargs=case["template_kwargs"]) == case["text"]
        assert core.prompt_ids(messages=case["messages"], template_kwargs=case["template_kwargs"]) == case["ids"]
        # and a plain prompt is tokenized as transformers tokenizes text (special tokens such as BOS added)
        text = case["messages"][-1]["content"]
        assert core.prompt_ids(prompt=text) == hf(text)["input_ids"]


@pytest.fixture(autouse=True)
def _fixture_scripts_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def test_template_lookup_order(tmp_path: Path) -> None:
    folder = build_bpe_tokenizer(tmp_path / "m", "{{ 'from config' }}")
    found = find_template(folder, json.loads((folder / "tokenizer_config.json").read_text()))
    assert found is not None
    assert found.source == "{{ 'from config' }}"
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'from legacy json' }}"}))
    assert ModelTokenizer.from_model_dir(folder).render_prompt(messages=[]) == "from config"
    (folder / "chat_template.jinja").write_text("{{ 'from jinja file' }}")
    assert ModelTokenizer.from_model_dir(folder).render_prompt(messages=[]) == "from jinja file"
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert ModelTokenizer.from_model_dir(folder).render_prompt(messages=[]) == "from legacy json"
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert ModelTokenizer.from_model_dir(folder).render_prompt(messages=[]) == "D"
    config["chat_template"] = [{"name": "tool_use", "template": "T"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ContractError, match="none named 'default'"):
        ModelTokenizer.from_model_dir(folder)


def test_no_template_means_use_a_plain_prompt(tmp_path: Path) -> None:
    tokenizer = ModelTokenizer.from_model_dir(build_bpe_tokenizer(tmp_path / "m", None))
    with pytest.raises(ContractError, match=r"has no chat template.*plain prompt"):
        tokenizer.prompt_ids(messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(ContractError, match="exactly one"):
        tokenizer.prompt_ids(prompt="a", messages=[])
    with pytest.raises(ContractError, match="exactly one"):
        tokenizer.prompt_ids()


def test_template_errors_are_one_line_contract_errors() -> None:
    broken = ChatTemplate("{% for m in messages %}{{ m.content ", "x/chat_template.jinja")
    with pytest.raises(ContractError, match=r"^x/chat_template\.jinja: the chat template does not compile") as info:
        broken.render([], {})
    assert "\n" not in str(info.value)
    raising = ChatTemplate("{{ raise_exception('no\nway') }}", "x/chat_template.jinja")
    with pytest.raises(ContractError, match="refused these messages \\(no way\\)"):
        raising.render([], {})


def test_environment_matches_transformers_helpers() -> None:
    template = ChatTemplate(
        "{{ messages | tojson }}|{{ messages | tojson(indent=2) | length > 0 }}|{{ strftime_now('%Y') | length }}|"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% break %}{% endfor %}|"
        "{% generation %}{{ bos_token }}{% endgeneration %}|{{ tools is none }}{{ documents is none }}|{{ extra }}",
        "t")
    messages = [{"role": "user", "content": "<a & b>"}, {"role": "assistant", "content": "é"}]
    out = template.render(messages, {"bos_token": "<s>", "extra": "overridden"}, template_kwargs={"extra": "kw"})
    assert out.startswith('[{"role": "user", "content": "<a & b>"}')  # not HTML-escaped, not ASCII-escaped
    assert out.endswith("|é|<s>|TrueTrue|kw")  # loop controls, generation block, tools/documents None, kwargs win
    transformers_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    hf_out = transformers_utils._compile_jinja_template(template.source).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=True, bos_token="<s>", extra="kw")
    assert out == hf_out


def test_sandbox_refuses_unsafe_access() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}{% set x = messages.append(1) %}", "t")
    with pytest.raises(ContractError, match=r"^t: the chat template"):
        template.render([{"role": "user", "content": "a"}], {})
