"""`invar inspect`: look into what a run recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer

from invar.cli.common import ExpectHeadOpt, JsonOpt, QuietOpt, RunDir, emit_model

# The run store, the output models and rich are imported when a command runs: `inspect --help` needs none of them.
if TYPE_CHECKING:
    from invar.protocol.messages import Identity

app = typer.Typer(help="Look into what a run recorded.", no_args_is_help=True, rich_markup_mode=None)
app.command("history")(__import__("invar.cli.history", fromlist=["history"]).history)


@app.command("records")
def records(run: RunDir, expect_head: ExpectHeadOpt = None, as_json: JsonOpt = False,
            quiet: QuietOpt = False) -> None:
    """Verify every digest and binding of a run's records and list its calls.

    Without --expect-head this shows the records are consistent with each other; only the head kept from when the
    run closed (or from a receipt) shows they are the records that were written.
    """
    from rich.console import Console
    from rich.table import Table

    from invar.cli.outputs import CallLogRow, InspectRecordsOutput
    from invar.cli.progress import reporting
    from invar.records import RunStore

    rows: list[CallLogRow] = []
    with RunStore.open(run) as store, reporting(quiet) as shown:
        def verifying(done: int, total: int) -> None:
            shown.phase("verifying the records", total=total, unit="calls", done=done)
            shown.count(done)

        v = store.verify(expect_head=expect_head, progress=verifying)
        meta = store.meta()
        shown.phase("listing the calls", total=v.calls)
        # One call and its report at a time, each dropped once its row is made: memory follows the calls' count,
        # not the size of what they carried.
        loaded: dict[str, Mapping[str, Any]] = {}  # each worker's last model load
        for c in store.iter_calls():
            rep = c.report
            if c.call.method == "load_model" and isinstance(c.call.params, Mapping):
                loaded[c.worker] = c.call.params
            rows.append(CallLogRow(
                seq=c.seq,
                call_id=c.call.call_id,
                engine=c.identity.engine,
                role=c.identity.role.value,
                package=_package(c.identity, loaded.get(c.worker)),
                pid=c.identity.pid,
                method=c.call.method,
                call_digest=c.call_digest,
                status="unanswered" if rep is None else ("ok" if rep.report.ok else "error"),
                error=None if rep is None or rep.report.error is None else
                f"{rep.report.error.type}: {rep.report.error.message}",
                elapsed_ms=None if rep is None else round((rep.at_ns - c.at_ns) / 1e6, 3),
            ))
            shown.count(len(rows))
    if as_json:
        emit_model(InspectRecordsOutput(
            run=str(run), verified=True, closed=v.closed, chain_head=v.head, anchored=expect_head is not None,
            records=v.records, workers=v.workers, calls=v.calls, reports=v.reports, errors=v.errors,
            unanswered=v.unanswered, meta=meta, call_log=rows))
        return
    console = Console()
    state = "closed" if v.closed else "[bold yellow]INCOMPLETE[/] (no closing record: stopped before it finished, " \
        "or its tail was cut)"
    console.print(f"[bold green]verified[/] {run}: {v.records} records, {v.workers} workers, {v.calls} calls, "
                  f"{v.reports} reports ({v.errors} errors), {len(v.unanswered)} unanswered; {state}")
    anchor = "matches the anchor given" if expect_head is not None else \
        "not checked against an anchor: pass --expect-head with the head kept when the run closed"
    console.print(f"chain head {v.head} ({anchor})")
    table = Table("seq", "call", "package", "pid", "role", "method", "status", "ms", "call digest")
    for r in rows:
        table.add_row(str(r.seq), str(r.call_id), r.package, str(r.pid), r.role, r.method,
                      r.status if r.error is None else f"error: {r.error[:60]}",
                      "" if r.elapsed_ms is None else f"{r.elapsed_ms:.1f}", r.call_digest[:16])
    console.print(table)


def _package(identity: Identity, load: Mapping[str, Any] | None) -> str:
    """The package that answered, in words: the engine, the dtype and quantization of the model loaded, the patches
    (a worker with no model loaded: its engine alone)."""
    parts = [identity.engine]
    if load is not None:
        parts += [str(load[k]) for k in ("dtype", "quantization") if k in load]
    patches = identity.settings.get("patches")
    if isinstance(patches, Mapping) and patches:
        parts.append("patches " + ",".join(sorted(map(str, patches))))
    return " ".join(parts)
