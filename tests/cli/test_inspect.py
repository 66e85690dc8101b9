"""`invar inspect records` through the real command line: a verified listing, and one line for tampering."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from support.cli_batch import InvarSession

from invar.engines import start_worker
from invar.records import RunStore


def _run_with_echo(run: Path) -> None:
    store = RunStore.create(run, meta={"purpose": "cli test"})
    with start_worker("echo", recorder=store) as w:
        for i in range(3):
            w.call("echo", {"i": i, "marker": f"needle-{i}"})
    store.close_run()
    store.close()


def test_lists_a_verified_run(cli: InvarSession, tmp_path: Path) -> None:
    _run_with_echo(tmp_path / "run")
    out = cli.run("inspect", "records", str(tmp_path / "run"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verified"] is True
    assert doc["calls"] == 3  # the count; the listing is call_log
    assert doc["call_log"][0]["engine"] == "echo"
    assert [c["status"] for c in doc["call_log"]] == ["ok", "ok", "ok"]
    assert doc["closed"] is True
    assert re.fullmatch(r"[0-9a-f]{64}", doc["chain_head"])
    assert doc["meta"]["run"]["purpose"] == "cli test"
    text = cli.run("inspect", "records", str(tmp_path / "run"))
    assert text.returncode == 0
    assert "verified" in text.stdout


def test_tampering_is_one_line_naming_the_record(cli: InvarSession, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run_with_echo(run)
    conn = sqlite3.connect(run / "records.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    db = run / "records.sqlite"
    data = bytearray(db.read_bytes())
    pos = data.find(b"needle-1")
    data[pos] ^= 0x20
    db.write_bytes(bytes(data))
    out = cli.run("inspect", "records", str(run), "--quiet")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    # needle-1 is in call 2's record (5) and in its echoed report (6): the message names the one flipped.
    assert re.search(r"record (5 \(call\)|6 \(report\)): its bytes do not match its digest", out.stderr)
    assert "Traceback" not in out.stderr
    # Without --quiet the refusal is the last line, after the phase it stopped in.
    shown = cli.run("inspect", "records", str(run))
    assert shown.returncode == 2
    first, error = shown.stderr.splitlines()
    assert re.fullmatch(r"invar: verifying the records 0/3 calls… \d+\.\d s", first)
    assert error + "\n" == out.stderr


def test_shows_its_phases_on_stderr_and_quiet_shows_none(cli: InvarSession, tmp_path: Path) -> None:
    """Verifying the records call by call, then listing the calls, each with the time since the command started
    (issue 27); stdout is the same with --quiet, which leaves stderr empty."""
    _run_with_echo(tmp_path / "run")
    for as_json in ((), ("--json",)):
        shown = cli.run("inspect", "records", str(tmp_path / "run"), *as_json)
        quiet = cli.run("inspect", "records", str(tmp_path / "run"), *as_json, "--quiet")
        assert shown.returncode == quiet.returncode == 0, shown.stderr
        lines = [re.fullmatch(r"invar: (.+)… (\d+\.\d) s", line) for line in shown.stderr.splitlines()]
        assert all(lines), shown.stderr
        assert [m[1] for m in lines if m is not None] == [
            "verifying the records 0/3 calls", "verifying the records 3/3 calls", "listing the calls 0/3",
            "listing the calls 3/3"]
        assert quiet.stderr == ""
        assert shown.stdout == quiet.stdout
    assert json.loads(shown.stdout)["calls"] == 3


def test_missing_run_is_one_line(cli: InvarSession, tmp_path: Path) -> None:
    out = cli.run("inspect", "records", str(tmp_path / "nope"))
    assert out.returncode == 2
    assert out.stderr.strip() == f"invar: error: {tmp_path / 'nope'}: no run store here (expected records.sqlite); " \
        "pass a run directory"


def test_incomplete_run_and_anchor_through_the_cli(cli: InvarSession, tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = RunStore.create(run)
    with start_worker("echo", recorder=store) as w:
        w.call("echo", {"i": 0})
    store.close()  # not closed: as a run killed mid-way leaves it
    out = cli.run("inspect", "records", str(run))
    assert out.returncode == 0, out.stderr
    assert "INCOMPLETE" in out.stdout
    with RunStore.open(run) as s:
        head = s.verify().head
    assert cli.run("inspect", "records", str(run), "--expect-head", head).returncode == 0
    wrong = cli.run("inspect", "records", str(run), "--expect-head", "0" * 64)
    assert wrong.returncode == 2
    assert "re-chained, cut or extended" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_a_use_runs_reference_and_candidate_read_apart(cli: InvarSession, tmp_path: Path) -> None:
    """Both packages' workers number their calls from 1 and both are "hf inference": each row names the package
    that answered (engine, the loaded model's dtype and quantization, patches) and its worker's pid (issue 27)."""
    from contract.contract_runs import RunWriter, make_workspace

    ws = make_workspace(tmp_path / "ws", units=30)
    run = RunWriter(ws, tmp_path / "run").complete().close()
    out = cli.run("inspect", "records", str(run), "--json", "--quiet")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["call_log"]
    seen = {(r["call_id"], r["method"], r["package"], r["pid"]) for r in rows}
    assert seen == {(1, "load_model", "hf float32 none", 101), (2, "generate", "hf float32 none", 101),
                    (1, "load_model", "hf float32 nf4 patches fixed-softmax", 202),
                    (2, "generate", "hf float32 nf4 patches fixed-softmax", 202),
                    (3, "generate", "hf float32 nf4 patches fixed-softmax", 202)}
    text = subprocess.run([sys.executable, "-m", "invar.cli", "inspect", "records", str(run), "--quiet"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    assert "hf float32 none" in text.stdout
    assert "hf float32 nf4 patches fixed-softmax" in text.stdout
