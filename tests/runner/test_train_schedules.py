"""Schedule-invariant training on MLX, checked by `invar compare histories`: runs that split the learner's batch
into micro-batches of 4 or take it whole, and that generate in engine batches of 1 or 32 (on two inference workers
or one), publish the same checkpoints bit for bit; the negative control (float32 accumulation in micro-batch
order) is reported as different from its first cycle; histories of another seed or learning rate, and a
tampered history, are refused in one line; a run whose two roles share one worker process (`rollout.layout =
"shared"`) publishes the split run's checkpoints and records the same identities and calls; a run of declared
staleness K = 1 samples cycle 1 from the base model while the learner makes the first update, and differs from
K = 0 from that cycle, as it should.

Six MLX training runs of 2 cycles × 16 samples (4 prompts × G = 4) on the shipped model, about 15 s each here,
and (slow) two HF runs showing the same for the HF learner.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from train_helpers import history, invar, published, write_config

from invar.compare.histories import compare_histories
from invar.records import RunStore
from invar.runner.train import train

pytestmark = pytest.mark.engine

SCHEDULES: dict[str, dict[str, dict[str, Any]]] = {
    "whole": {"rollout": {"batch_size": 32}},
    "micro4": {"rollout": {"batch_size": 32}, "learner": {"micro_batch": 4}},
    "engine1": {"rollout": {"batch_size": 1, "workers": 2}},
    "control4": {"rollout": {"batch_size": 32}, "learner": {"micro_batch": 4, "reduction": "float32-microbatch"}},
    "stale1": {"rollout": {"batch_size": 32, "staleness": 1}},
    "shared": {"rollout": {"batch_size": 32, "layout": "shared"}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("schedules")
    out = {}
    for name, sections in SCHEDULES.items():
        config = write_config(folder, f"sched-{name}", "mlx", cycles=2, **sections)
        outcome = train(config, folder / name)
        assert outcome.cycles == 2
        out[name] = folder / name
    return out


def compare(a: Path, b: Path, *, cli: bool = False) -> tuple[int, dict[str, Any]]:
    """`invar compare histories A B --json` (in this process unless `cli`: the command is run for one pair)."""
    if not cli:
        result = compare_histories(a, b)
        return result.exit_code, result.output().model_dump(mode="json")
    out = invar("compare", "histories", a, b, "--json")
    assert out.returncode in (0, 10), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize(("other", "knobs"), [
    ("micro4", {"learner.micro_batch": [None, 4]}),
    ("engine1", {"rollout.batch_size": [32, 1], "rollout.workers": [1, 2]}),
    ("shared", {"rollout.layout": ["split", "shared"]}),
])
def test_schedules_publish_identical_policies(runs: dict[str, Path], other: str, knobs: dict[str, Any]) -> None:
    code, doc = compare(runs["whole"], runs[other], cli=other == "micro4")
    print(f"measured: whole vs {other}: {doc['verdict']} over {doc['cycles_compared']} cycles")
    assert (code, doc["verdict"]) == (0, "identical")
    assert doc["schedule_knobs_differing"] == knobs
    assert doc["cycles_compared"] == 2
    assert all(c["checkpoints_identical"] and c["consumed_same"] and c["responses_same"] for c in doc["cycles"])
    assert published(runs["whole"]) == published(runs[other])
    if other == "engine1":  # two generate calls per cycle, one per worker, each named by the publication
        with RunStore.open(runs[other]) as store:
            meta, records = store.meta(), {c.seq: c for c in store.calls()}
        for n in range(2):
            entry = meta[f"cycle-{n:06d}"]
            assert len(entry["generate_calls"]) == 2
            # ... by digest and by record (seq): the record holds that call, answered
            assert [records[s].call_digest for s in entry["generate_seqs"]] == entry["generate_calls"]
            assert records[entry["learner_seq"]].call_digest == entry["learner_call"]
            assert all(records[s].report is not None for s in [*entry["generate_seqs"], entry["learner_seq"]])
    # The history the core recomputes agrees too: the same losses, to the bit.
    assert [c.loss_core for c in history(runs["whole"]).cycles] == [c.loss_core for c in history(runs[other]).cycles]


def test_a_shared_run_records_what_a_split_run_records_but_where_the_roles_ran(runs: dict[str, Path]) -> None:
    seen = {}
    for name in ("whole", "shared"):
        with RunStore.open(runs[name]) as store:
            workers, meta, records = store.workers(), store.meta(), store.calls()
        seen[name] = (
            sorted((ident.role.value, {k: v for k, v in ident.to_wire().items() if k not in ("pid", "instance")})
                   for ident in workers.values()),
            sorted((workers[r.worker].role.value, r.call.method) for r in records),
            {ident.role.value: ident.pid for ident in workers.values()},
            {k: v for k, v in meta.items() if k.startswith("placement ")},
        )
    split, shared = seen["whole"], seen["shared"]
    assert shared[0] == split[0]  # the same two declared identities, roles included, but for the pids
    assert shared[1] == split[1]  # the same calls, each to the same role
    assert split[2]["inference"] != split[2]["learner"]
    assert split[3] == {}
    pid = shared[2]["inference"]
    assert shared[2]["learner"] == pid
    with RunStore.open(runs["shared"]) as store:
        keys = {ident.role.value: key for key, ident in store.workers().items()}
    assert shared[3] == {f"placement shared {pid}": {"layout": "shared", "pid": pid, "workers": keys}}


def test_the_negative_control_is_reported_different_at_its_first_cycle(runs: dict[str, Path]) -> None:
    code, doc = compare(runs["whole"], runs["control4"])
    first = doc["cycles"][0]
    print(f"measured: whole vs control (float32, micro-batch 4): first differing cycle "
          f"{doc['first_differing_cycle']}, {first['diff']}")
    assert (code, doc["verdict"], doc["first_differing_cycle"]) == (10, "differ", 0)
    assert doc["schedule_knobs_differing"] == {"learner.micro_batch": [None, 4],
                                               "learner.reduction": ["float64-sequence", "float32-microbatch"]}
    # The rollouts of cycle 0 are the same (the base model samples them); only the reduction's rounding differs.
    assert (first["consumed_same"], first["responses_same"], first["checkpoints_identical"]) == (True, True, False)
    diff = first["diff"]
    assert diff["tensor"].startswith("base_model.model.")
    assert 0 < diff["elements"] <= diff["size"]
    assert 0 < diff["max_abs_delta"] < 1e-3
    text = invar("compare", "histories", runs["whole"], runs["control4"])
    assert text.returncode == 10
    assert "verdict: differ, first at cycle 0" in text.stdout
    assert "learner.micro_batch (null vs 4), learner.reduction (float64-sequence vs float32-microbatch)" in text.stdout


def test_staleness_one_samples_the_policy_before_the_last_while_the_learner_updates(runs: dict[str, Path]) -> None:
    h = history(runs["stale1"])
    assert [c.staleness for c in h.cycles] == [0, 1]
    assert [c.policy for c in h.cycles] == [None, None]  # cycle 1 sampled version 0, the base model
    stale = h.cycles[1]
    print(f"measured: K = 1, cycle 1: {stale.gap.equal}/{stale.gap.tokens} tokens with learner = behavior, max |gap| "
          f"{stale.gap.max:.3g}, importance weights {stale.importance.min:.4f}–{stale.importance.max:.4f}")
    # The update starts from cycle 0's checkpoint, the rollouts came from the base model: they differ.
    assert stale.gap.equal < stale.gap.tokens
    assert stale.gap.max > 0
    # Cycle 1's generate call left before cycle 0's learner step was answered: the two ran at once.
    with RunStore.open(runs["stale1"]) as store:
        meta = store.meta()
        calls = {c.call_digest: c for c in store.calls()}
    learner0 = calls[meta["cycle-000000"]["learner_call"]]
    generate1 = calls[meta["cycle-000001"]["generate_call"]]
    assert learner0.report is not None
    assert generate1.seq < learner0.report.seq
    assert (meta["cycle-000001"]["policy_version"], meta["cycle-000001"]["staleness"]) == (0, 1)
    code, doc = compare(runs["whole"], runs["stale1"])
    assert (code, doc["first_differing_cycle"]) == (10, 1)
    assert doc["schedule_knobs_differing"] == {"rollout.staleness": [0, 1]}
    assert doc["cycles"][0]["identical"]
    assert not doc["cycles"][1]["consumed_same"]  # (prompt, sample, seed) the same, the policy version not


@pytest.mark.slow
def test_the_hf_learner_publishes_the_same_policy_for_any_micro_batch(tmp_path: Path) -> None:
    """HF's forward is not batch-invariant, so float64-sequence scores each sequence alone; micro-batches of 4
    and the whole batch then give the same adapter. Two HF runs of 2 cycles (about 30 s each here)."""
    for name, learner in (("whole", {"reduction": "float64-sequence"}), ("micro4", {"micro_batch": 4})):
        train(write_config(tmp_path, f"hf-{name}", "hf", cycles=2, learner=learner), tmp_path / name)
    code, doc = compare(tmp_path / "whole", tmp_path / "micro4")
    print(f"measured: hf whole vs micro-batch 4: {doc['verdict']}")
    assert (code, doc["verdict"], doc["cycles_compared"]) == (0, "identical", 2)
    assert doc["schedule_knobs_differing"] == {"learner.micro_batch": [None, 4]}


def _copy_with_config(run: Path, dest: Path, **changes: Any) -> Path:
    """A closed training history whose recorded configuration differs from `run`'s by `changes` (dotted names)."""
    with RunStore.open(run) as store:
        meta = store.meta()
    info = json.loads(json.dumps(meta["run"]))
    for name, value in changes.items():
        section, _, key = name.rpartition(".")
        (info["config"][section] if section else info["config"])[key] = value
    store = RunStore.create(dest, meta=info)
    store.close_run()
    store.close()
    return dest


@pytest.mark.parametrize(("change", "named"), [
    ({"seed": 6}, "seed (5 vs 6)"),
    ({"optimizer.lr": 0.001}, "optimizer.lr (0.005 vs 0.001)"),
])
def test_histories_of_another_configuration_are_refused_in_one_line(
        runs: dict[str, Path], tmp_path: Path, change: dict[str, Any], named: str) -> None:
    other = _copy_with_config(runs["whole"], tmp_path / "other", **change)
    out = invar("compare", "histories", runs["whole"], other)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert f"the runs are not comparable: their configurations differ in {named}, which is not a schedule knob" \
        in out.stderr


def test_a_tampered_history_is_refused_with_the_record_named(runs: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "tampered"
    shutil.copytree(runs["micro4"], copy)
    db = copy / "records.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(db.read_bytes())
    pos = data.find(b"learner_step")
    assert pos >= 0
    data[pos] ^= 0x01  # one bit of the first record that names the learner's method
    db.write_bytes(bytes(data))
    out = invar("compare", "histories", runs["whole"], copy)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert re.search(r"RUN_B: refused, its records do not verify: record \d+ \(\w+\): .*the record was altered$",
                     out.stderr.strip()), out.stderr
