"""The append-only run store: every call and report, verifiable from the records alone."""

from invar.records.store import CallRecord, CallStream, ReportRecord, RunStore, Verification

__all__ = ["CallRecord", "CallStream", "ReportRecord", "RunStore", "Verification"]
