"""`prepare`: every anchor a declaration names is checked against the files before the contract is written."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from contract_runs import declaration, make_model, make_workspace, toml_text

from invar import canonical
from invar.cli.app import main
from invar.contract.prepare import load_contract, prepare
from invar.errors import ContractError
from invar.tasks.arithmetic import population, population_bytes


def test_prepare_writes_contract_and_sha256sum_file(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    digest_file = tmp_path / "arith-test.contract.json.sha256"
    assert digest_file.read_text() == f"{ws.sha256}  arith-test.contract.json\n"
    assert canonical.sha256(ws.contract_path.read_bytes()) == ws.sha256
    assert ws.contract.population.size == 30
    assert ws.contract.method_version is not None
    assert ws.contract.reference.model_dir == "model"
    contract, sha, plan = load_contract(ws.contract_path)
    assert (contract, sha, plan) == (ws.contract, ws.sha256, ws.plan)


def test_prepare_is_deterministic_and_never_overwrites_a_different_contract(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    again = prepare(tmp_path / "decl.toml")
    assert again.sha256 == ws.sha256
    text = (tmp_path / "decl.toml").read_text().replace('"seed" = 20240601', '"seed" = 5')
    (tmp_path / "decl.toml").write_text(text)
    with pytest.raises(ContractError, match="a different contract of this name already exists"):
        prepare(tmp_path / "decl.toml")


def test_paths_are_relative_to_the_contract_folder(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "owner", units=30)
    out = prepare(tmp_path / "owner" / "decl.toml", tmp_path / "elsewhere" / "contracts")
    assert out.contract.population.path == "../../owner/population.jsonl"
    assert out.contract.reference.model_dir == "../../owner/model"
    assert out.sha256 != ws.sha256  # the paths are part of the contract's bytes
    assert load_contract(out.path)[2].units == ws.plan.units


def _prepare_with(tmp_path: Path, **changes: Any) -> str:
    model_digest = make_model(tmp_path / "model")
    data = population_bytes(population("eval", seed=11, count=30, id_prefix="u"))
    (tmp_path / "population.jsonl").write_bytes(data)
    decl = declaration(canonical.sha256(data), model_digest, **changes)
    (tmp_path / "decl.toml").write_text(toml_text(decl))
    with pytest.raises(ContractError) as info:
        prepare(tmp_path / "decl.toml")
    return str(info.value)


def test_wrong_population_digest_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, population={"sha256": "e" * 64})
    assert msg.startswith("population: population file")
    assert "was declared" in msg


def test_sample_larger_than_population_is_refused(tmp_path: Path) -> None:
    assert "population.sample: 31 exceeds the 30 units" in _prepare_with(tmp_path, population={"sample": 31})


def test_wrong_model_digest_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, candidate={"model_digest": "e" * 64})
    assert msg.startswith("candidate.model_digest: folder")


def test_missing_adapter_folder_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, candidate={"adapter": {"path": "lora", "digest": "e" * 64}})
    assert msg.startswith("candidate.adapter.digest: folder")
    assert "does not exist" in msg


def test_unknown_scorer_and_settings_are_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path / "a", scorer={"name": "bleu"})
    assert msg.startswith("scorer: scorer 'bleu' is unknown: use one of exact-match, numeric, regex, choice")
    assert "'path.py:function'" in msg
    msg = _prepare_with(tmp_path / "b", scorer={"settings": {"strict": True}})
    assert msg.startswith("scorer: ")
    assert "strict" in msg
    assert "arithmetic-exact" in msg


def test_unknown_bound_method_is_refused(tmp_path: Path) -> None:
    msg = _prepare_with(tmp_path, requirement={"method": "magic"})
    assert "requirement.method: unknown bound method 'magic'; use one of hoeffding, maurer-pontil" in msg


def test_checked_premise_must_match_its_file(tmp_path: Path) -> None:
    (tmp_path / "basis.txt").write_text("the owner's memo\n")
    premise = {"statement": "s", "party": "p", "basis_sha256": "e" * 64, "reliance": "checked",
               "basis_path": "basis.txt"}
    msg = _prepare_with(tmp_path, premises=[premise])
    assert msg.startswith("premises[0].basis_sha256:")


def test_tokenizer_that_the_core_cannot_read_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_model(model)
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["model"]["type"] = "BPE"
    (model / "tokenizer.json").write_text(json.dumps(tok))
    digest = canonical.tree_digest(model)
    data = population_bytes(population("eval", seed=11, count=30, id_prefix="u"))
    (tmp_path / "population.jsonl").write_bytes(data)
    decl = declaration(canonical.sha256(data), digest)
    (tmp_path / "decl.toml").write_text(toml_text(decl))
    with pytest.raises(ContractError, match=r"reference\.model_dir: .*cannot be loaded by the tokenizers library"):
        prepare(tmp_path / "decl.toml")


def test_bad_toml_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "decl.toml").write_text("name = \n")
    with pytest.raises(ContractError, match="not valid TOML"):
        prepare(tmp_path / "decl.toml")
    with pytest.raises(ContractError, match="cannot read the declaration"):
        prepare(tmp_path / "missing.toml")


def test_moved_population_is_refused_at_load(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "w", units=30)
    shutil.move(tmp_path / "w" / "population.jsonl", tmp_path / "population.jsonl")
    with pytest.raises(ContractError, match=r"population: population file .* does not exist"):
        load_contract(ws.contract_path)


# --- hostile files: each is one `ContractError` line, and the CLI prints it and exits 2 -----------------------------


def _cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """Run the real `invar` entry point; returns its one error line (and checks it exits 2 with nothing else)."""
    monkeypatch.setattr(sys, "argv", ["invar", *args])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("invar: error: ")
    return lines[0].removeprefix("invar: error: ")


def _hostile_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """name → (file, what its one line must say), for a declaration and a contract alike."""
    folder.mkdir(parents=True, exist_ok=True)
    cases: dict[str, tuple[Path, str]] = {}

    def case(name: str, data: bytes | None, message: str) -> None:
        path = folder / name
        if data is not None:
            path.write_bytes(data)
        cases[name] = (path, message)

    case("latin1", 'name = "café"\n'.encode("latin-1"), r"not UTF-8 text \(byte 0xe9 at offset 11\)")
    case("deep-array", b"a = " + b"[" * 500 + b"]" * 500 + b"\n", "nest more than 32 levels deep")
    case("deep-table", b"a = " + b"{b = " * 500 + b"1" + b"}" * 500 + b"\n", "nest more than 32 levels deep")
    case("deep-dotted", b".".join([b"k"] * 100) + b" = 1\n", "nest more than 32 levels deep")
    case("huge", b"# " + b"x" * (1 << 20) + b"\n", r"1,048,579 bytes, over the limit of 1 MiB \(1,048,576 bytes\)")
    case("missing", None, r"cannot read the \w+ \(No such file or directory\); check the path")
    (folder / "folder").mkdir()
    case("folder", None, "it is a folder")
    os.mkfifo(folder / "fifo")
    case("fifo", None, "it is not a regular file")
    return cases


def test_hostile_declaration_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (path, message) in _hostile_files(tmp_path).items():
        with pytest.raises(ContractError, match=message):
            prepare(path)
        line = _cli(capsys, monkeypatch, "use", "prepare", str(path))
        assert re.search(message, line), (name, line)


def test_hostile_contract_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _hostile_files(tmp_path)
    deep = b'{"schema":"invar.contract/1","name":' + b'{"a":' * 500 + b"1" + b"}" * 500 + b"}"
    (tmp_path / "deep.json").write_bytes(deep)
    cases["deep.json"] = (tmp_path / "deep.json", "objects and arrays nest more than 32 levels deep")
    (tmp_path / "deeper.json").write_bytes(b'{"name":' + b"[" * 5000 + b"]" * 5000 + b"}")
    cases["deeper.json"] = (tmp_path / "deeper.json", "objects and arrays nest more than 32 levels deep")
    (tmp_path / "number.json").write_bytes(b'{"seed":' + b"9" * 5000 + b"}")
    cases["number.json"] = (tmp_path / "number.json", "not valid JSON: a number has more than 4,300 digits")
    for name, (path, message) in cases.items():
        if name.startswith("deep-"):
            continue  # TOML, not JSON: refused as not valid JSON, already covered
        with pytest.raises(ContractError, match=message):
            load_contract(path)
        line = _cli(capsys, monkeypatch, "use", "plan", str(path), "--assume", "worse=0.01 better=0.01")
        assert re.search(message, line), (name, line)


def test_number_past_pythons_digit_limit_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "decl.toml").write_text("seed = " + "7" * 5000 + "\n")
    with pytest.raises(ContractError, match="not valid TOML: a number has more than 4,300 digits"):
        prepare(tmp_path / "decl.toml")


def test_paths_the_system_cannot_read_are_one_line(tmp_path: Path) -> None:
    # A path component longer than the file system allows fails with ENAMETOOLONG, not with "no such file".
    msg = _prepare_with(tmp_path / "a", population={"path": "p" * 300 + "/population.jsonl"})
    assert msg.startswith("population: population file ")
    assert "cannot be read (File name too long)" in msg
    assert "File name too long" in msg
    msg = _prepare_with(tmp_path / "b", candidate={"model_dir": "m" * 300})
    assert msg.startswith("candidate.model_digest: cannot read")
    (tmp_path / "c" / "empty").mkdir(parents=True)
    msg = _prepare_with(tmp_path / "c", candidate={"model_dir": "empty"})
    assert msg.startswith("candidate.model_digest: ")
    assert "the folder is empty" in msg


def test_population_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.jsonl").write_bytes('{"id": "é"}\n'.encode("latin-1"))
    digest = canonical.file_sha256(tmp_path / "latin1.jsonl")
    msg = _prepare_with(tmp_path, population={"path": "latin1.jsonl", "sha256": digest})
    assert msg.startswith("population")  # the population loader names the file and the byte
    assert "latin1.jsonl line 1 is not UTF-8 (byte 8 of the line)" in msg


def test_output_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    make_workspace(tmp_path, units=30)
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(ContractError, match="cannot create the output folder"):
        prepare(tmp_path / "decl.toml", tmp_path / "taken" / "contracts")


def test_model_folder_holding_a_pipe_is_refused_not_waited_on(tmp_path: Path) -> None:
    # Hashing a pipe waits for a writer that never comes; a link to /dev/zero never ends. Both are refused at once.
    def hang(signum: int, frame: object) -> None:
        raise TimeoutError("prepare hung on a model folder holding a pipe")

    for name, make in [("pipe", os.mkfifo), ("zero", lambda p: os.symlink("/dev/zero", p))]:
        folder = tmp_path / name / "odd-model"
        make_model(folder)
        make(folder / name)
        previous = signal.signal(signal.SIGALRM, hang)
        signal.alarm(20)
        try:
            msg = _prepare_with(tmp_path / name, candidate={"model_dir": "odd-model"})
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        assert msg.startswith("candidate.model_digest: ")
        assert f"odd-model/{name}: not a regular file" in msg
