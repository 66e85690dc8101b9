"""bench/train_critical_path.py reads a cycle's waits on the core off a run's records: on a run of the tests' fake
workers, where the engines take no time, the waits are the core's own work and each is a part of the cycle."""

from __future__ import annotations

import sys
from pathlib import Path

from runner.train_helpers import write_config
from support.fake_worker import FakeTransport, Script

from invar.runner.train import train

ROOT = Path(__file__).resolve().parents[2]


def test_the_waits_are_read_off_the_records_and_each_is_a_part_of_the_cycle(tmp_path: Path) -> None:
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package
    try:
        from train_critical_path import KEYS, waits
    finally:
        sys.path.remove(str(ROOT / "bench"))
    config = write_config(tmp_path, "waits", "mlx", cycles=4, rollout={"batch_size": 32})
    run = tmp_path / "run"
    train(config, run, transport=FakeTransport(Script(wrong=lambda w: 0.5, policy_logprobs=True)))
    got = waits(run)
    assert sorted(got) == sorted(KEYS)
    assert all(value > 0 for value in got.values())
    assert got["learner_report_to_next_call_ms"] + got["generate_report_to_learner_call_ms"] < got["period_ms"]
