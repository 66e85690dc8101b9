"""bench/train_overhead.py end to end on the tiny model: every driver publishes the same checkpoints, and the report
splits invar/direct into the process layout (split/direct) and Invar's own part (invar/split)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.engine
def test_three_drivers_publish_the_same_checkpoints_and_report_each_ratio(tmp_path: Path) -> None:
    out = tmp_path / "train_overhead.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_overhead.py"), "--config",
         str(ROOT / "configs" / "arith-mlx.toml"), "--cycles", "1", "--reps", "1", "--per-cycle", "2",
         "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    # The bench exits non-zero if any driver published other checkpoint digests than the rest.
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same_checkpoints"] is True
    for driver in ("invar", "direct", "split"):
        assert len(result[driver]["cycle_s"]) == 1
        assert result[driver]["median_cycle_s"] > 0
    for key in ("paired", "paired_cpu", "paired_invar_over_split", "paired_split_over_direct"):
        assert result[key]["pairs"] == 1
        assert result[key]["total_ratio"] > 0
    # Products of the parts give the whole, pair by pair.
    whole = result["paired"]["ratios"][0]
    parts = result["paired_invar_over_split"]["ratios"][0] * result["paired_split_over_direct"]["ratios"][0]
    assert parts == pytest.approx(whole, rel=1e-12)
    outside = result["core_outside_calls_s"]
    # The core's own time in a cycle is positive and a part of the cycle.
    assert 0 < outside["median"] < result["invar"]["median_cycle_s"]


def test_drivers_must_start_with_invar_and_direct() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_overhead.py"), "--drivers", "split,invar"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "--drivers split,invar: give invar,direct" in proc.stderr


def test_the_tree_before_a_change_needs_its_src() -> None:
    # shared-base runs another checkout's src; without --baseline there is nothing to run (and --baseline alone names
    # a tree no driver runs).
    for extra in (["--drivers", "invar,direct,shared-base"], ["--baseline", "/tmp/base/src"]):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_overhead.py"), *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2
        assert "the shared-base driver and --baseline SRC go together" in proc.stderr


def test_the_cpu_meter_keeps_what_an_ended_process_ran() -> None:
    # A cycle's CPU is the difference of two readings of the run's process tree; a worker that exits between them
    # must not take its CPU out of the later one (the shared layout's last cycle read as negative CPU).
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package
    try:
        from overhead import TreeCpu, tree_cpu_s
    finally:
        sys.path.remove(str(ROOT / "bench"))
    child = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.3: pass')"
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.run([sys.executable, '-c', {child!r}]); time.sleep(30)"])
    try:
        meter = TreeCpu(parent.pid)
        readings = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            readings.append(meter())
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            if not children and readings[-1] > 0.3:  # the child has run its 0.3 s and exited
                break
            time.sleep(0.01)
        assert readings == sorted(readings)
        assert readings[-1] >= 0.3
        assert tree_cpu_s(parent.pid) < 0.3 < meter()  # the plain reading has lost the ended child
    finally:
        parent.kill()
        parent.wait()


def test_calls_under_way_at_once_count_once_in_the_cores_time_outside_them() -> None:
    # A cycle's load_adapter and generate calls are sent together; summing their round trips counted the overlap
    # twice and gave the core negative time outside its calls.
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package
    try:
        from train_overhead import _covered
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert _covered([(0, 10), (5, 20), (30, 40)], 2, 35) == 8 + 10 + 5
    assert _covered([(1, 2), (1, 3)], 0, 10) == 2
    assert _covered([(0, 5)], 5, 9) == 0


def test_steady_cycles_leave_out_each_repetitions_first() -> None:
    # The first cycle of a repetition carries the start-up; the steady ratio pairs the cycles a long run repeats.
    sys.path.append(str(ROOT / "bench"))
    try:
        from train_overhead import paired, steady
    finally:
        sys.path.remove(str(ROOT / "bench"))
    a = [{"cycle_s": [1.5, 0.3, 0.4]}, {"cycle_s": [1.6, 0.5, 0.2]}]
    b = [{"cycle_s": [1.0, 0.2, 0.4]}, {"cycle_s": [1.1, 0.4, 0.4]}]
    assert steady(a).tolist() == [0.3, 0.4, 0.5, 0.2]
    q = paired(steady(a), steady(b))
    assert q["pairs"] == 4
    assert q["total_ratio"] == pytest.approx(1.4 / 1.4)
    assert q["mean_diff_s"] == pytest.approx(0.0)


def test_the_interval_by_repetition_resamples_whole_repetitions() -> None:
    # Two repetitions whose cycles share their machine's speed: the ratio of totals is the same either way, but only
    # resampling whole repetitions sees that the two disagree (every resample of pairs mixes both).
    sys.path.append(str(ROOT / "bench"))
    try:
        from train_overhead import by_repetition, paired, steady
    finally:
        sys.path.remove(str(ROOT / "bench"))
    a = [{"cycle_s": [9.0, 1.2, 1.2, 1.2, 1.2]}, {"cycle_s": [9.0, 0.8, 0.8, 0.8, 0.8]}]
    b = [{"cycle_s": [9.0, 1.0, 1.0, 1.0, 1.0]}, {"cycle_s": [9.0, 1.0, 1.0, 1.0, 1.0]}]
    r = by_repetition(a, b)
    assert r["repetitions"] == 2
    assert r["total_ratio"] == pytest.approx(1.0)
    assert r["ratios"] == pytest.approx([1.2, 0.8])
    # resamples of two repetitions: both the first (1.2), both the second (0.8), or one of each (1.0)
    assert r["total_ratio_ci95"] == pytest.approx([0.8, 1.2])
    q = paired(steady(a), steady(b))
    assert q["total_ratio"] == pytest.approx(1.0)
    assert q["total_ratio_ci95"][1] - q["total_ratio_ci95"][0] < 0.3


def test_pooled_runs_resample_repetitions_within_each_run(tmp_path: Path) -> None:
    sys.path.append(str(ROOT / "bench"))
    try:
        from train_overhead import pooled
    finally:
        sys.path.remove(str(ROOT / "bench"))
    one = {"reps": 2, "cycles": 3, "shared": {"cycle_s": [[9.0, 1.1, 1.1], [9.0, 1.1, 1.1]]},
           "direct": {"cycle_s": [[9.0, 1.0, 1.0], [9.0, 1.0, 1.0]]}}
    two = {"reps": 1, "cycles": 3, "shared": {"cycle_s": [[9.0, 0.9, 0.9]]}, "direct": {"cycle_s": [[9.0, 1.0, 1.0]]}}
    files = [tmp_path / "one.json", tmp_path / "two.json"]
    for f, d in zip(files, (one, two), strict=True):
        f.write_text(json.dumps(d))
    got = pooled(files)
    assert got["repetitions"] == 3
    assert got["per_run"] == pytest.approx([1.1, 0.9])
    assert got["total_ratio"] == pytest.approx((4.4 + 1.8) / 6.0)
    # each run's repetitions are alike, so every resample is the whole: the interval is the point
    assert got["total_ratio_ci95"] == pytest.approx([(4.4 + 1.8) / 6.0] * 2)
