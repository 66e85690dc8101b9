"""The two digests a record carries, as distinct types: a call's and a report's.

Both are sha256 hex strings, so nothing at run time tells them apart; a report bound to the wrong digest is a
forgery the store refuses only when it verifies. These types make the mix-up a type error where it is written.
"""

from typing import NewType

CallDigest = NewType("CallDigest", str)
"""sha256 of a call's exact payload, as recorded (`RunStore.record_call`)."""
ReportDigest = NewType("ReportDigest", str)
"""sha256 of a report's exact payload, as recorded (`RunStore.record_report`)."""
