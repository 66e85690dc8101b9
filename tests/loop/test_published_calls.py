"""Which records a publication names: identical call bytes recur in a run (a lost call issued again to a
replacement worker, or after a resume), so a publication names each call's record (seq) as well as its digest,
and `inspect history` takes that record; a publication written before it named records still reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from invar import canonical
from invar.errors import EvidenceError
from invar.loop.history import PublishedCalls
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore
from invar.records.store import CallRecord


def _worker(pid: int) -> Identity:
    return Identity("test", {"invar": "test"}, Role.INFERENCE, {"threads": 1}, ("generate",), pid)


def _records(tmp_path: Path) -> tuple[list[CallRecord], str, dict[str, int]]:
    """A generate call answered by one worker, an answered learner_step, and the same generate bytes issued
    again to another worker that never answered (the copy recorded last)."""
    store = RunStore.create(tmp_path / "run")
    first, other = store.record_worker(_worker(1).to_wire()), store.record_worker(_worker(2).to_wire())
    body = canonical.encode(Call(1, "generate", {"requests": [{"request_id": "p/0"}]}).to_wire())
    digest = store.record_call(body, worker=first)
    seqs = {"answered": store.call_seq(digest) or 0}
    store.record_report(canonical.encode(Report(1, digest, first, result={"outputs": []}).to_wire()), worker=first)
    step = store.record_call(canonical.encode(Call(2, "learner_step", {"samples": []}).to_wire()), worker=first)
    seqs["step"] = store.call_seq(step) or 0
    store.record_report(canonical.encode(Report(2, step, first, result={}).to_wire()), worker=first)
    assert store.record_call(body, worker=other) == digest  # the same bytes, another worker
    seqs["lost"] = store.call_seq(digest) or 0
    calls = store.calls()
    store.close()
    assert seqs["answered"] < seqs["step"] < seqs["lost"]
    return calls, digest, seqs


def test_a_publication_names_the_record_of_a_call_whose_bytes_recur(tmp_path: Path) -> None:
    calls, digest, seqs = _records(tmp_path)
    step = next(c.call_digest for c in calls if c.call.method == "learner_step")
    index = PublishedCalls(calls)
    gens, learner = index.of({"generate_call": digest, "generate_seqs": [seqs["answered"]], "learner_call": step,
                              "learner_seq": seqs["step"]}, 0)
    assert [g.seq for g in gens] == [seqs["answered"]]
    assert learner.seq == seqs["step"]
    # The unanswered copy named by its record is refused, naming the record; so is a record of another call.
    with pytest.raises(EvidenceError, match=rf"cycle 0: .* \(record {seqs['lost']}\), which the records do not "
                                            "hold answered"):
        index.of({"generate_call": digest, "generate_seqs": [seqs["lost"]], "learner_call": step}, 0)
    with pytest.raises(EvidenceError, match=rf"in record {seqs['step']}, which holds call {step[:16]}"):
        index.of({"generate_call": digest, "generate_seqs": [seqs["step"]], "learner_call": step}, 0)


def test_a_publication_without_records_names_the_answered_copy(tmp_path: Path) -> None:
    # Runs recorded before publications named records: the digest alone, the copy the cycle consumed (answered).
    calls, digest, seqs = _records(tmp_path)
    step = next(c.call_digest for c in calls if c.call.method == "learner_step")
    gens, learner = PublishedCalls(calls).of({"generate_call": digest, "learner_call": step}, 0)
    assert [g.seq for g in gens] == [seqs["answered"]]
    assert learner.seq == seqs["step"]
