"""bench/overhead.py's per-call breakdown times each step it names, on the thread that runs it (the echo worker: a
real worker process on real pipes, no engine)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from invar.engines import start_worker
from invar.records import RunStore

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package

import overhead  # noqa: E402

CALL_SIDE = ("encode call", "hash call", "record call", "write call to the pipe")
REPORT_SIDE = ("hash report as read", "decode report", "record report")


def run_breakdown(tmp_path: Path, calls: list[dict[str, Any]], rounds: int, method: str) -> dict[str, Any]:
    with RunStore.create(tmp_path / "run", meta={"command": "test"}) as store:
        client = start_worker("echo", recorder=store)
        try:
            return overhead.breakdown(types.SimpleNamespace(client=client), store, calls, rounds, method=method)
        finally:
            client.close()


def check_steps(result: dict[str, Any]) -> None:
    assert result["core_thread"] == {**{k: "calling thread" for k in CALL_SIDE},
                                     **{k: "reader thread" for k in REPORT_SIDE}}
    assert len(result["core_per_call_us"]) == result["calls"]
    for call in result["core_per_call_us"]:
        assert set(call) == {*CALL_SIDE, *REPORT_SIDE, "whole call"}
        # One after another within the call: the call's steps, then (once the worker answered) the report's.
        assert sum(call[k] for k in (*CALL_SIDE, *REPORT_SIDE)) <= call["whole call"]


def test_every_step_is_timed_once_per_call_on_its_own_thread(tmp_path: Path) -> None:
    calls = overhead.make_calls(64, 5)["batch-32"]  # one generate call of 64 requests, echoed back
    result = run_breakdown(tmp_path, calls, 3, "echo")
    assert result["calls"] == 3
    assert result["call_bytes"] > 5000
    assert result["report_bytes"] > 5000
    check_steps(result)


def test_the_write_does_not_count_the_time_the_worker_takes_to_answer(tmp_path: Path) -> None:
    # The worker holds each call 0.3 s: the reader thread waits that long for the report, the calling thread waits
    # for the answer; neither wait belongs to a named step.
    result = run_breakdown(tmp_path, [{"seconds": 0.3}], 3, "sleep")
    check_steps(result)
    for call in result["core_per_call_us"]:
        assert call["whole call"] >= 0.3e6
        assert sum(call[k] for k in (*CALL_SIDE, *REPORT_SIDE)) < 0.1e6
