"""A call's digest cannot stand in a report record's place."""

from invar.protocol.messages import Report
from invar.records import ReportRecord, RunStore


def keep(store: RunStore, call: bytes, report: Report) -> ReportRecord:
    call_digest = store.record_call(call, worker="w")
    return ReportRecord(1, report, call_digest, 0)  # reject: Argument 3 to "ReportRecord" has incompatible type "CallDigest"; expected "ReportDigest"
