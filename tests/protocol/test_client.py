"""The protocol with real worker subprocesses: a round trip, and every way a report is rejected."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.disks import fill

from invar import canonical
from invar.errors import ProtocolError, RecordError, WorkerError
from invar.protocol import Role
from invar.records import RunStore
from invar.transport import WorkerClient

SABOTEUR = str(Path(__file__).with_name("saboteur.py"))


def echo_worker(**kw: object) -> WorkerClient:
    return WorkerClient([sys.executable, "-m", "invar.workers.echo"], name="echo", **kw)  # type: ignore[arg-type]


def saboteur(mode: str, **kw: object) -> WorkerClient:
    return WorkerClient([sys.executable, SABOTEUR, mode], name=f"saboteur-{mode}", **kw)  # type: ignore[arg-type]


def test_round_trip_keeps_arrays_bit_exact() -> None:
    arrays = {
        "f32": np.array([np.pi, -0.0, np.inf, -np.inf, np.nan, 1e-45], dtype=np.float32),
        "f64": np.arange(12, dtype=np.float64).reshape(3, 4) / 7,
        "i32": np.array([[1, -2], [3, 2**31 - 1]], dtype=np.int32),
        "empty": np.zeros((0, 5), dtype=np.float32),
    }
    with echo_worker(expected_role=Role.INFERENCE) as w:
        assert w.identity.engine == "echo"
        assert "echo" in w.identity.methods
        got = w.call("echo", {"arrays": arrays, "text": "37+58=", "n": 3, "x": 0.1})
    for name, arr in arrays.items():
        back = got["arrays"][name]
        assert back.dtype == arr.dtype
        assert back.shape == arr.shape
        assert back.tobytes() == arr.tobytes(), name
    assert got["text"] == "37+58="
    assert got["x"] == 0.1


def test_bfloat16_bits_survive() -> None:
    bits = np.array([0x3F80, 0xBF80, 0x7F80, 0x0001, 0x7FC1], dtype=np.uint16)
    with echo_worker() as w:
        back = w.call("echo", {"b": canonical.BFloat16Array(bits)})["b"]
    assert isinstance(back, canonical.BFloat16Array)
    assert back.bits.tobytes() == bits.tobytes()
    assert back.to_float32()[:2].tolist() == [1.0, -1.0]


def test_many_calls_in_flight_are_matched_to_their_calls() -> None:
    with echo_worker() as w:
        pending = [w.submit("echo", {"i": i}) for i in range(200)]
        answers = [p.answer() for p in pending]
    assert [a.result["i"] for a in answers] == list(range(200))
    assert len({a.call_digest for a in answers}) == 200
    assert all(a.report.call_digest == a.call_digest for a in answers)


def test_calls_from_several_threads() -> None:
    out: dict[int, int] = {}
    with echo_worker() as w:
        def run(t: int) -> None:
            for i in range(50):
                out[t * 1000 + i] = w.call("echo", {"v": t * 1000 + i})["v"]
        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert out == {k: k for k in out}
    assert len(out) == 200


def test_worker_error_is_reported_and_worker_keeps_serving() -> None:
    with echo_worker() as w:
        with pytest.raises(WorkerError, match="ValueError: broken input"):
            w.call("fail", {"message": "broken input"})
        with pytest.raises(WorkerError, match=r"UnknownMethod: method 'nope' is not served.*echo"):
            w.call("nope", {})
        with pytest.raises(WorkerError, match=r"BadRequest: checksum: params.array must be an array"):
            w.call("checksum", {"array": 3})
        assert w.call("echo", {"still": "here"}) == {"still": "here"}


def test_wrong_role_is_refused() -> None:
    w = echo_worker(expected_role=Role.LEARNER)
    with pytest.raises(ProtocolError, match="serves as inference, expected learner"):
        w.start()


def test_learner_role_is_declared() -> None:
    argv = [sys.executable, "-m", "invar.workers.echo", "--role", "learner"]
    with WorkerClient(argv, expected_role=Role.LEARNER) as w:
        assert w.identity.role is Role.LEARNER


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("wrong-digest", "carries call digest"),
        ("wrong-identity", "names identity"),
        ("unknown-call", "report for unknown call 1001"),
        ("duplicate", "second report for call 1, which was already answered"),
        ("stray-bytes", "non-frame bytes on the stream"),
        ("truncated", "truncated frame"),
        ("malformed", "undecodable report"),
        ("not-a-report", "expected a report, got kind 'call'"),
        ("die", r"worker exited \(exit code 139\); stderr tail:\\n\s+segfault in the engine"),
    ],
)
def test_broken_reports_are_rejected(mode: str, message: str) -> None:
    w = saboteur(mode, call_timeout=20)
    w.start()
    try:
        if mode == "duplicate":
            assert w.call("echo", {"x": 1}) == {"echo": {"x": 1}}
            # The second copy arrives afterwards and breaks the exchange for the next call.
            time.sleep(0.5)
            with pytest.raises(ProtocolError, match=message):
                w.call("echo", {"x": 2})
        else:
            with pytest.raises(ProtocolError, match=message):
                w.call("echo", {"x": 1})
        # After a broken exchange the client refuses further calls with the same reason.
        with pytest.raises(ProtocolError, match=message):
            w.submit("echo", {"x": 3})
    finally:
        w.close()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("unsorted-keys", r"report is not in canonical form: map keys \['result', 'ok', .* are not sorted"),
        ("wide-int", r"report is not in canonical form: the \d+-byte document departs from the canonical "
                     "encoding of its value at byte 87 "),
        ("float32", "report is not in canonical form: .* at byte 196 "),
        ("bytes-key", r"undecodable report: map key b'x' is not a string"),
    ],
)
def test_report_not_in_canonical_form_is_refused_and_never_recorded(tmp_path: Path, mode: str, message: str) -> None:
    # Each of these decodes, so it used to be accepted and recorded, leaving a store that fails verification.
    store = RunStore.create(tmp_path / "run")
    w = saboteur(mode, call_timeout=20, recorder=store)
    w.start()
    try:
        with pytest.raises(ProtocolError, match=message):
            w.call("echo", {"x": 1})
    finally:
        w.close()
    v = store.verify()
    assert (v.workers, v.calls, v.reports) == (1, 1, 0)
    assert len(v.unanswered) == 1  # the call stays on record, unanswered: nothing unverifiable was kept


def test_call_timeout_stops_the_worker() -> None:
    w = saboteur("hang", call_timeout=0.5)
    w.start()
    try:
        with pytest.raises(ProtocolError, match=r"got no report within 0.5 s"):
            w.call("echo", {})
    finally:
        w.close()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("no-handshake", "no handshake within 1 s"),
        ("bad-handshake", "bad handshake: non-frame bytes"),
        ("die-at-start", r"exit code 7\); stderr tail:\\n\s+cannot load the engine"),
    ],
)
def test_bad_start_is_rejected(mode: str, message: str) -> None:
    w = saboteur(mode, handshake_timeout=1 if mode == "no-handshake" else 30)
    with pytest.raises(ProtocolError, match=message):
        w.start()
    w.close()


def test_missing_executable_is_one_clear_error() -> None:
    w = WorkerClient(["/nonexistent/worker"], name="ghost")
    with pytest.raises(ProtocolError, match="ghost: cannot start '/nonexistent/worker'"):
        w.start()


def test_calls_and_reports_are_recorded_and_bound(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path / "run")
    with echo_worker(recorder=store) as w:
        a = w.ask("echo", {"v": np.arange(4, dtype=np.float32)})
        with pytest.raises(WorkerError):
            w.call("fail", {})
    calls = store.calls()
    assert [c.call.method for c in calls] == ["echo", "fail"]
    first = calls[0]
    assert first.call_digest == a.call_digest
    assert first.report is not None
    assert first.report.report_digest == a.report_digest
    assert first.identity.engine == "echo"
    assert calls[1].report is not None
    assert not calls[1].report.report.ok
    v = store.verify()
    assert (v.workers, v.calls, v.reports, v.errors) == (1, 2, 2, 1)


def test_a_worker_that_logs_a_lot_is_read_in_blocks_and_its_tail_kept() -> None:
    """32 MB on stderr before the handshake (an engine's loading logs): read in blocks, not a byte per system call
    (0.42 MB/s, which took 76 s here), so it starts within its handshake timeout; the tail keeps the last lines
    whole, a very long one cut."""
    w = saboteur("noisy", handshake_timeout=30)
    started = time.perf_counter()
    try:
        w.start()
        assert w.call("echo", {"x": 1}) == {"echo": {"x": 1}}
    finally:
        w.close()
    assert time.perf_counter() - started < 30
    tail = list(w._stderr_tail)  # the lines kept for error messages
    assert tail[-1] == "last log line: ready \u2713"
    assert tail[-2] == "x" * 4096 + "…"
    assert tail[-3] == "loading shard 0019999 of the weights, all is well"


def test_a_report_the_disk_cannot_hold_fails_the_call_at_once_naming_the_record(
        mount_tmpfs: Callable[[str], Path]) -> None:
    """A full disk met while a report is recorded (on the reader thread): the call fails at once with the store's one
    line naming the record, not after its timeout; every record before it is kept and the store verifies."""
    run = mount_tmpfs("256k") / "run"
    store = RunStore.create(run)
    w = echo_worker(recorder=store, call_timeout=60)
    w.start()
    try:
        pending = w.submit("sleep", {"seconds": 0.5})  # recorded; the disk fills before its report comes
        fill(run.parent)
        started = time.perf_counter()
        with pytest.raises(RecordError) as caught:
            pending.answer()
        assert time.perf_counter() - started < 10
    finally:
        w.close()
    message = str(caught.value)
    assert "cannot write record 4 (report)" in message
    assert "records up to 3 are kept" in message
    assert "\n" not in message
    store.close()
    with RunStore.open(run) as kept:
        v = kept.verify()
    assert (v.calls, v.reports, v.unanswered) == (1, 0, [3])


def test_large_arrays_cross_intact_both_ways() -> None:
    rng = np.random.default_rng(5)
    big = rng.standard_normal(6 * (1 << 20)).astype(np.float32)  # 24 MB
    other = rng.integers(0, 2**31 - 1, size=(1000, 300), dtype=np.int32)
    with echo_worker() as w:
        back = w.call("echo", {"a": big, "nested": [{"b": other}, "tail"]})
        summed = w.call("checksum", {"array": big})
    assert back["a"].tobytes() == big.tobytes()
    assert back["nested"][0]["b"].tobytes() == other.tobytes()
    assert back["nested"][1] == "tail"
    assert summed["sum"] == float(big.sum(dtype=np.float64))
    assert not back["a"].flags.writeable  # received arrays are read-only views of the record


def _memory_cgroup(tmp_name: str, limit: int) -> Path:
    """A memory cgroup of `limit` bytes (cgroup v1's memory controller, or v2's), made for the test: these machines and
    CI run as root on Linux, so one that cannot be made fails the test rather than skipping it."""
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir():
        group = v1 / tmp_name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
        (group / "memory.memsw.limit_in_bytes").exists() and (group / "memory.memsw.limit_in_bytes").write_text(
            str(limit))
        return group
    group = Path("/sys/fs/cgroup") / tmp_name
    group.mkdir()
    (group / "memory.max").write_text(str(limit))
    (group / "memory.swap.max").exists() and (group / "memory.swap.max").write_text("0")
    return group


def test_a_worker_the_kernel_kills_for_memory_is_named_so() -> None:
    """The worker is moved into a memory cgroup of 256 MiB and sent a call of 512 MiB: the kernel's out-of-memory
    killer ends it, and the call's error says so, not only "exit code -9"."""
    group = _memory_cgroup(f"invar-test-oom-{os.getpid()}", 256 << 20)
    try:
        with echo_worker() as w:
            (group / ("tasks" if (group / "tasks").exists() else "cgroup.procs")).write_text(str(w.identity.pid))
            with pytest.raises(ProtocolError) as lost:
                w.call("checksum", {"array": np.ones(128 << 20, dtype=np.float32)})
    finally:
        for _ in range(50):  # the group can go once its last process has
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert "killed by the kernel's out-of-memory killer: the machine ran out of memory" in str(lost.value)
    assert "exit code -9" in str(lost.value)


def test_a_worker_killed_by_someone_else_is_not_said_to_lack_memory() -> None:
    with echo_worker() as w:
        os.kill(w.identity.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while w.process is not None and w.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the worker is reaped
        with pytest.raises(ProtocolError) as lost:
            w.call("echo", {"a": 1})
    assert "killed by SIGKILL, not by the kernel's out-of-memory killer; exit code -9" in str(lost.value)
