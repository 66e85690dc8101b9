"""bench/gpu_check.py and the overhead benchmarks' device plumbing, checked on the CPU (no GPU is needed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from invar.engines import DEFAULT_MODEL
from invar.runner.engine import Dtype, Engine, launch_args

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package

import overhead  # noqa: E402
import train_overhead  # noqa: E402


def test_cpu_settings_unchanged_and_cuda_puts_every_worker_on_the_gpu() -> None:
    assert overhead.invar_settings("hf", "cpu") == {}
    assert overhead.invar_settings("vllm", "cpu") == {"gpu_memory_utilization": 0.05}
    assert overhead.LARGE_SHAPE["cpu"] == (12, 512)  # the documented 36.2 M model
    assert launch_args("hf", overhead.invar_settings("hf", "cuda"), {}) == ["--device", "cuda"]
    # Two vLLM engines share the one GPU: each must fit beside the other.
    assert launch_args("vllm", overhead.invar_settings("vllm", "cuda"), {}) == [
        "--device", "cuda", "--gpu-memory-utilization", "0.4"]
    assert 2 * overhead.VLLM_CUDA_UTILIZATION < 0.9


def test_invar_train_on_a_device_launches_both_workers_there(monkeypatch: pytest.MonkeyPatch) -> None:
    from invar.runner import train as train_mod

    monkeypatch.setattr(train_mod, "EngineSpec", train_mod.EngineSpec)  # restored after the test
    train_overhead.launch_train_workers_on("cuda")
    spec = train_mod.EngineSpec(Engine.HF, DEFAULT_MODEL, Dtype.FLOAT32, adapter=None)
    assert spec.settings == {"device": "cuda"}
    assert launch_args("hf", spec.settings, {}) == ["--device", "cuda"]


@pytest.mark.engine
def test_dry_run_with_the_overhead_benchmark_writes_ratios(tmp_path: Path) -> None:
    """The script's overhead part on the CPU, as it runs on a GPU: one paired call per layout on the tiny model."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--engines", "hf", "--no-checks",
         "--overhead", "--pairs", "1", "--overhead-sizes", "tiny", "--train-cycles", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["engines"] == {}  # --no-checks
    inference = report["overhead"]["inference"]
    assert inference["returncode"] == 0  # the bench refuses to report if invar and direct returned other tokens
    rows = {r["layout"]: r for r in inference["rows"]}
    assert set(rows) == {"pairing-b16", "batch-32"}
    for row in rows.values():
        assert (row["size"], row["engine"], row["pairs"]) == ("tiny", "hf", 1)
        assert min(row["wall_total_ratio"], row["cpu_total_ratio"], row["direct_median_call_s"]) > 0
        assert math.isfinite(row["fixed_cost_per_call_us"])
        assert row["fixed_cost_per_record_us"] == pytest.approx(row["fixed_cost_per_call_us"] / 2)
        assert "goal_1_02_wall" not in row  # the goal is the larger model's
    assert (tmp_path / "overhead.json").is_file()
    # The breakdown's named steps, each timed on the thread that runs it, sum to no more than the call they are in.
    bench = json.loads((tmp_path / "overhead.json").read_text())
    for layout, row in bench["sizes"]["tiny"]["engines"]["hf"]["layouts"].items():
        calls = row["breakdown"]["core_per_call_us"]
        assert calls, layout
        for call in calls:
            assert sum(v for k, v in call.items() if k != "whole call") <= call["whole call"], (layout, call)
    assert "overhead on cpu" in proc.stdout
    assert "hf pairing-b16: wall" in proc.stdout
