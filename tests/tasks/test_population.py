"""Population files: the format, its one-line errors, the arithmetic files unchanged, context and sampling."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.errors import ContractError
from invar.tasks.arithmetic import load_population
from invar.tasks.population import (
    FrozenMap,
    Message,
    Unit,
    check_context,
    freeze,
    kinds,
    load_unit_table,
    load_units,
    parse_units,
    sample_units,
    thaw,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"


def declared(path: Path) -> str:
    digest, name = (path.parent / f"{path.stem}.sha256").read_text().split()
    assert name == path.name
    return digest


def write(tmp_path: Path, *lines: str | bytes, name: str = "pop.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def at(path: Path) -> str:
    """The start of an error naming a population file, as a pattern."""
    return re.escape(f"population file {path}")


def row(**fields: Any) -> str:
    return json.dumps(fields, ensure_ascii=False)


GOOD = row(id="a", prompt="2+2=", answer="4")


@pytest.mark.parametrize("name", ["arith-eval.jsonl", "arith-train.jsonl"])
def test_arithmetic_files_load_unchanged(name: str) -> None:
    path = DATA / name
    digest = declared(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    units = load_units(path, digest)
    problems = load_population(path, digest)
    assert len(units) == len(problems) == 20000
    assert [(u.id, u.prompt, u.answer, u.kind) for u in units] == [(p.id, p.prompt, p.answer, p.kind)
                                                                   for p in problems]
    assert all(u.messages is None and not u.meta for u in units)
    assert [u.line for u in units[:3]] == [1, 2, 3]
    # the file re-written from the units is the same bytes
    again = b"".join(json.dumps(u.to_json(), sort_keys=True, separators=(",", ":")).encode() + b"\n" for u in units)
    assert again == path.read_bytes()


def test_unit_with_messages_meta_and_frozen_answer(tmp_path: Path) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capitals?"}]
    path = write(tmp_path, row(id="q", messages=msgs, answer=["Paris", {"x": [1, 2]}], meta={"src": ["a"]},
                               kind="geo"))
    (unit,) = load_units(path)
    assert unit.prompt is None
    assert unit.messages == (Message("system", "Be brief."), Message("user", "Capitals?"))
    assert unit.chat() == msgs
    assert unit.answer == ("Paris", FrozenMap({"x": (1, 2)}))
    assert isinstance(unit.meta, FrozenMap)
    assert thaw(unit.meta) == {"src": ["a"]}
    assert unit.kind == "geo"
    hash(unit)  # frozen all the way down
    with pytest.raises(TypeError):
        unit.meta["src"] = 1  # type: ignore[index]
    assert unit.to_json() == {"id": "q", "messages": msgs, "answer": ["Paris", {"x": [1, 2]}], "meta": {"src": ["a"]},
                              "kind": "geo"}
    with pytest.raises(ValueError, match="has a prompt"):
        Unit("p", "x", None, "1").chat()


def test_missing_final_newline_and_unicode_line_separator(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes((row(id="a", prompt="x\u2028y\u0085z", answer="é") + "\n" + GOOD.replace('"a"', '"b"')).encode())
    units = load_units(path)
    assert [u.id for u in units] == ["a", "b"]
    assert units[0].prompt == "x\u2028y\u0085z"


def test_sha256_mismatch_names_both_digests(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_units(path, actual.upper())[0].id == "a"
    wrong = "0" * 64
    with pytest.raises(ContractError, match=f"{re.escape(str(path))}.*has sha256 {actual} but {wrong} was declared"):
        load_units(path, wrong)
    with pytest.raises(ContractError, match="not 64 hex digits"):
        load_units(path, "abc")


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ([b"\xff\xfe"], 1, r"is not UTF-8 \(byte 0"),
        ([GOOD, "{"], 2, r"is not JSON \("),
        ([GOOD, "[1, 2]"], 2, "is a JSON list, not an object"),
        (['"text"'], 1, "is a JSON str, not an object"),
        ([row(prompt="x", answer="1")], 1, "has no id"),
        ([row(id=3, prompt="x", answer="1")], 1, "id 3 is not a non-empty string"),
        ([row(id="", prompt="x", answer="1")], 1, "id '' is not a non-empty string"),
        ([row(id="a", prompt="x", messages=[], answer="1")], 1, "unit 'a' has both prompt and messages"),
        ([row(id="a", answer="1")], 1, "unit 'a' has neither prompt nor messages"),
        ([row(id="a", prompt="", answer="1")], 1, "prompt is '', not a non-empty string"),
        ([row(id="a", prompt=["x"], answer="1")], 1, "prompt is .*not a non-empty string"),
        ([row(id="a", messages=[], answer="1")], 1, "messages must be a non-empty list"),
        ([row(id="a", messages="hi", answer="1")], 1, "messages must be a non-empty list"),
        ([row(id="a", messages=["hi"], answer="1")], 1, r"messages\[0\] is str, not an object"),
        ([row(id="a", messages=[{"role": "user"}], answer="1")], 1, r"messages\[0\] lacks content"),
        ([row(id="a", messages=[{"role": "user", "content": "x", "name": "n"}], answer="1")], 1,
         r"messages\[0\] has keys 'name' besides role and content"),
        ([row(id="a", messages=[{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}], answer="1")],
         1, r"messages\[1\].role 'bot' is not one of system, user, assistant, tool"),
        ([row(id="a", messages=[{"role": "user", "content": ["x"]}], answer="1")], 1,
         r"messages\[0\].content is list, not a string"),
        ([row(id="a", prompt="x")], 1, "unit 'a' has no answer"),
        ([row(id="a", prompt="x", answer="1", answr="2")], 1, "has unknown field 'answr'.*put extra data under meta"),
        ([row(id="a", prompt="x", answer="1", kind="")], 1, "kind is '', not a non-empty string"),
        ([row(id="a", prompt="x", answer="1", kind=3)], 1, "kind is 3"),
        ([row(id="a", prompt="x", answer="1", meta=[1])], 1, "meta is a JSON list, not an object"),
        ([GOOD, "", GOOD.replace('"a"', '"b"')], 2, "is blank: remove it"),
        ([GOOD, " \t\r"], 2, "is blank"),
        ([GOOD, GOOD.replace('"a"', '"b"'), GOOD], 3, "id 'a' was already used on line 1"),
        (['{"id": "a", "id": "b", "prompt": "x", "answer": 1}'], 1, "key 'id' appears twice"),
        (['{"id": "a", "prompt": "x", "answer": NaN}'], 1, "NaN is not JSON"),
        (['{"id": "a", "prompt": "x", "answer": 1e999999}'], 1, "out of a float's range"),
        ([f'{{"id": "a", "prompt": "x", "answer": {"9" * 5000}}}'], 1, "not valid JSON"),
        (["[" * 100000], 1, "not valid JSON|not JSON"),
        (["\ufeff" + GOOD], 1, "not JSON"),
    ],
)
def test_each_bad_line_is_one_error_naming_file_and_line(tmp_path: Path, lines: list[str | bytes], line: int,
                                                         message: str) -> None:
    path = write(tmp_path, *lines)
    with pytest.raises(ContractError, match=f"{at(path)} line {line}\\b.*{message}") as info:
        load_units(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ContractError) as compact:  # the compact table refuses the same line the same way
        load_unit_table(path)
    assert str(compact.value) == str(info.value)


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(ContractError, match=f"{at(empty)} holds no units"):
        load_units(empty)
    only_newline = tmp_path / "nl.jsonl"
    only_newline.write_bytes(b"\n")
    with pytest.raises(ContractError, match="holds no units"):
        load_units(only_newline)
    with pytest.raises(ContractError, match=f"{at(tmp_path / 'nope.jsonl')} does not exist"):
        load_units(tmp_path / "nope.jsonl")


def test_directory_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=f"{at(tmp_path)} is a directory, not a regular file"):
        load_units(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pop.jsonl"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_units(fifo, "0" * 64)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():  # unblock the reader so the test process can exit, then fail
        with open(fifo, "wb"):
            pass
        raise AssertionError("load_units blocked on a FIFO")
    assert len(outcome) == 1
    assert isinstance(outcome[0], ContractError)
    assert f"population file {fifo} is a FIFO, not a regular file" in str(outcome[0])


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_device_refused() -> None:
    with pytest.raises(ContractError, match="/dev/null is a character device"):
        load_units("/dev/null")


def test_parse_units_names_the_given_path() -> None:
    with pytest.raises(ContractError, match=r"population file somewhere\.jsonl line 1 is blank"):
        parse_units(b"\n\n", "somewhere.jsonl")


def three_units(tmp_path: Path) -> tuple[Path, tuple[Unit, ...]]:
    path = write(tmp_path, row(id="a", prompt="x" * 3, answer="1"), row(id="b", prompt="x" * 9, answer="1"),
                 row(id="c", prompt="x" * 12, answer="1"))
    return path, load_units(path)


def test_check_context_counts_and_refuses_long_prompts(tmp_path: Path) -> None:
    path, units = three_units(tmp_path)

    def count(u: Unit) -> int:
        assert u.prompt is not None
        return len(u.prompt)

    assert check_context(units, count, 4, 16, path) == (3, 9, 12)  # 12 + 4 == 16 fits exactly
    with pytest.raises(ContractError, match=f"{at(path)} line 3: unit 'c' has a prompt of 12 tokens but "
                                            "the model's context of 16 less max_tokens 5 leaves 11:"):
        check_context(units, count, 5, 16, path)
    with pytest.raises(ContractError, match=r"line 2: unit 'b' has a prompt of 9 tokens .* leaves 8 \(2 units are "
                                            r"too long\)"):
        check_context(units, count, 8, 16, path)
    with pytest.raises(ContractError, match="leaves no room"):
        check_context(units, count, 16, 16, path)
    with pytest.raises(ContractError, match="at least 1"):
        check_context(units, count, 0, 16, path)
    with pytest.raises(TypeError, match="not a token count"):
        check_context(units, lambda u: True, 4, 16, path)


def test_check_context_of_units_built_in_code_has_no_line() -> None:
    with pytest.raises(ContractError, match=r"population file p\.jsonl: unit 'z' has a prompt of 5 tokens"):
        check_context([Unit("z", "hello", None, "1")], lambda u: 5, 1, 5, "p.jsonl")


def plan_key(seed: int, unit_id: str) -> bytes:
    """The sample key of `invar.contract.plan` as its module docstring states it."""
    return hashlib.sha256(json.dumps(["invar.sample/1", seed, unit_id], ensure_ascii=False,
                                     separators=(",", ":")).encode()).digest()


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**63 - 1), data=st.data())
def test_sample_units_keeps_the_smallest_keys_in_file_order(n: int, seed: int, data: st.DataObject) -> None:
    units = [Unit(f"u{i}-ü", f"p{i}", None, "1") for i in range(n)]
    sample = data.draw(st.none() | st.integers(1, n))
    mine = sample_units(units, sample, seed)
    keep = n if sample is None else sample
    smallest = set(sorted((u.id for u in units), key=lambda i: plan_key(seed, i))[:keep])
    assert [u.id for u in mine] == [u.id for u in units if u.id in smallest]


def test_sample_units_is_the_plans_sample() -> None:
    try:
        from invar.contract.plan import Unit as PlanUnit
        from invar.contract.plan import select_units
    except ImportError as exc:  # the contract package is being edited elsewhere in this tree
        pytest.skip(f"invar.contract.plan does not import: {exc}")
    units = [Unit(f"id-{i}", f"p{i}", None, "1") for i in range(50)]
    for seed in (0, 7, 2**62):
        for sample in (None, 1, 13, 50):
            plans = select_units([PlanUnit(u.id, u.prompt or "") for u in units], sample, seed)
            assert [u.id for u in sample_units(units, sample, seed)] == [u.unit_id for u in plans]


def test_sample_units_refuses_bad_samples() -> None:
    units = [Unit("a", "p", None, "1"), Unit("b", "p", None, "1")]
    with pytest.raises(ContractError, match="between 1 and the 2 units"):
        sample_units(units, 3, 0)
    with pytest.raises(ContractError, match="between 1 and the 2 units"):
        sample_units(units, 0, 0)
    with pytest.raises(ContractError, match="ids repeat"):
        sample_units([*units, units[0]], None, 0)


def test_kinds_counts_in_first_appearance_order() -> None:
    units = [Unit("a", "p", None, "1", kind="x"), Unit("b", "p", None, "1"), Unit("c", "p", None, "1", kind="x")]
    assert kinds(units) == {"x": 2, "": 1}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(answer=JSON, meta=st.dictionaries(st.text(max_size=5), JSON, max_size=3), prompt=st.text(min_size=1),
       kind=st.text(min_size=1))
def test_round_trip_of_any_json_answer(answer: Any, meta: dict[str, Any],
                                       prompt: str, kind: str) -> None:
    line = {"id": "x", "prompt": prompt, "answer": answer, "meta": meta, "kind": kind}
    (unit,) = parse_units(json.dumps(line).encode() + b"\n", "h.jsonl")
    assert unit.answer == freeze(answer)
    assert thaw(unit.answer) == answer
    assert unit.to_json() == {k: v for k, v in line.items() if k != "meta" or v}
    assert unit.prompt == prompt
    hash(unit)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(JSON, st.one_of(st.text(min_size=1), st.none()),
                               st.one_of(st.none(), st.text(min_size=1)),
                               st.dictionaries(st.text(max_size=3), JSON, max_size=2)), min_size=1, max_size=12))
def test_the_compact_table_gives_the_units_parse_units_gives(rows: list[tuple[Any, str | None, str | None,
                                                                              dict[str, Any]]]) -> None:
    # Admission keeps a population as a `UnitTable`: every unit read from it is the one `parse_units` gives, field by
    # field (types included), its line too, for prompts and messages, any answer, kinds and meta.
    lines = []
    for i, (answer, prompt, kind, meta) in enumerate(rows):
        line: dict[str, Any] = {"id": f"u{i}-\u00e9\U0001f600", "answer": answer, "meta": meta}
        if prompt is None:
            line["messages"] = [{"role": "user", "content": f"q{i}"}]
        else:
            line["prompt"] = prompt
        if kind is not None:
            line["kind"] = kind
        lines.append(json.dumps(line, ensure_ascii=i % 2 == 0).encode())
    data = b"\n".join(lines) + b"\n"
    units = parse_units(data, "t.jsonl")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"invar-table-{os.getpid()}-{threading.get_ident()}.jsonl"
    path.write_bytes(data)
    try:
        table = load_unit_table(path, hashlib.sha256(data).hexdigest())
    finally:
        path.unlink()
    assert len(table) == len(units)
    assert table == units
    assert units == tuple(table)
    for got, want in zip(table, units, strict=True):
        assert (got.id, got.prompt, got.messages, got.kind, got.meta, got.line) == \
            (want.id, want.prompt, want.messages, want.kind, want.meta, want.line)
        assert type(got.answer) is type(want.answer)
        assert got.answer == want.answer
    assert table[-1] == units[-1]
    assert table[1:3] == units[1:3]
    assert table.ids() == [u.id for u in units]
    assert table.chat_indices() == [i for i, u in enumerate(units) if u.messages is not None]
