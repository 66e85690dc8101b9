"""Populations: the one file format a declaration points at for the units a decision is about.

Decisions this module embodies:

- **One format, JSON lines.** A population file is UTF-8 text, one JSON object per line, each line a unit:

      {"id": "q-001", "prompt": "Capital of France?", "answer": "Paris", "kind": "geo", "meta": {"src": "x"}}
      {"id": "q-002", "messages": [{"role": "user", "content": "2+2?"}], "answer": 4}

  `id` (a non-empty string, unique in the file); exactly one of `prompt` (a non-empty string, the raw text the
  model continues) or `messages` (a non-empty list of `{"role", "content"}` objects, rendered later by the model's
  own chat template); `answer` (any JSON value; what it must be is the scorer's business, checked by the scorer at
  load); optional `kind` (a non-empty string: the category label of per-kind breakdowns); optional `meta` (a JSON
  object the core carries but never reads). Any other top-level field is refused, so a misspelt `answr` or
  `promt` is an error rather than a silently missing value. The arithmetic files (`id`, `prompt`, `answer`,
  `kind`) are already in this format and load unchanged, byte for byte.
- **Messages are exactly role and content.** A role is one of `system`, `user`, `assistant`, `tool` (the roles
  transformers' chat templates handle) and content is a string. Other per-message keys (`name`, `tool_calls`,
  `tool_call_id`, content parts) are refused: templates treat them inconsistently, and the prompt a contract binds
  must be what the declaration plainly says. Whether a template accepts the sequence of roles is the template's
  decision, made when it renders.
- **One spelling per file.** The digest pins the bytes, so the bytes must have one reading: lines are split on
  `\\n` only (a `\\u2028` inside a JSON string is text, not a line break), a blank line (empty or only whitespace)
  is refused rather than skipped, a key repeated inside an object is refused (JSON leaves its meaning open), and
  `NaN`/`Infinity` (not JSON) and numbers past a float's range are refused. The final `\\n` may be present or
  absent. Because blank lines are refused, unit `i` (from 0) of a file is on line `i + 1`.
- **Read once, checked on what was read.** The file must be a regular file (a FIFO, device or directory is refused
  at once instead of blocking); its bytes are read once and both the sha256 check and the parse use those bytes,
  so the digest always names exactly what was loaded.
- **Every error is one line** naming the file, the 1-based line number and what to change; a repeated id names
  the line that first used it.
- **Units are immutable.** JSON arrays in `answer` and `meta` become tuples and objects become `FrozenMap`s, so a
  `Unit` is hashable and no scorer can alter what another reads; `thaw` gives the plain JSON value back.
- **A Unit stands where a Problem stands.** It has `.id`, `.prompt`, `.answer` and `.kind` (`""` when the line
  declares none, as `arithmetic.Problem`), so code written for arithmetic problems reads prompt units unchanged.
"""

from __future__ import annotations

import array
import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, overload

from invar import owner_files
from invar.canonical import show
from invar.errors import ContractError

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
"""The message roles a unit may use."""

FIELDS: tuple[str, ...] = ("id", "prompt", "messages", "answer", "kind", "meta")
"""Every top-level field a unit line may have."""

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class FrozenMap(Mapping[str, Any]):
    """A read-only, hashable JSON object (keys in the order the file gave them; equality ignores order)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items: dict[str, Any] = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


_EMPTY = FrozenMap()
"""The one empty object: most units have no `meta`, and a population of 20,000 would otherwise hold 20,000."""


def freeze(value: Any) -> Any:
    """A JSON value with its arrays as tuples and its objects as `FrozenMap`s (scalars unchanged)."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, Mapping):
        return FrozenMap({k: freeze(v) for k, v in value.items()}) if value else _EMPTY
    return value


