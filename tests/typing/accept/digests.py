"""A report record carries the digest `record_report` returned."""

from invar.protocol.messages import Report
from invar.records import ReportRecord, RunStore
from invar.records.digests import CallDigest, ReportDigest


def keep(store: RunStore, call: bytes, report: Report, payload: bytes) -> tuple[CallDigest, ReportRecord]:
    call_digest = store.record_call(call, worker="w")
    report_digest: ReportDigest = store.record_report(payload, worker="w")
    return call_digest, ReportRecord(1, report, report_digest, 0)


def as_text(digest: CallDigest) -> str:
    return digest[:12]  # a digest is still a string where a string is asked for
