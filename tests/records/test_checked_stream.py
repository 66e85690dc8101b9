"""A store's pass with its checking process (`invar.parallel.helper()`, as `use admit` and `use verify` read): the
same records, values and refusals as the pass that checks every body itself, the process reaped however the pass
ends."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from invar import canonical
from invar.errors import RecordError
from invar.parallel import cores, helper
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore
from invar.records import store as store_module

IDENT = Identity("test", {"invar": "test"}, Role.INFERENCE, {"threads": 1}, ("echo",), 42)

pytestmark = pytest.mark.skipif(cores() < 2 or not hasattr(os, "fork"), reason="the checking process needs two "
                                "cores and fork")


def _value(i: int) -> dict[str, Any]:
    """Arrays of every kind a record holds: vectors, a matrix, a scalar, an empty one, bfloat16."""
    rng = np.random.default_rng(i)
    return {"tokens": rng.integers(0, 1000, 5 + i, dtype=np.int32), "logprobs": rng.random(5 + i, dtype=np.float32),
            "top": rng.random((3, 2)).astype(np.float64), "scalar": np.array(i, dtype=np.int64),
            "empty": np.zeros(0, dtype=np.uint8), "bf16": canonical.BFloat16Array(np.arange(4, dtype=np.uint16)),
            "text": f"unit {i}", "nested": [{"a": i, "b": [1.5, None, True]}]}


def _run(path: Path, calls: int = 40) -> None:
    store = RunStore.create(path)
    key = store.record_worker(IDENT.to_wire())
    for i in range(1, calls + 1):
        digest = store.record_call(canonical.encode(Call(i, "echo", _value(i)).to_wire()), worker=key)
        store.record_report(canonical.encode(Report(i, digest, key, result=_value(-i % 7)).to_wire()), worker=key)
    store.close_run()
    store.close()


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return bool(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                    and a.flags.writeable == b.flags.writeable)
    if isinstance(a, canonical.BFloat16Array):
        return _same(a.bits, b.bits)
    return bool(a == b)


def _children() -> set[int]:
    pid = os.getpid()
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(p) for p in f.read().split())
    return found


def _strict_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the bodies the walk itself decodes strictly."""
    counted: list[int] = []
    strict = store_module._canonical_body

    def counting(where: str, body: bytes) -> Any:
        counted.append(1)
        return strict(where, body)

    monkeypatch.setattr(store_module, "_canonical_body", counting)
    return counted


def _read(path: Path) -> tuple[list[Any], Any]:
    with RunStore.open(path) as store:
        stream = store.stream(kept=True)
        records = [(r.seq, r.call.to_wire(), None if r.report is None else r.report.report.to_wire())
                   for r in stream]
        return records, stream.verification


def test_the_checked_pass_gives_the_same_records_and_reaps_its_process(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path / "run")
    before = _children()
    plain, plain_v = _read(tmp_path / "run")
    counted = _strict_decodes(monkeypatch)
    with helper():
        checked, checked_v = _read(tmp_path / "run")
    assert _same(checked, plain)
    assert checked_v == plain_v
    assert len(checked) == 40
    assert not counted  # the checking process decoded every body; the walk read them as values
    assert _children() == before


def test_a_pass_left_half_read_reaps_its_process(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    before = _children()
    with helper(), RunStore.open(tmp_path / "run") as store:
        stream = iter(store.stream())
        first = next(stream)
        assert first.call.call_id == 1
        assert _children() != before  # the process is checking
        stream.close()  # type: ignore[attr-defined]
    assert _children() == before


def _forge(path: Path, body: bytes) -> None:
    """A record whose digest and chain are right but whose body is not in canonical form (as a forger appending with
    the store's own code would write it)."""
    store = RunStore.open(path, writable=True)
    store._append("meta", body)
    store.close()


@pytest.mark.parametrize("doc", [
    {"b": 1, "a": 2},  # keys out of order
    {"a": 1.0},  # a float written as float32 below
])
def test_a_body_not_in_canonical_form_is_refused_in_the_same_words(tmp_path: Path, doc: dict[str, Any]) -> None:
    store = RunStore.create(tmp_path / "run")
    store.close()
    packed = msgpack.packb(doc, use_single_float=True)
    _forge(tmp_path / "run", len(packed).to_bytes(4, "big") + packed)
    with pytest.raises(RecordError) as plain:
        _read(tmp_path / "run")
    before = _children()
    with helper(), pytest.raises(RecordError) as checked:
        _read(tmp_path / "run")
    assert str(checked.value) == str(plain.value)
    assert "record 2 (meta): undecodable" in str(plain.value)
    assert _children() == before


def test_a_body_over_the_checking_size_is_decoded_by_the_walk_itself(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path / "run")
    plain, _ = _read(tmp_path / "run")
    with RunStore.open(tmp_path / "run") as store:
        sizes = [len(body) for (body,) in store._conn.execute("SELECT body FROM log ORDER BY seq")]
    limit = sorted(sizes)[len(sizes) // 2]
    monkeypatch.setattr(store_module, "_CHECKED_UP_TO", limit)
    counted = _strict_decodes(monkeypatch)
    with helper():
        checked, _ = _read(tmp_path / "run")
    assert _same(checked, plain)
    assert len(counted) == sum(size > limit for size in sizes) > 0


def test_a_checking_process_that_falls_silent_is_not_waited_for(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path / "run", calls=5)
    plain, plain_v = _read(tmp_path / "run")
    monkeypatch.setattr(store_module, "_QUIET_S", 0.2)
    monkeypatch.setattr(store_module, "_check_records", lambda source, fd: time.sleep(60))  # it never tells
    counted = _strict_decodes(monkeypatch)
    before = _children()
    started = time.monotonic()
    with helper():
        checked, checked_v = _read(tmp_path / "run")
    assert time.monotonic() - started < 30  # not the process's 60 s: it was killed once the walk was done
    assert _same(checked, plain)
    assert checked_v == plain_v
    assert len(counted) == plain_v.records  # the walk checked every body itself
    assert _children() == before
