"""`invar train` on the Hugging Face backend (HF generates, and learns through peft), on the shipped model: a short
run whose objective the core recomputes and whose checkpoint chain verifies, and the same configuration with both
roles in one worker process (`rollout.layout = "shared"`), stopped by SIGTERM and by Ctrl-C, resuming to the split
run's checkpoints bit for bit (the HF worker's calls are deterministic on one CPU build): one run shows the stops,
the resume and the shared layout, which each took a run of their own before.

A run SIGKILLed at random instants (the CLI, then one of its workers) is resumed on MLX
(test_train_mlx.py::test_a_killed_run_resumes_to_the_same_checkpoints) and on fake workers
(test_train_fake_workers.py); what it adds on HF, a learner resumed from its training checkpoint taking the
uninterrupted step bit for bit, is tests/workers/hf/test_hf_checkpoints.py's, and the resumed HF run publishing the
uninterrupted run's checkpoints is the SIGTERM test's below."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from train_helpers import check_finished, invar, published, stop_at_signal, write_config

from invar.records import RunStore

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("config"), "hf-small", "hf")


@pytest.fixture(scope="module")
def finished(config: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    run = tmp_path_factory.mktemp("hf") / "run"
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    return run, json.loads(out.stdout)


def test_a_short_run_publishes_a_verified_chain(finished: tuple[Path, dict[str, object]]) -> None:
    run, outcome = finished
    h = check_finished(run, str(outcome["chain_head"]), 3, kl_coef=0.05)
    # The first cycle starts at the base model on both sides: the history counts the tokens where the learner's
    # one-pass forward reads the engine's decode-loop value bit for bit (importance weight exactly 1).
    first = h.cycles[0]
    assert first.gap.equal > first.gap.tokens // 2
    assert first.gap.max < 1e-4


def test_sigterm_and_ctrl_c_stop_in_one_line_and_a_shared_run_resumes_to_the_split_runs_checkpoints(
        finished: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    # The same configuration with both roles in one worker process: a scheduler's SIGTERM after the first cycle, a
    # Ctrl-C (SIGINT) as the resumed run's process starts its first cycle, then the run to its end. One
    # run shows the stops, the resume, and the shared layout publishing the split run's checkpoints.
    config = write_config(tmp_path, "hf-small-shared", "hf", rollout={"layout": "shared"})
    run = tmp_path / "run"
    stop_at_signal(config, run, signal.SIGTERM, after_cycles=1)
    stop_at_signal(config, run, signal.SIGINT, after_cycles=1, once_placed=True, may_finish=True)
    # A cycle under way at a signal is finished, and the next cycle starts at the learner's report, before the last
    # one is published: the SIGTERM usually meets cycle 1 under way, and the Ctrl-C may meet cycle 2 started. Then
    # the two starts did every cycle between them (the second closing the run), and the last start has nothing to
    # do and starts no process.
    last_start_works = len(published(run)) < 3
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    assert published(run) == published(finished[0])
    compared = invar("compare", "histories", finished[0], run, "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    doc = json.loads(compared.stdout)
    assert doc["schedule_knobs_differing"] == {"rollout.layout": ["split", "shared"]}
    assert [c["responses_same"] for c in doc["cycles"]] == [True, True, True]
    with RunStore.open(run) as store:
        workers = store.workers()
        placement = [v for k, v in store.meta().items() if k.startswith("placement shared ")]
    # Each invocation that had a cycle to run started one process, whose two channels answered as its two workers;
    # no worker of the run ran anywhere else.
    assert len(placement) == 2 + last_start_works
    for p in placement:
        assert {role: (workers[key].role.value, workers[key].pid) for role, key in p["workers"].items()} == {
            "inference": ("inference", p["pid"]), "learner": ("learner", p["pid"])}
    assert set(workers) == {key for p in placement for key in p["workers"].values()}
