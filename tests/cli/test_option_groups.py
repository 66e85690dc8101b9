"""Option groups (`invar.cli.groups.grouped`): a command that takes its options as typed groups parses and shows them
as if each group's fields were written out in its place, and receives each group built from the parsed values; an
option given by two groups is refused when the command is defined. `use init` takes its options this way."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from invar.cli.groups import grouped


@dataclass(frozen=True)
class _Side:
    """Options of one side."""

    engine: Annotated[str, typer.Option("--engine", help="The engine.")] = "hf"
    candidate_engine: Annotated[str | None, typer.Option("--candidate-engine", help="The candidate's.")] = None


@dataclass(frozen=True)
class _Output:
    """Where it goes."""

    force: Annotated[bool, typer.Option("--force", help="Overwrite.")] = False


def _app(received: list[tuple[str, _Side, int, _Output]]) -> typer.Typer:
    app = typer.Typer(rich_markup_mode=None)

    @app.command()
    @grouped
    def make(out: Annotated[str, typer.Argument(help="Where.")], side: _Side,
             count: Annotated[int, typer.Option("--count", help="How many.")] = 1, output: _Output = _Output()) \
            -> None:
        """Make one."""
        received.append((out, side, count, output))

    return app


def test_a_grouped_command_reads_as_if_its_groups_were_written_out() -> None:
    received: list[tuple[str, _Side, int, _Output]] = []
    app = _app(received)
    result = CliRunner().invoke(app, ["x.toml", "--candidate-engine", "vllm", "--count", "3", "--force"])
    assert result.exit_code == 0, result.output
    assert received == [("x.toml", _Side("hf", "vllm"), 3, _Output(True))]
    shown = CliRunner().invoke(app, ["--help"], terminal_width=100).output
    order = [shown.index(flag) for flag in ("--engine", "--candidate-engine", "--count", "--force")]
    assert order == sorted(order)  # each group's options in its place
    assert "Make one." in shown
    assert "The candidate's." in shown


def test_the_signature_is_the_groups_fields_in_place() -> None:
    @grouped
    def make(out: str, side: _Side, output: _Output) -> None:
        """Make one."""

    assert list(inspect.signature(make).parameters) == ["out", "engine", "candidate_engine", "force"]
    assert make.__doc__ == "Make one."


def test_an_option_given_twice_is_refused_where_the_command_is_defined() -> None:
    with pytest.raises(TypeError, match="option 'engine' of _Side is given twice"):
        @grouped
        def make(engine: str, side: _Side) -> None:
            """Make one."""
