"""`invar train` on the MLX backend (MLX generates and learns), on the shipped model: a short run whose objective the
core recomputes and whose checkpoint chain verifies, the history recomputed from the records, a run killed at random
instants that resumes to the same checkpoints bit for bit, and every refusal one line with the records kept.

A run starts two MLX workers (about 7 s each here); the module runs five short trainings in all (about 2 minutes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from train_helpers import history, invar, kill_and_resume, published, write_config

from invar import canonical
from invar.engines import ENGINES
from invar.errors import EvidenceError, RecordError
from invar.loop.cycle import ObjectiveMismatch
from invar.records import RunStore
from invar.runner.train import plan, train

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("config"), "mlx-small", "mlx")


@pytest.fixture(scope="module")
def finished(config: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    run = tmp_path_factory.mktemp("mlx") / "run"
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    return run, json.loads(out.stdout)


def test_a_short_run_publishes_a_verified_chain_of_checkpoints(finished: tuple[Path, dict[str, object]]) -> None:
    run, outcome = finished
    assert (outcome["cycles"], outcome["cycles_reused"]) == (3, 0)
    with RunStore.open(run) as store:
        v = store.verify(expect_head=str(outcome["chain_head"]))
    assert v.closed
    h = history(run)
    digests = published(run)
    assert [c.checkpoint for c in h.cycles] == digests
    assert [c.policy for c in h.cycles] == [None, *digests[:-1]]  # each cycle sampled the one published before
    for n, digest in enumerate(digests):
        assert canonical.tree_digest(run / "checkpoints" / f"cycle-{n:06d}") == digest
    assert all(c.staleness == 0 for c in h.cycles)


def test_the_core_recomputes_every_objective(finished: tuple[Path, dict[str, object]]) -> None:
    h = history(finished[0])
    for c in h.cycles:
        print(f"measured: mlx cycle {c.cycle}: loss core {c.loss_core!r} learner {c.loss_learner!r} "
              f"|Δ| {c.loss_abs_diff:.3g}, kl {c.kl_core:.3g}")
        assert c.loss_abs_diff <= 1e-6 * (max(abs(c.advantage_min), abs(c.advantage_max)) + 0.05)
    assert any(c.zero_variance_groups < c.groups for c in h.cycles), "some group must teach something"


def test_the_first_cycle_has_importance_weight_exactly_one_where_learner_and_engine_agree(
        finished: tuple[Path, dict[str, object]]) -> None:
    first = history(finished[0]).cycles[0]
    print(f"measured: mlx cycle 0: {first.gap.equal}/{first.gap.tokens} tokens equal, max |gap| {first.gap.max}")
    assert first.importance.exactly_one == first.gap.equal
    # On this engine the learner reads the engine's tokens bit for bit (docs/mlx.md), so every weight is exactly 1.
    assert first.gap.equal == first.gap.tokens
    assert (first.importance.min, first.importance.max, first.importance.ess) == (1.0, 1.0, 1.0)


def test_history_prints_json_and_curves(finished: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    run, outcome = finished
    out = invar("inspect", "history", run, "--json", "--plot", tmp_path / "curves.png", "--expect-head",
                str(outcome["chain_head"]))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [c["cycle"] for c in doc["cycles"]] == [0, 1, 2]
    first = doc["cycles"][0]
    assert {"reward_mean", "accuracy_interval", "zero_variance_groups", "loss_core", "loss_learner", "gap",
            "importance", "staleness", "checkpoint", "wall_s"} <= first.keys()
    assert set(first["gap"]) == {"tokens", "equal", "p50", "p99", "max", "k3_mean", "k3_max"}
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = invar("inspect", "history", run)
    assert table.returncode == 0, table.stderr
    assert "learner − engine log-probability" in " ".join(table.stdout.split())


def test_a_finished_run_is_not_run_again(config: Path, finished: tuple[Path, dict[str, object]]) -> None:
    out = invar("train", config, "--run", finished[0])
    assert out.returncode == 0, out.stderr
    assert "the run is already complete; nothing to do" in out.stdout


def test_another_configuration_is_refused_on_an_existing_run(finished: tuple[Path, dict[str, object]],
                                                             tmp_path: Path) -> None:
    other = write_config(tmp_path, "mlx-small", "mlx", optimizer={"lr": 1e-3})
    out = invar("train", other, "--run", finished[0])
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "the run was made with configuration" in out.stderr


def test_a_second_writer_is_refused(config: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunStore.create(run, meta=plan(config).meta()), pytest.raises(RecordError) as err:
        train(config, run)
    assert "another invar process is writing this run" in str(err.value)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_checkpoints(config: Path, finished: tuple[Path, dict[str, object]],
                                                      tmp_path: Path) -> None:
    run = tmp_path / "run"
    killed = kill_and_resume(config, run, kills=2, window=(4.0, 20.0), seed=7)
    print(f"measured: killed {killed}; published {len(published(run))} checkpoints")
    assert published(run) == published(finished[0])
    with RunStore.open(run) as store:
        assert store.verify().closed
    assert [c.checkpoint for c in history(run).cycles] == published(finished[0])


@pytest.mark.parametrize(("mode", "message"), [
    ("wrong-loss", r"^cycle 0: objective term loss: the learner reports .*, the core recomputes .* from the recorded "
                   r"numbers \(\|Δ\| 0\.001 > tolerance .*\); the learner's arithmetic is not the objective's$"),
    ("other-digest", r"^cycle 1: generate reports policy checkpoint 0000000000000000…, but the published policy is "
                     r"checkpoint [0-9a-f]{16}…: rollouts of any other policy are refused$"),
    ("corrupt-adapter", r"^cycle 0: checkpoint refused: .*"),
])
def test_a_lying_worker_stops_the_run_in_one_line_and_keeps_every_record(
        mode: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "mlx", "tests.runner.sabotaged_mlx")
    # The sabotaged module lives in the checkout's tests/, not in the package: put the checkout on the workers' path.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]),
                                                                 os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.setenv("INVAR_SABOTAGE", mode)
    config = write_config(tmp_path, f"mlx-{mode}", "mlx", cycles=2)
    run = tmp_path / "run"
    with pytest.raises(EvidenceError) as err:
        train(config, run)
    assert "\n" not in str(err.value)
    assert err.match(message)
    assert isinstance(err.value, ObjectiveMismatch) == (mode == "wrong-loss")
    with RunStore.open(run) as store:
        v = store.verify()
        meta = store.meta()
        calls = store.calls()
    assert not v.closed
    assert v.unanswered == []
    assert calls[-1].report is not None  # the refused report is on record
    assert sorted(k for k in meta if k.startswith("cycle-")) == (["cycle-000000"] if mode == "other-digest" else [])


def test_engine_settings_start_both_roles_workers_with_them(tmp_path: Path) -> None:
    # `[engines.mlx]` reaches the launch of both workers, inference and learner: each reports OpenBLAS in its
    # identity, as recorded.
    config = write_config(tmp_path, "mlx-openblas", "mlx", cycles=1, **{"engines.mlx": {"blas": "openblas"}})
    run = tmp_path / "run"
    out = invar("train", config, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    with RunStore.open(run) as store:
        identities = list(store.workers().values())
    assert sorted(i.role.value for i in identities) == ["inference", "learner"]
    assert [i.settings["blas"] for i in identities] == ["openblas", "openblas"]