def thaw(value: Any) -> Any:
    """The plain JSON value (lists and dicts) of a frozen one: `thaw(freeze(x)) == x` for every JSON value x."""
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message of a unit."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of a population: what the model is given, and the answer its scorer reads.

    Exactly one of `prompt` and `messages` is set. `line` is the 1-based line of the file it came from (0 when
    built in code); it is for messages only and takes no part in equality.
    """

    id: str
    prompt: str | None
    messages: tuple[Message, ...] | None
    answer: Any
    """A frozen JSON value (see `freeze`)."""
    kind: str = ""
    """The category label, `""` when none is declared."""
    meta: FrozenMap = field(default_factory=lambda: _EMPTY)
    line: int = field(default=0, compare=False, repr=False)

    def chat(self) -> list[dict[str, str]]:
        """The messages as the `{role, content}` maps a chat template renders; raises ValueError for a prompt unit."""
        if self.messages is None:
            raise ValueError(f"unit {self.id!r} has a prompt, not messages")
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def to_json(self) -> dict[str, Any]:
        """The unit as the JSON object of its line (fields it does not declare left out)."""
        row: dict[str, Any] = {"id": self.id, "answer": thaw(self.answer)}
        if self.prompt is not None:
            row["prompt"] = self.prompt
        if self.messages is not None:
            row["messages"] = self.chat()
        if self.kind:
            row["kind"] = self.kind
        if self.meta:
            row["meta"] = thaw(self.meta)
        return row


def read_regular_file(path: str | Path, what: str) -> bytes:
    """The bytes of a regular file of at most 1 GiB (`invar.owner_files.read_regular_file`); `what` names the file
    in errors (e.g. `"population file"`)."""
    return owner_files.read_regular_file(path, what)


def check_sha256(what: str, path: Path, data: bytes, expected: str) -> str:
    """The sha256 of `data`; raises `ContractError` naming both digests unless it is `expected` (any case)."""
    if _SHA256.fullmatch(expected) is None:
        raise ContractError(f"{what} {path}: declared sha256 {show(expected, 80)} is not 64 hex digits: declare the "
                            "file's sha256")
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected.lower():
        raise ContractError(f"{what} {path} has sha256 {actual} but {expected.lower()} was declared: use the file "
                            "the digest names, or declare this file's digest")
    return actual


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {show(key)} appears twice in one object")
        obj[key] = value
    return obj


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as inf: a value no JSON writer would give back
        raise ValueError(f"number {show(text)} is out of a float's range")
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_object_pairs, parse_constant=_no_constant, parse_float=_finite_float)


def _message(raw: Any, index: int) -> Message | str:
    """The message, or what is wrong with it."""
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        return f"{where} is {type(raw).__name__}, not an object with role and content"
    if raw.keys() != {"role", "content"}:
        missing = sorted({"role", "content"} - raw.keys())
        extra = sorted(raw.keys() - {"role", "content"})
        wrong = (f"lacks {', '.join(missing)}" if missing
                 else f"has keys {', '.join(map(show, extra))} besides role and content")
        return f"{where} {wrong}: a message is exactly {{\"role\", \"content\"}}"
    role, content = raw["role"], raw["content"]
    if not isinstance(role, str) or role not in ROLES:
        return f"{where}.role {show(role)} is not one of {', '.join(ROLES)}"
    if not isinstance(content, str):
        return f"{where}.content is {type(content).__name__}, not a string"
    return Message(role=role, content=content)


def _unit(row: Any, line: int) -> Unit | str:
    """The unit of one parsed line, or what is wrong with it."""
    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object: write one object per line"
    unknown = [k for k in row if k not in FIELDS]
    if unknown:
        return (f"has unknown field {show(unknown[0])}: a unit has only the fields {', '.join(FIELDS)} "
                "(put extra data under meta)")
    if "id" not in row:
        return "has no id: give every unit a string id"
    uid = row["id"]
    if not isinstance(uid, str) or not uid:
        return f"id {show(uid)} is not a non-empty string"
    if ("prompt" in row) == ("messages" in row):
        both = "both prompt and messages" if "prompt" in row else "neither prompt nor messages"
        return f"unit {uid!r} has {both}: give exactly one"
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt:
            return f"unit {uid!r}: prompt is {show(prompt)}, not a non-empty string"
    else:
        raw = row["messages"]
        if not isinstance(raw, list) or not raw:
            return f"unit {uid!r}: messages must be a non-empty list of {{\"role\", \"content\"}} objects"
        parsed: list[Message] = []
        for i, m in enumerate(raw):
            got = _message(m, i)
            if isinstance(got, str):
                return f"unit {uid!r}: {got}"
            parsed.append(got)
        messages = tuple(parsed)
    if "answer" not in row:
        return f"unit {uid!r} has no answer: give the value its scorer checks"
    kind = row.get("kind", "")
    if "kind" in row and (not isinstance(kind, str) or not kind):
        return f"unit {uid!r}: kind is {show(kind)}, not a non-empty string (leave kind out for none)"
    meta = row.get("meta", {})
    if not isinstance(meta, dict):
        return f"unit {uid!r}: meta is a JSON {type(meta).__name__}, not an object"
    # A population has a few kinds, each named on every unit of it: one string each.
    return Unit(id=uid, prompt=prompt, messages=messages, answer=freeze(row["answer"]), kind=sys.intern(kind),
                meta=freeze(meta), line=line)


def parse_units(data: bytes, path: str | Path) -> tuple[Unit, ...]:
    """The units of a population file's bytes (see the module docstring); `path` names the file in errors.

    Raises `ContractError` for the first bad line: one line naming the file, the line number and what to change.
    """
    return tuple(_parsed(data, path))


def _parsed(data: bytes, path: str | Path) -> Iterator[Unit]:
    """`parse_units`, one unit at a time: a line is refused when it is reached."""
    what = f"population file {path}"
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    if not end:
        raise ContractError(f"{what} holds no units: write one JSON object per line")
    first_line: dict[str, int] = {}
    # One line's bytes at a time, found in place: a million-unit file is not held again as a body and its lines.
    start, number = 0, 0
    while start <= end:
        stop = data.find(b"\n", start, end)
        stop = end if stop < 0 else stop
        raw, start, number = data[start:stop], stop + 1, number + 1
        where = f"{what} line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError(f"{where} is not UTF-8 (byte {exc.start} of the line): write the file as UTF-8"
                                ) from None
        if not text.strip():
            raise ContractError(f"{where} is blank: remove it (blank lines are refused, not skipped)")
        try:
            row = _DECODER.decode(text)
        except json.JSONDecodeError as exc:
            raise ContractError(f"{where} is not JSON ({exc.msg} at column {exc.colno}): write one JSON object "
                                "per line") from None
        except (ValueError, RecursionError) as exc:  # NaN, a repeated key, an int past Python's digit limit
            raise ContractError(f"{where} is not valid JSON ({show(str(exc), 120)}): write one JSON object per line"
                                ) from None
        got = _unit(row, number)
        if isinstance(got, str):
            raise ContractError(f"{where} {got}" if got.startswith(("is ", "has ")) else f"{where}: {got}")
        if got.id in first_line:
            raise ContractError(f"{where}: id {got.id!r} was already used on line {first_line[got.id]}: give every "
                                "unit its own id")
        first_line[got.id] = number
        yield got


class UnitTable(Sequence[Unit]):
    """A parsed population kept compactly: each unit's id, prompt and text answer as slices of one string per field,
    its kind as an index into the kinds, and the few other fields (messages, an answer that is not a string, meta) by
    unit index; a `Unit` is built when the table is indexed, equal to the one `parse_units` gives. A million units
    take tens of bytes each instead of a few objects each (about 0.3 KiB). Unit `i` is on line `i + 1`."""

    __slots__ = ("_chats", "_ends", "_kind_of", "_kinds", "_meta", "_other", "_text")

    def __init__(self, units: Iterable[Unit]) -> None:
        kinds: dict[str, int] = {}
        kind_of = array.array("I")
        ends = array.array("q")
        chats: dict[int, tuple[Message, ...]] = {}
        other: dict[int, Any] = {}
        meta: dict[int, FrozenMap] = {}
        parts: list[str] = []
        text: list[str] = []
        size = 0
        for i, u in enumerate(units):
            answer = u.answer
            if type(answer) is not str:
                other[i] = answer
                answer = ""
            if u.messages is not None:
                chats[i] = u.messages
            if u.meta:
                meta[i] = u.meta
            prompt = "" if u.prompt is None else u.prompt
            for part in (u.id, prompt, answer):
                size += len(part)
                ends.append(size)
                parts.append(part)
            kind_of.append(kinds.setdefault(u.kind, len(kinds)))
            if len(parts) >= 1 << 16:  # joined as it goes: the table never holds a string object per field
                text.append("".join(parts))
                parts.clear()
        text.append("".join(parts))
        self._text = "".join(text)
        self._ends = ends
        self._kinds = tuple(kinds)
        self._kind_of = kind_of
        self._chats = chats
        self._other = other
        self._meta = meta

    def __len__(self) -> int:
        return len(self._kind_of)

    def _field(self, index: int, field: int) -> str:
        k = index * 3 + field  # three fields a unit: id, prompt, answer
        return self._text[self._ends[k - 1] if k else 0:self._ends[k]]

    def unit_id(self, index: int) -> str:
        """Unit `index`'s id, without building the unit."""
        return self._field(index, 0)

    def ids(self) -> list[str]:
        """Every unit's id, in order."""
        return [self._field(i, 0) for i in range(len(self))]

    def chat_indices(self) -> list[int]:
        """The indices of the units given as messages (the others have a plain prompt)."""
        return sorted(self._chats)

    @overload
    def __getitem__(self, index: int) -> Unit: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Unit, ...]: ...
    def __getitem__(self, index: int | slice) -> Unit | tuple[Unit, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        n = len(self._kind_of)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("unit index out of range")
        k = index * 3
        ends, text = self._ends, self._text
        start = ends[k - 1] if k else 0
        a, b, c = ends[k], ends[k + 1], ends[k + 2]
        messages = self._chats.get(index)
        answer = self._other[index] if index in self._other else text[b:c]
        return Unit(text[start:a], None if messages is not None else text[a:b], messages, answer,
                    self._kinds[self._kind_of[index]], self._meta.get(index, _EMPTY), index + 1)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UnitTable):
            return (self._text, self._ends, self._kinds, self._kind_of, self._chats, self._other, self._meta) == \
                (other._text, other._ends, other._kinds, other._kind_of, other._chats, other._other, other._meta)
        return isinstance(other, Sequence) and len(other) == len(self) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"UnitTable({len(self)} units)"


