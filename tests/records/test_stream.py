"""`RunStore.stream`: the same verification as `verify`, record by record, holding only calls awaiting a report."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from invar import canonical
from invar.errors import RecordError
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore

IDENT = Identity("test", {"invar": "test"}, Role.INFERENCE, {"threads": 1}, ("echo",), 42)


def _run(path: Path) -> list[str]:
    """Calls 1 and 2 sent together, answered 2 then 1; call 3 answered; call 4 never answered."""
    store = RunStore.create(path)
    key = store.record_worker(IDENT.to_wire())
    digests = [store.record_call(canonical.encode(Call(i, "echo", {"i": i}).to_wire()), worker=key) for i in (1, 2)]
    for i in (2, 1):
        store.record_report(canonical.encode(Report(i, digests[i - 1], key, result={"i": i}).to_wire()), worker=key)
    digests.append(store.record_call(canonical.encode(Call(3, "echo", {"i": 3}).to_wire()), worker=key))
    store.record_report(canonical.encode(Report(3, digests[2], key, result={"i": 3}).to_wire()), worker=key)
    digests.append(store.record_call(canonical.encode(Call(4, "echo", {"i": 4}).to_wire()), worker=key))
    store.close_run()
    store.close()
    return digests


def test_calls_stream_as_their_reports_arrive_and_verify_like_verify(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    with RunStore.open(tmp_path / "run") as store:
        stream = store.stream()
        assert stream.verification is None
        ids = [rec.call.call_id for rec in stream]
        assert ids == [2, 1, 3, 4]  # report order, then the unanswered call
        assert stream.verification is not None
        assert stream.verification == store.verify()
        assert stream.verification.unanswered == [9]  # record 1 is the run's metadata
        assert [c.call.call_id for c in store.calls()] == [1, 2, 3, 4]  # calls() keeps call order


def test_two_streams_of_one_store_read_side_by_side(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    with RunStore.open(tmp_path / "run") as store:
        a, b = iter(store.stream()), iter(store.stream())
        assert [next(a).call.call_id, next(b).call.call_id, next(a).call.call_id] == [2, 2, 1]


def test_a_bad_record_stops_the_stream_where_it_lies(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    conn = sqlite3.connect(tmp_path / "run" / "records.sqlite")
    conn.execute("DROP TRIGGER log_no_update")
    conn.execute("UPDATE log SET digest = ? WHERE seq = 7", ("0" * 64,))  # call 3's report
    conn.commit()
    conn.close()
    with RunStore.open(tmp_path / "run") as store:
        stream = iter(store.stream())
        seen = [next(stream).call.call_id, next(stream).call.call_id]
        with pytest.raises(RecordError, match=r"record 7 .* do not match its digest"):
            next(stream)
        assert seen == [2, 1]
