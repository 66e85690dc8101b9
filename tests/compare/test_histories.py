"""`invar compare histories` without an engine: which configuration fields are schedule knobs, and one-line
refusals of folders that are not training runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from invar.compare.histories import (
    SCHEDULE_KNOBS,
    NotComparable,
    RunHistory,
    check_comparable,
    compare_histories,
    render,
)
from invar.loop.config import ConfigError, parse_config
from invar.records import RunStore


def _history(**config: object) -> RunHistory:
    return RunHistory(Path("run"), True, "0" * 64, {"seed": 5, "optimizer.lr": 0.005, **config}, [])


def test_schedule_knobs_may_differ_and_are_named() -> None:
    knobs = check_comparable(_history(**{"learner.micro_batch": None}), _history(**{"learner.micro_batch": 4}))
    assert knobs == {"learner.micro_batch": (None, 4)}
    assert set(SCHEDULE_KNOBS) == {"rollout.batch_size", "rollout.workers", "rollout.layout", "learner.micro_batch",
                                   "learner.reduction"}
    knobs = check_comparable(_history(**{"rollout.layout": "split"}), _history(**{"rollout.layout": "shared"}))
    assert knobs == {"rollout.layout": ("split", "shared")}


def test_every_other_difference_is_named_in_the_refusal() -> None:
    with pytest.raises(NotComparable) as err:
        check_comparable(_history(), _history(seed=6, **{"optimizer.lr": 0.001, "rollout.batch_size": 1}))
    message = str(err.value)
    assert "\n" not in message
    assert "differ in optimizer.lr (0.005 vs 0.001), seed (5 vs 6), which is not a schedule knob" in message


def test_a_folder_that_is_not_a_training_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotComparable, match=r"^RUN_A .*: not a run directory"):
        compare_histories(tmp_path, tmp_path)
    store = RunStore.create(tmp_path / "infer", meta={"command": "infer"})
    store.close_run()
    store.close()
    with pytest.raises(NotComparable, match=r"is a run of 'infer', not a training run"):
        compare_histories(tmp_path / "infer", tmp_path / "infer")


def test_the_hf_learner_takes_the_fixed_order_reduction_when_a_micro_batch_is_given() -> None:
    assert parse_config({"name": "x", "backend": "vllm+hf"}).schedule() == {"micro_batch": None, "reduction": None}
    micro = parse_config({"name": "x", "backend": "hf", "learner": {"micro_batch": 4}})
    assert micro.schedule() == {"micro_batch": 4, "reduction": "float64-sequence"}
    with pytest.raises(ConfigError) as err:
        parse_config({"name": "x", "backend": "hf", "learner": {"reduction": "float16"}})
    assert "learner.reduction" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_default_schedule_keeps_the_configuration_digest() -> None:
    plain = parse_config({"name": "x", "backend": "mlx"})
    assert "learner" not in plain.canonical()
    assert plain.schedule() == {"micro_batch": None, "reduction": "float64-sequence"}
    micro = parse_config({"name": "x", "backend": "mlx", "learner": {"micro_batch": 4}})
    assert micro.canonical()["learner"] == {"micro_batch": 4, "reduction": None}
    assert micro.digest() != plain.digest()


def _train_store(path: Path, *, close: bool) -> Path:
    config = parse_config({"name": "x", "backend": "mlx"}).canonical()
    store = RunStore.create(path, meta={"command": "train", "config": config, "model_digest": "0" * 64,
                                        "prompts_sha256": "1" * 64})
    if close:
        store.close_run()
    store.close()
    return path


def test_a_run_without_a_close_record_reads_as_incomplete_and_never_identical(tmp_path: Path) -> None:
    closed = _train_store(tmp_path / "closed", close=True)
    assert compare_histories(closed, closed).exit_code == 0
    result = compare_histories(closed, _train_store(tmp_path / "open", close=False))
    assert (result.identical, result.exit_code) == (False, 10)
    text = render(result)
    assert "0 cycles, incomplete (no close record)" in text
    assert "verdict: differ: the compared cycles agree, but the runs are not both complete" in text
