"""Capture steps: which steps of a response get a whole-vocabulary capture, written before any response exists.

A step is an index into the response's tokens: step s is the distribution the token at position s was drawn from
(conditioned on the prompt and tokens 0…s−1). A specification lists integers, `last` (the response's final step)
and `every:K` (steps 0, K, 2K, … within the response); it is resolved against each response's length. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

Step = int | str
"""A non-negative integer, `"last"`, or `"every:K"` with K ≥ 1."""

_EVERY = re.compile(r"every:([1-9][0-9]{0,5})")
MAX_STEPS = 64
"""Entries a specification may list."""


def check_step(value: object) -> Step:
    """One entry, validated; `ValueError` naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a step; write a step number, 'last' or 'every:K'")
    if isinstance(value, int):
        if not 0 <= value < 1 << 20:
            raise ValueError(f"step {value} is out of range; steps count from 0")
        return value
    if isinstance(value, str) and (value == "last" or _EVERY.fullmatch(value)):
        return value
    raise ValueError(f"{value!r} is not a step; write a step number (0, 1, …), 'last' or 'every:K'")


def parse_steps(text: str) -> tuple[Step, ...]:
    """`"0,1,last"` or `"every:4,last"` → the specification; `ValueError` for anything else."""
    out: list[Step] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"{text!r}: an empty entry; write e.g. 0,1,last")
        out.append(check_step(int(part) if part.isdigit() else part))
    if len(out) > MAX_STEPS:
        raise ValueError(f"{len(out)} entries; at most {MAX_STEPS}")
    return tuple(out)


def resolve_steps(spec: Sequence[Step], length: int, *, strict: bool) -> tuple[int, ...]:
    """The steps, ascending and distinct, of a response of `length` tokens.

    An integer step past the response's end raises `ValueError` when `strict` (a step asked of given tokens) and is
    left out otherwise (a step declared before the response existed).
    """
    if length < 1:
        raise ValueError("a response of no tokens has no steps")
    steps: set[int] = set()
    for entry in spec:
        if isinstance(entry, int):
            if entry >= length:
                if strict:
                    raise ValueError(f"step {entry} is beyond the response's end ({length} tokens, steps 0–"
                                     f"{length - 1})")
                continue
            steps.add(entry)
        elif entry == "last":
            steps.add(length - 1)
        else:
            match = _EVERY.fullmatch(entry)
            assert match is not None
            steps.update(range(0, length, int(match.group(1))))
    return tuple(sorted(steps))


def show_steps(spec: Sequence[Step]) -> str:
    return ",".join(str(s) for s in spec)


__all__ = ["MAX_STEPS", "Step", "check_step", "parse_steps", "resolve_steps", "show_steps"]
