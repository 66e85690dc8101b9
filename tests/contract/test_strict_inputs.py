"""Nothing an owner writes is coerced (issue 26, "strict by default"): a boolean where a number is expected, a
number or a boolean written as a string, a float where an integer is expected, and an engine launch setting of the
wrong type or outside what the engine's worker takes are each refused in one line naming the file, the field and
what to write instead. An integer where a float is expected stays accepted (TOML's `1` for 1.0), and so do ε, δ
and the confidence written as strings (`"0.01"`, documented: they are kept as exact decimals)."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from contract_runs import declaration, make_workspace, toml_text

from invar import regular_files
from invar.contract.model import parse_contract, read_declaration
from invar.contract.prepare import load_contract
from invar.errors import ContractError
from invar.loop.config import ConfigError, parse_config, read_config
from invar.owner_files import read_owner_file, read_regular_file

POP = "a" * 64
MODEL = "b" * 64


def _write(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "decl.toml"
    path.write_text(toml_text(declaration(POP, MODEL, **changes)), encoding="utf-8")
    return path


def _refusal(tmp_path: Path, **changes: Any) -> str:
    path = _write(tmp_path, **changes)
    with pytest.raises(ContractError) as info:
        read_declaration(path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: "), text  # names the file
    return text.removeprefix(f"{path}: ")


# -- a declaration: every kind of coercion the issue found, each refused in one line ------------------------------

@pytest.mark.parametrize(("changes", "message"), [
    # `sample = true` was one unit
    ({"population": {"sample": True}},
     "population.sample: must be an integer, not the boolean true; write a whole number such as 16"),
    # `"16"` was 16
    ({"population": {"sample": "16"}},
     'population.sample: must be an integer, not the string "16"; write 16 without quotes'),
    # 16.0 was 16
    ({"population": {"sample": 16.0}},
     "population.sample: must be an integer, not the float 16.0; write 16"),
    ({"population": {"sample": 16.5}},
     "population.sample: must be an integer, not the float 16.5; write a whole number such as 16"),
    ({"sampling": {"max_tokens": True}},
     "sampling.max_tokens: must be an integer, not the boolean true; write a whole number such as 16"),
    ({"pairing": {"seed": "20240601"}},
     'pairing.seed: must be an integer, not the string "20240601"; write 20240601 without quotes'),
    ({"layouts": {"solo": {"batch_size": False}, "b4r": {"batch_size": 4, "order": "reverse"}}},
     "layouts.solo.batch_size: must be an integer, not the boolean false; write a whole number such as 16"),
    ({"execution": {"requests_per_call": 64.0}},
     "execution.requests_per_call: must be an integer, not the float 64.0; write 64"),
    # a boolean or a string where a float is expected
    ({"sampling": {"temperature": True}},
     "sampling.temperature: must be a number, not the boolean true; write a number such as 1.0"),
    ({"sampling": {"top_p": "1.0"}},
     'sampling.top_p: must be a number, not the string "1.0"; write 1.0 without quotes'),
    # `"yes"` was true
    ({"invariance": {"required": "yes"}},
     'invariance.required: must be true or false, not the string "yes"; write true or false without quotes'),
    ({"invariance": {"required": 1}},
     "invariance.required: must be true or false, not the integer 1; write true or false"),
    ({"requirement": {"sequential": "true"}},
     'requirement.sequential: must be true or false, not the string "true"; write true without quotes'),
    ({"measurements": {"teacher_forcing": "false", "capture_steps": [0]}},
     'measurements.teacher_forcing: must be true or false, not the string "false"; write false without quotes'),
    ({"name": 5}, "name: must be a string, not the integer 5; write it in double quotes"),
])
def test_a_coerced_value_in_a_declaration_is_refused_in_one_line(tmp_path: Path, changes: dict[str, Any],
                                                                message: str) -> None:
    assert _refusal(tmp_path, **changes) == message


def test_an_integer_for_a_float_and_a_decimal_string_are_still_what_an_author_means(tmp_path: Path) -> None:
    decl = read_declaration(_write(tmp_path, sampling={"temperature": 1, "top_p": 1},
                                   requirement={"epsilon": "0.05", "confidence": "0.95"}))
    assert decl.sampling.temperature == 1.0
    assert isinstance(decl.sampling.temperature, float)
    assert decl.sampling.top_p == 1.0
    assert isinstance(decl.sampling.top_p, float)
    assert str(decl.requirement.epsilon) == "0.05"
    assert str(decl.requirement.delta) == "0.05"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("epsilon", True, "requirement.epsilon: must be a number such as 0.01"),
    ("confidence", True, "requirement.confidence: must be a number such as 0.01"),
])
def test_a_boolean_for_an_exact_decimal_is_refused(tmp_path: Path, field: str, value: Any, message: str) -> None:
    assert _refusal(tmp_path, requirement={field: value}).startswith(message)


# -- a contract: the same rules, so a hand-made contract cannot smuggle a coercion past prepare --------------------

def test_a_coerced_value_in_a_contract_is_refused_in_one_line(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=20)
    data = json.loads(ws.contract_path.read_bytes())
    data["population"]["sample"] = True
    with pytest.raises(ContractError) as info:
        parse_contract(json.dumps(data).encode(), "c.contract.json")
    assert str(info.value) == ("c.contract.json: population.sample: must be an integer, not the boolean true; "
                               "write a whole number such as 16")
    data["population"]["sample"] = None
    data["sampling"]["max_tokens"] = "5"
    with pytest.raises(ContractError) as info:
        parse_contract(json.dumps(data).encode(), "c.contract.json")
    assert str(info.value) == ('c.contract.json: sampling.max_tokens: must be an integer, not the string "5"; '
                               "write 5 without quotes")


# -- a package's launch settings: checked by name and type against what its engine's worker takes -----------------

VLLM_SETTINGS: dict[str, Any] = {"device": "cpu", "enforce_eager": True, "gpu_memory_utilization": 0.3,
                                 "max_lora_rank": 8, "max_num_seqs": 256, "engine_seed": 0,
                                 "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "logprobs_mode": "processed_logprobs"}


def _vllm_candidate(**settings: Any) -> dict[str, Any]:
    return {"engine": "vllm", "engine_version": {"vllm": "0.32.0"}, "settings": {**VLLM_SETTINGS, **settings},
            "patches": None, "quantization": "none"}


@pytest.mark.parametrize(("changes", "message"), [
    ({"reference": {"settings": {"device": "gpu", "threads": 1}}},
     'reference.settings: device "gpu" is not a device the hf worker takes; write "cpu" or "cuda"'),
    ({"reference": {"settings": {"device": "cpu", "threads": "1"}}},
     'reference.settings: threads, a launch option of the hf worker, must be an integer, not the string "1"; '
     "write 1 without quotes"),
    ({"reference": {"settings": {"device": "cpu", "threads": True}}},
     "reference.settings: threads, a launch option of the hf worker, must be an integer, not the boolean true; "
     "write a whole number such as 16"),
    ({"reference": {"settings": {"device": "cpu", "threads": 1, "attn_implementation": "flash"}}},
     'reference.settings: attn_implementation "flash" is not one the hf worker takes; write "sdpa" or "eager"'),
    ({"candidate": _vllm_candidate(device="gpu")},
     'candidate.settings: device "gpu" is not a device the vllm worker takes; write "auto", "cpu" or "cuda"'),
    ({"candidate": _vllm_candidate(enforce_eager="true")},
     'candidate.settings: enforce_eager, a launch option of the vllm worker, must be true or false, not the string '
     '"true"; write true without quotes'),
    # the worker reports a float, and the identity must match it exactly: an integer could never match
    ({"candidate": _vllm_candidate(gpu_memory_utilization=1)},
     "candidate.settings: gpu_memory_utilization, a launch option of the vllm worker, must be a number with a "
     "decimal point, as the worker reports it, not the integer 1; write 1.0"),
    ({"candidate": _vllm_candidate(max_lora_rank=True)},
     "candidate.settings: max_lora_rank, a launch option of the vllm worker, must be an integer, not the boolean "
     "true; write a whole number such as 16"),
    ({"candidate": _vllm_candidate(max_lora_rank=4)},
     "candidate.settings: max_lora_rank 4 is not one the vllm worker takes; write 1, 8, 16, 32, 64, 128 or 256"),
])
def test_a_launch_setting_of_the_wrong_type_or_value_is_refused(tmp_path: Path, changes: dict[str, Any],
                                                                 message: str) -> None:
    assert _refusal(tmp_path, **changes) == message


def test_identity_only_settings_are_not_launch_options_and_pass(tmp_path: Path) -> None:
    # What only the worker's identity reports (its value checked at handshake) is never refused here, whatever its
    # type: interop_threads, deterministic_algorithms, env, logprobs_mode ...
    decl = read_declaration(_write(
        tmp_path,
        reference={"settings": {"device": "cpu", "threads": 1, "interop_threads": "1", "deterministic_algorithms": 1,
                                "attn_implementation": "sdpa"}},
        candidate=_vllm_candidate(enable_lora=True, top_p="1 only"),
    ))
    assert decl.reference.settings["interop_threads"] == "1"
    assert decl.candidate.settings["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    # A name no worker of the engine reports could never match a worker's identity: refused before any worker
    # starts (issue 51), naming the settings the engine's worker has.
    with pytest.raises(ContractError, match=r"reference\.settings: 'future_key' is not a setting of the hf worker: "
                                            r".*\(the hf worker's settings: attn_implementation, deterministic_"
                                            r"algorithms, device, interop_threads, threads\)"):
        read_declaration(_write(tmp_path, reference={"settings": {"device": "cpu", "threads": 1, "future_key": "1"}}))


def test_an_mlx_package_has_no_launch_options_to_check(tmp_path: Path) -> None:
    decl = read_declaration(_write(tmp_path, candidate={"engine": "mlx", "engine_version": {"mlx": "0.31.0"},
                                                        "settings": {"device": "gpu", "decode": 1},
                                                        "patches": None}))
    assert decl.candidate.settings["device"] == "gpu"


def test_a_contracts_launch_settings_are_checked_before_any_worker_starts(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=20)
    data = json.loads(ws.contract_path.read_bytes())
    data["reference"]["settings"]["device"] = "gpu"
    with pytest.raises(ContractError) as info:
        parse_contract(json.dumps(data).encode(), "c.contract.json")
    assert str(info.value) == ('c.contract.json: reference.settings: device "gpu" is not a device the hf worker '
                               'takes; write "cpu" or "cuda"')


# -- a training configuration: the same rules -----------------------------------------------------------------------

@pytest.mark.parametrize(("data", "message"), [
    ({"cycles": True}, "cycles: must be an integer, not the boolean true; write a whole number such as 16"),
    ({"cycles": "20"}, 'cycles: must be an integer, not the string "20"; write 20 without quotes'),
    ({"seed": 1.0}, "seed: must be an integer, not the float 1.0; write 1"),
    ({"rollout": {"temperature": True}},
     "rollout.temperature: must be a number, not the boolean true; write a number such as 1.0"),
    ({"optimizer": {"lr": "0.001"}}, 'optimizer.lr: must be a number, not the string "0.001"; write 0.001 without '
                                     "quotes"),
    ({"optimizer": {"betas": [0.9, True]}},
     "optimizer.betas[1]: must be a number, not the boolean true; write a number such as 1.0"),
    ({"lora": {"r": 8.0}}, "lora.r: must be an integer, not the float 8.0; write 8"),
    ({"objective": {"importance_cap": False}},
     "objective.importance_cap: must be a number, not the boolean false; write a number such as 1.0"),
])
def test_a_coerced_value_in_a_training_config_is_refused_in_one_line(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"name": "x", "backend": "mlx", **data}, "c.toml")
    assert str(info.value) == f"c.toml: {message}"


def test_a_training_config_still_reads_lists_for_tuples_and_integers_for_floats(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\nbackend = "mlx"\n[optimizer]\nbetas = [0, 0.999]\nlr = 1\n[lora]\nalpha = 16\n',
                    encoding="utf-8")
    config = read_config(path)
    assert config.optimizer.betas == (0.0, 0.999)
    assert config.optimizer.lr == 1.0
    assert isinstance(config.optimizer.lr, float)
    assert config.lora.alpha == 16.0


# -- a scorer's settings: already strict; the line now says what to write ------------------------------------------

@pytest.mark.parametrize(("name", "settings", "message"), [
    ("exact-match", {"case_fold": "yes"}, "scorer exact-match: setting case_fold: Input should be a valid boolean "
                                          "(got 'yes'); write true or false without quotes"),
    ("exact-match", {"strip": 1}, "scorer exact-match: setting strip: Input should be a valid boolean (got 1); write "
                                  "true or false"),
    ("numeric", {"abs_tol": "0.1"}, "scorer numeric: setting abs_tol: Input should be a valid number (got '0.1'); "
                                    "write 0.1 without quotes"),
    ("numeric", {"rel_tol": True}, "scorer numeric: setting rel_tol: Input should be a valid number (got True); "
                                   "write a number such as 1.0"),
])
def test_a_coerced_scorer_setting_is_refused_saying_what_to_write(name: str, settings: dict[str, Any],
                                                                  message: str) -> None:
    from invar.tasks.scorers import load_scorer

    with pytest.raises(ContractError) as info:
        load_scorer(name, settings, Path.cwd())
    assert str(info.value) == message


@pytest.mark.parametrize("name", ["pop\rulation.jsonl", "pop\nulation.jsonl", "pop\x1bulation.jsonl"])
def test_a_missing_file_whose_name_holds_a_control_character_is_named_on_one_line(tmp_path: Path,
                                                                                  name: str) -> None:
    # Found by the declaration fuzz: a population path of "\r" was echoed raw, splitting the one-line error.
    with pytest.raises(ContractError) as err:
        read_regular_file(tmp_path / name, "population file")
    text = str(err.value)
    assert text.isprintable(), repr(text)
    shown = name.encode("unicode_escape").decode("ascii")
    assert text == f"population file {tmp_path}/{shown} does not exist: point the declaration at the file"


def test_a_file_is_read_with_memory_for_its_size_not_for_the_limit(tmp_path: Path) -> None:
    # Reading asked for the whole limit (1 GiB) at once: no resident memory, but a gigabyte of address space for
    # every small population file, which a job limited in virtual memory cannot give.
    path = tmp_path / "population.jsonl"
    path.write_bytes(b'{"id": "u1", "prompt": "1+1=", "answer": 2}\n' * 100)
    tracemalloc.start()
    try:
        data = read_regular_file(path, "population file")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert data == path.read_bytes()
    assert peak < 64 * 1024, peak


def test_a_file_longer_than_it_was_when_opened_is_read_whole_and_still_held_to_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "population.jsonl"
    path.write_bytes(b"x" * 5000)
    real = os.fstat

    def shrunk(fd: int) -> os.stat_result:  # as if the file grew after fstat: it reports 10 bytes
        info = real(fd)
        return os.stat_result((*info[:6], 10, *info[7:]))

    monkeypatch.setattr(regular_files, "_READ_PIECE", 1000)
    monkeypatch.setattr(regular_files.os, "fstat", shrunk)
    assert read_regular_file(path, "population file") == b"x" * 5000
    with pytest.raises(ContractError, match=r"holds more than the 4,000 bytes a population file may hold"):
        read_regular_file(path, "population file", limit=4000)


def test_a_model_folder_whose_name_holds_a_control_character_is_named_on_one_line(tmp_path: Path) -> None:
    # Found by the contract fuzz: a reference model_dir of "\r", a folder without a tokenizer, was echoed raw by the
    # tokenizer's reader, splitting the one-line error.
    ws = make_workspace(tmp_path, units=20)
    (tmp_path / "mo\rdel").mkdir()
    data = json.loads(ws.contract_path.read_bytes())
    data["reference"]["model_dir"] = "mo\rdel"
    ws.contract_path.write_bytes(parse_contract(json.dumps(data).encode(), "c").canonical_json())
    with pytest.raises(ContractError) as err:
        load_contract(ws.contract_path)
    text = str(err.value)
    assert text.isprintable(), repr(text)
    assert f"{tmp_path}/mo\\rdel/tokenizer.json does not exist" in text


def test_a_fifo_swapped_in_after_the_stat_is_refused_not_waited_on(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`read_owner_file` checks what it opened, not only what it stat-ed: a FIFO put in the file's place after the
    check is refused at once (issue 51: the open blocked until a writer came)."""
    fifo, regular = tmp_path / "declaration.toml", tmp_path / "regular.toml"
    os.mkfifo(fifo)
    regular.write_text("name = 'x'\n")
    real = Path.stat
    monkeypatch.setattr(Path, "stat", lambda self, **kw: real(regular) if self == fifo else real(self, **kw))
    got: list[BaseException | str] = []

    def read() -> None:
        try:
            got.append(read_owner_file(fifo, "declaration"))
        except BaseException as exc:
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # release the waiting open before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert got, "read_owner_file waited on a FIFO"
    assert isinstance(got[0], ContractError)
    assert str(got[0]) == f"{fifo}: cannot read the declaration: it is not a regular file; give the declaration file"