def load_unit_table(path: str | Path, expected_sha256: str | None = None) -> UnitTable:
    """`load_units`, the units kept as a `UnitTable`: the same checks and refusals, in the same order."""
    path = Path(path)
    data = read_regular_file(path, "population file")
    if expected_sha256 is not None:
        check_sha256("population file", path, data, expected_sha256)
    return UnitTable(_parsed(data, path))


def load_units(path: str | Path, expected_sha256: str | None = None) -> tuple[Unit, ...]:
    """The units of a population file, after checking its sha256 against `expected_sha256` when one is given.

    The file is read once; the digest and the parse see the same bytes. Raises `ContractError` (one line naming
    the file, and the line where there is one) for a missing or irregular file, a digest mismatch, or a bad line.
    """
    path = Path(path)
    data = read_regular_file(path, "population file")
    if expected_sha256 is not None:
        check_sha256("population file", path, data, expected_sha256)
    return parse_units(data, path)


def check_context(units: Sequence[Unit], prompt_tokens: Callable[[Unit], int], max_tokens: int, context: int,
                  path: str | Path) -> tuple[int, ...]:
    """The prompt token count of each unit, after checking every prompt leaves room for `max_tokens` of response.

    `prompt_tokens` gives the number of tokens the model sees for a unit (its tokenizer, and chat template for
    messages, live elsewhere). A unit whose count exceeds `context - max_tokens` is refused: one line naming the
    file, the unit's line and id, its count and the limit, and how many units are too long in all.
    """
    if max_tokens < 1 or context < 1:
        raise ContractError(f"max_tokens {max_tokens} and context {context} must both be at least 1")
    limit = context - max_tokens
    if limit < 1:
        raise ContractError(f"sampling.max_tokens {max_tokens} leaves no room for a prompt in the model's context "
                            f"of {context} tokens: lower max_tokens")
    counts: list[int] = []
    for unit in units:
        n = prompt_tokens(unit)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(f"prompt_tokens gave {show(n)} for unit {unit.id!r}, not a token count")
        counts.append(n)
    over = [i for i, n in enumerate(counts) if n > limit]
    if over:
        first = units[over[0]]
        line = f" line {first.line}" if first.line else ""
        others = f" ({len(over)} units are too long)" if len(over) > 1 else ""
        raise ContractError(
            f"population file {path}{line}: unit {first.id!r} has a prompt of {counts[over[0]]} tokens but the model's "
            f"context of {context} less max_tokens {max_tokens} leaves {limit}{others}: shorten or drop those units, "
            "or lower max_tokens"
        )
    return tuple(counts)


