"""The core's table of engines (`invar.engines.ENGINE_TABLE`) says what each worker takes; the workers keep their
own command lines (they import nothing of the core beyond the protocol). These tests read each worker's source with
`ast` (nothing of torch, vLLM or MLX is imported) and hold the two to each other: every launch setting's flag, type,
choices and default is the worker's, and the names a contract, `--engine` and the table know are the same."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, get_args

import pytest

from invar.engines import ENGINE_TABLE, ENGINES, Engine, EngineName, launch_args, worker_env

WORKERS = Path(__file__).resolve().parents[1] / "src" / "invar" / "workers"


def _constant(node: ast.expr, module: ast.Module) -> Any:
    """A literal argument, or a list/tuple of literals, or a module-level name bound to one."""
    if isinstance(node, ast.Name):
        for stmt in module.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == node.id for t in targets):
                assert stmt.value is not None
                return _constant(stmt.value, module)
        raise AssertionError(f"{node.id} is not bound at module level")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "tuple"):
        return tuple(_constant(node.args[0], module))
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(_constant(e, module) for e in node.elts)
    return ast.literal_eval(node)


def worker_flags(module_name: str) -> dict[str, dict[str, Any]]:
    """Each `add_argument` of the worker module's own parser: flag → its keywords, evaluated when asked (type as a
    name)."""
    source = (WORKERS / (module_name.rsplit(".", 1)[1] + ".py")).read_text(encoding="utf-8")
    module = ast.parse(source)
    flags: dict[str, dict[str, Any]] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument" \
                and node.args and isinstance(node.args[0], ast.Constant):
            flags[node.args[0].value] = {k.arg: k.value for k in node.keywords if k.arg is not None}
    return flags


def _keywords(nodes: dict[str, Any], module_name: str) -> dict[str, Any]:
    module = ast.parse((WORKERS / (module_name.rsplit(".", 1)[1] + ".py")).read_text(encoding="utf-8"))
    return {k: v.id if k == "type" and isinstance(v, ast.Name) else _constant(v, module)
            for k, v in nodes.items() if k in ("type", "choices", "default", "required", "action")}


@pytest.mark.parametrize("engine", sorted(ENGINE_TABLE))
def test_each_launch_setting_is_the_workers_own_option(engine: str) -> None:
    info = ENGINE_TABLE[engine]
    flags = worker_flags(info.module)
    assert "--role" in flags  # the parser found is the worker's
    for name, launch in info.settings.items():
        assert launch.flag in flags, f"{engine}.{name}: the worker takes no {launch.flag}"
        kw = _keywords(flags[launch.flag], info.module)
        if launch.kind is bool:
            # A flag that turns the worker's default off: given only when the value is not the default.
            assert kw.get("action") == ("store_false" if launch.flag_when is False else "store_true"), name
            assert launch.default is (not launch.flag_when), name
            continue
        assert kw.get("type", "str") == launch.kind.__name__, name
        assert bool(kw.get("required")) == launch.required, name
        assert kw.get("default") == launch.default, name
        if "choices" in kw:
            assert tuple(kw["choices"]) == launch.choices, name


def test_the_engine_names_are_the_tables() -> None:
    assert set(get_args(EngineName)) == {e.value for e in Engine} == set(ENGINE_TABLE) - {"echo"}
    assert {name: e.module for name, e in ENGINE_TABLE.items()} == ENGINES


def test_a_worker_gets_its_own_engines_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    vllm, hf = worker_env(None, "vllm"), worker_env(None, "hf")
    assert vllm["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert vllm["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in hf
    assert hf["HF_HUB_OFFLINE"] == "1"
    # Without an engine (a script that starts any worker itself): every engine's, as before.
    assert worker_env()["VLLM_LOGGING_LEVEL"] == "WARNING"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # the caller's environment wins
    assert worker_env(None, "vllm")["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert worker_env({"X_EXTRA": "1"}, "hf")["PYTHONPATH"].split(os.pathsep)[0].endswith("src")


def test_launch_args_come_from_the_table() -> None:
    assert launch_args("openai", {"base_url": "http://h", "served_model": "m", "retries": 2}, {"p": "0" * 64}) == [
        "--base-url", "http://h", "--served-model", "m", "--retries", "2", "--patch", f"p={'0' * 64}"]
    assert launch_args("echo", {"threads": 2}, {}) == []


def test_setting_help_names_every_required_setting_from_the_table() -> None:
    """`--setting`'s help is made from the table: an engine that requires settings is named with each of them."""
    from typer.testing import CliRunner

    from invar.cli.app import app

    required = {e.name: [n for n, s in e.settings.items() if s.required] for e in ENGINE_TABLE.values()}
    assert any(required.values()), "no engine requires a setting: the test would check nothing"
    for command in (["infer"], ["use", "package"]):  # one shared option: the same help wherever it is taken
        shown = " ".join(CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"}).output.split())
        for engine, names in required.items():
            if names:
                assert f"for the {engine} engine: " + " and ".join(f"{n}=…" for n in names) in shown, command


@pytest.mark.parametrize("engine", sorted(e for e, info in ENGINE_TABLE.items() if info.reported))
def test_each_reported_setting_is_one_the_worker_names(engine: str) -> None:
    # The core refuses a package setting outside the launch settings and `reported` before any worker starts: every
    # name it lists must be one the worker's source writes, so no setting a worker reports is refused.
    info = ENGINE_TABLE[engine]
    source = (WORKERS / (info.module.rsplit(".", 1)[1] + ".py")).read_text(encoding="utf-8")
    named = {node.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert info.reported is not None
    assert sorted(info.reported - named) == []
