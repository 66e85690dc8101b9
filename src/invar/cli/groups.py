"""Option groups: a command with many options takes them as a few typed values.

A group is a frozen dataclass whose fields are `Annotated` typer options with their defaults (the shared-alias style
of `invar.cli.options`, gathered by what they state). Typer reads a command's parameters from its signature, so
`grouped` gives the command the signature it would have with every group's fields written out in its place, in
order (the options, their help and defaults read exactly as written out), and builds each group from the parsed
values before the command runs. Only typer and the standard library are imported here: a command's `--help`
stays as cheap as before.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def _group(annotation: object) -> type[Any] | None:
    """The dataclass a parameter is annotated with, or None for a plain option or argument."""
    return annotation if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else None


def grouped(command: Callable[..., R]) -> Callable[..., R]:
    """`command`, its parameters annotated with an option group written out as the group's fields (each a keyword
    the command line fills); the command is called with each group built from them."""
    signature = inspect.signature(command, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type[Any], list[str]]] = {}
    for param in signature.parameters.values():
        group = _group(param.annotation)
        if group is None:
            params.append(param)
            continue
        hints = typing.get_type_hints(group, include_extras=True)
        fields = dataclasses.fields(group)
        for f in fields:
            if f.name in signature.parameters or any(p.name == f.name for p in params):
                raise TypeError(f"{command.__name__}: option {f.name!r} of {group.__name__} is given twice")
            params.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default,
                                            annotation=hints[f.name]))
        groups[param.name] = (group, [f.name for f in fields])

    @functools.wraps(command)
    def run(**values: Any) -> R:
        for name, (group, names) in groups.items():
            values[name] = group(**{n: values.pop(n) for n in names})
        return command(**values)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    return run
