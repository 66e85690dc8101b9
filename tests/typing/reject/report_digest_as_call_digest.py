"""A report's digest is not a call's."""

from invar.records import RunStore
from invar.records.digests import CallDigest


def keep(store: RunStore, payload: bytes) -> CallDigest:
    digest: CallDigest = store.record_report(payload, worker="w")  # reject: Incompatible types in assignment (expression has type "ReportDigest", variable has type "CallDigest")
    return digest
