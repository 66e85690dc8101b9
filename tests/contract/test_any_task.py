"""Any task under a contract, from the records alone: the owner's population format, each built-in scorer and a
user scorer pinned by digest, chat units rendered by the model's template; and every refusal the owner can meet
(a changed scorer file or tokenizer, a folder without a tokenizer, a repeated id, an unknown scorer, a template
that fails) as one line with exit 2, the run's records untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids
from support.cli_batch import InvarSession, Ran

from invar import canonical
from invar.contract.admit import admit
from invar.contract.prepare import prepare
from invar.errors import ContractError
from invar.records import RunStore

USER_SCORER = '''
def loss(unit, response, params):
    """0 for the exact decimal answer (spaces around it allowed), else 1."""
    return 0 if response.strip() == str(unit.answer) else 1
'''
USER = {"name": "scorer.py:loss", "settings": {"loss_range": [0, 1], "binary": True}}


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=120) as session:
        yield session


def _one_line_refusal(out: Ran) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    return out.stderr.strip()


def _user_workspace(root: Path, **changes: Any) -> Workspace:
    root.mkdir(parents=True)
    (root / "scorer.py").write_text(USER_SCORER)
    return make_workspace(root, units=30, scorer=USER, **changes)


@pytest.mark.parametrize(("name", "settings"), [
    ("arithmetic-exact", {}),
    ("exact-match", {"collapse_whitespace": True}),
    ("numeric", {"which": "first"}),
    ("contains", {}),
    ("regex", {"pattern": "^(-?[0-9]+)$"}),
])
def test_each_built_in_scorer_decides_from_the_records(tmp_path: Path, name: str, settings: dict[str, Any]) -> None:
    ws = make_workspace(tmp_path, units=30, scorer={"name": name, "settings": settings})
    assert ws.contract.scorer.name == name
    # arithmetic-exact contracts keep their bytes from before scorer versions; every other scorer fixes its version
    assert (ws.contract.scorer.version is None) == (name == "arithmetic-exact")
    run = RunWriter(ws, tmp_path / "run").complete(
        reference_wrong=unit_ids(ws, 2, 0), candidate_wrong=unit_ids(ws, 2, 10)).close()
    d = admit(ws.contract_path, run)
    assert (d.task_loss.n, d.task_loss.worse, d.task_loss.better) == (30, 2, 2)


def test_a_user_scorer_is_pinned_and_a_changed_file_is_refused(cli: InvarSession, tmp_path: Path) -> None:
    ws = _user_workspace(tmp_path / "owner")
    contract = json.loads(ws.contract_path.read_text())
    assert contract["scorer"]["name"] == "scorer.py:loss"
    assert contract["scorer"]["sha256"] == canonical.file_sha256(tmp_path / "owner" / "scorer.py")
    run = RunWriter(ws, tmp_path / "run").complete(candidate_wrong=unit_ids(ws, 3, 0)).close()
    d = admit(ws.contract_path, run)
    assert (d.task_loss.worse, d.task_loss.better) == (3, 0)  # the user's function scored every response
    with RunStore.open(run) as store:
        head = store.verify().head

    (tmp_path / "owner" / "scorer.py").write_text(USER_SCORER.replace("0 if", "1 if"))
    message = _one_line_refusal(cli.run("use", "admit", run, "--contract", ws.contract_path, "--quiet"))
    assert "scorer" in message
    assert contract["scorer"]["sha256"] in message
    with RunStore.open(run) as store:
        assert store.verify().head == head  # nothing recorded was lost or changed


def test_a_user_scorer_path_is_relative_to_the_contract_it_is_written_into(tmp_path: Path) -> None:
    _user_workspace(tmp_path / "owner")
    out = prepare(tmp_path / "owner" / "decl.toml", tmp_path / "elsewhere")
    assert out.contract.scorer.name == "../owner/scorer.py:loss"


def test_a_user_scorer_that_raises_names_the_unit(tmp_path: Path) -> None:
    ws = _user_workspace(tmp_path / "owner")
    (tmp_path / "owner" / "scorer.py").write_text("def loss(unit, response, params):\n    raise KeyError('x')\n")
    # The contract pins the first file: prepare a new one over the raising function.
    with pytest.raises(ContractError):
        admit(ws.contract_path, RunWriter(ws, tmp_path / "run").complete().close())
    (tmp_path / "owner" / "decl.toml").write_text((tmp_path / "owner" / "decl.toml").read_text().replace(
        'name = "arith-test"', 'name = "arith-raising"'))
    again = prepare(tmp_path / "owner" / "decl.toml")
    ws2 = Workspace(ws.root, again.path, again.contract, again.sha256, again.plan, ws.vocab)
    run = RunWriter(ws2, tmp_path / "run2").complete().close()
    with pytest.raises(ContractError, match=r"unit 'u\S+'.*KeyError"):
        admit(again.path, run)


def test_a_changed_tokenizer_is_refused_at_admission(cli: InvarSession, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    run = RunWriter(ws, tmp_path / "run").complete().close()
    config = tmp_path / "model" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("}", ', "model_max_length": 64}'))
    message = _one_line_refusal(cli.run("use", "admit", run, "--contract", ws.contract_path, "--quiet"))
    assert "the tokenizer files in" in message
    assert "are not the ones the contract names" in message


def test_a_folder_without_a_tokenizer_is_refused_at_prepare(cli: InvarSession, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    (tmp_path / "model" / "tokenizer.json").unlink()
    text = (tmp_path / "decl.toml").read_text()
    (tmp_path / "decl.toml").write_text(text.replace(ws.contract.reference.model_digest,
                                                     canonical.tree_digest(tmp_path / "model")))
    message = _one_line_refusal(cli.run("use", "prepare", tmp_path / "decl.toml", "--out", tmp_path / "again"))
    assert "tokenizer.json does not exist" in message


def test_a_population_with_a_repeated_id_is_refused_naming_the_lines(cli: InvarSession, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    lines = (tmp_path / "population.jsonl").read_text().splitlines()
    data = ("\n".join([*lines, lines[3]]) + "\n").encode()
    (tmp_path / "population.jsonl").write_bytes(data)
    text = (tmp_path / "decl.toml").read_text().replace(ws.contract.population.sha256, canonical.sha256(data))
    (tmp_path / "decl.toml").write_text(text)
    message = _one_line_refusal(cli.run("use", "prepare", tmp_path / "decl.toml", "--out", tmp_path / "again"))
    assert "line 31" in message
    assert "line 4" in message


def test_an_unknown_scorer_is_one_line(cli: InvarSession, tmp_path: Path) -> None:
    make_workspace(tmp_path, units=30)
    text = (tmp_path / "decl.toml").read_text().replace('"arithmetic-exact"', '"bleu"')
    (tmp_path / "decl.toml").write_text(text)
    message = _one_line_refusal(cli.run("use", "prepare", tmp_path / "decl.toml", "--out", tmp_path / "again"))
    assert message.startswith("invar: error: scorer: scorer 'bleu' is unknown")


def _chat_workspace(root: Path, template: str) -> Workspace:
    """A workspace whose model has chat `template` and whose declaration names a population of 30 chat units
    (system "0", user "i+1=") scored by exact-match; the declaration is rewritten, not yet prepared."""
    ws = make_workspace(root, units=30)
    config = json.loads((root / "model" / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (root / "model" / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [{"id": f"c{i}", "messages": [{"role": "system", "content": "0"},
                                          {"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)}
            for i in range(30)]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (root / "chat.jsonl").write_bytes(data)
    text = (root / "decl.toml").read_text()
    text = text.replace('"population.jsonl"', '"chat.jsonl"').replace(ws.contract.population.sha256,
                                                                      canonical.sha256(data))
    text = text.replace(ws.contract.reference.model_digest, canonical.tree_digest(root / "model"))
    (root / "decl.toml").write_text(text.replace('"arithmetic-exact"', '"exact-match"'))
    return ws


def test_chat_units_are_rendered_by_each_packages_template_and_sent_as_ids(tmp_path: Path) -> None:
    ws = _chat_workspace(tmp_path, "{% for m in messages %}{{ m['content'] }}={% endfor %}"
                                   "{% if add_generation_prompt %}<s>{% endif %}")
    prepared = prepare(tmp_path / "decl.toml", tmp_path / "chat")
    req = prepared.plan.calls[0].params.to_wire()["requests"][0]
    unit = next(u for u in prepared.plan.units if u.unit_id == req["request_id"])
    i = int(unit.unit_id[1:])
    assert req["prompt"] == f"0={i}+1==<s>"  # the template's rendering, generation prompt included
    assert req["prompt_ids"] == ws.vocab.encode(req["prompt"], add_special_tokens=False)


def test_a_template_that_fails_to_render_is_one_line(cli: InvarSession, tmp_path: Path) -> None:
    _chat_workspace(tmp_path, "{{ raise_exception('this model takes no system message') }}")
    message = _one_line_refusal(cli.run("use", "prepare", tmp_path / "decl.toml", "--out", tmp_path / "again"))
    assert "this model takes no system message" in message
    assert not (tmp_path / "again" / "arith-test.contract.json").exists()