def _sample_key(seed: int, unit_id: str) -> bytes:
    # The same key as `invar.contract.plan.select_units`, so a sample taken here is the sample a plan takes.
    return hashlib.sha256(json.dumps(["invar.sample/1", seed, unit_id], ensure_ascii=False,
                                     separators=(",", ":")).encode()).digest()


def sample_units(units: Sequence[Unit], sample: int | None, seed: int) -> tuple[Unit, ...]:
    """All units, or the `sample` units with the smallest sha256(`["invar.sample/1", seed, id]`), in file order.

    The rule of `invar.contract.plan.select_units`; raises `ContractError` if ids repeat or `sample` is out of range.
    """
    ids = [u.id for u in units]
    if len(set(ids)) != len(ids):
        raise ContractError("population: unit ids repeat; give every unit its own id")
    if sample is None:
        return tuple(units)
    if not 1 <= sample <= len(units):
        raise ContractError(f"population.sample: {sample} is not between 1 and the {len(units)} units; change it")
    chosen = set(sorted(ids, key=lambda i: _sample_key(seed, i))[:sample])
    return tuple(u for u in units if u.id in chosen)


def kinds(units: Sequence[Unit]) -> dict[str, int]:
    """How many units carry each kind label, in order of first appearance (`""` for units with none)."""
    counts: dict[str, int] = {}
    for u in units:
        counts[u.kind] = counts.get(u.kind, 0) + 1
    return counts
