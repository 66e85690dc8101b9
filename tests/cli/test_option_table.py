"""Every command's parameters keep their flags, types, defaults and metavars: the table of all of them, read from the
click commands typer builds, equals the one recorded in fixtures/options.json (the help texts are not in it: they
may be reworded, as the shared option aliases of `invar.cli.options` were). A change to a flag, its type or its
default is a deliberate one: write the table again (`python tests/cli/test_option_table.py`) and say why."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

import typer

from invar.cli.app import app
from invar.home import HOME

FIXTURE = Path(__file__).parent / "fixtures" / "options.json"


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every command and group under `group` by its full name, the root as ""."""
    found = {prefix.strip(): group}
    ctx = typer.Context(group)
    for name in group.list_commands(ctx):  # the root builds its commands on first use: ask, don't read `.commands`
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "commands"):
            found.update(_commands(cmd, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = cmd
    return found


def _default(value: object) -> object:
    """A default as JSON: an enum by its value, a path under INVAR_HOME relative to it (the table holds on any
    checkout)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        return f"$INVAR_HOME/{value.relative_to(HOME)}" if value.is_relative_to(HOME) else str(value)
    return value


def table() -> dict[str, list[dict[str, Any]]]:
    """Each command's parameters in order: name, flags, type, choices, default, metavar and how many it takes."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, cmd in _commands(typer.main.get_command(app)).items():
        rows = []
        for p in cmd.params:
            annotation = p.type_descriptor.annotation
            choices = [m.value for m in annotation] if isinstance(annotation, type) and issubclass(
                annotation, enum.Enum) else None
            rows.append({"name": p.name, "kind": p.param_type_name, "opts": [*p.opts, *p.secondary_opts],
                         "type": str(annotation), "choices": choices, "default": _default(p.default),
                         "metavar": p.metavar, "multiple": p.multiple, "required": p.required,
                         "flag": getattr(p, "is_flag", None), "hidden": getattr(p, "hidden", False)})
        out[name] = rows
    return out


def test_every_flag_keeps_its_name_type_and_default() -> None:
    recorded = json.loads(FIXTURE.read_text())
    now = table()
    assert sorted(now) == sorted(recorded), "a command was added or removed: write the table again"
    for name, rows in recorded.items():
        assert now[name] == rows, name


SHARED: dict[str, set[str]] = {
    "--json": set(), "--quiet": set(), "--call-timeout": set(), "--top-p": set(), "--adapter": set(),
    "--expect-head": set(), "--max-tokens": set(), "--scorer": set(), "--scorer-setting": set(),
    "--temperature": {"score"}, "--model": {"use package", "use init", "kernel check"},
    "--engine": {"use init"}, "--dtype": {"use init"}, "--quantization": {"use init"}, "--setting": {"use init"},
    "--patch": {"use init"}, "--run": {"train", "use run", "use verify"}, "--confidence": {"use init"},
    "--population": {"kernel check"},
}
"""Each option alias of `invar.cli.options` and `invar.cli.common`, and the commands that give its flag a meaning of
their own (the module's docstring says why)."""


def test_a_shared_option_reads_the_same_in_every_command_that_takes_it() -> None:
    helps: dict[str, dict[str, str]] = {}
    for name, cmd in _commands(typer.main.get_command(app)).items():
        for p in cmd.params:
            for flag in p.opts:
                if not getattr(p, "hidden", False):
                    helps.setdefault(flag, {})[name] = p.help
    for flag, own in SHARED.items():
        taking = {name: text for name, text in helps[flag].items() if name not in own}
        assert len(taking) >= 2, (flag, taking)
        assert len(set(taking.values())) == 1, (flag, taking)
        assert own <= set(helps[flag]), (flag, own)


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(table(), indent=1, ensure_ascii=False) + "\n")
