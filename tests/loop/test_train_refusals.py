"""What `invar train` says when it refuses an existing run directory, before any worker starts: one line (exit 2)
naming what is wrong and what to change, never a resume hint that the same command would only meet again, and
nothing recorded lost."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_batch import InvarSession, Ran

from invar.engines import DEFAULT_MODEL
from invar.records import RunStore
from invar.runner.train import plan

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=120) as session:
        yield session


def _config(folder: Path, name: str = "c", lr: float = 1e-3, sha_file: bool = True) -> Path:
    data = (REPO_ROOT / "data" / "arith-train.jsonl").read_bytes()
    (folder / "p.jsonl").write_bytes(data)
    if sha_file:
        (folder / "p.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
    if not (folder / "model").exists():
        shutil.copytree(DEFAULT_MODEL, folder / "model")
    config = folder / f"{name}.toml"
    config.write_text(f'name = "c"\nbackend = "mlx"\nmodel = "model"\n[prompts]\npath = "p.jsonl"\nper_cycle = 2\n'
                      f'[optimizer]\nlr = {lr}\n', encoding="utf-8")
    return config


def _stopped_run(config: Path, run: Path) -> list[tuple[str, bytes]]:
    """The records a run killed before its first publication leaves; returns the run folder's files."""
    p = plan(config)
    store = RunStore.create(run, meta=p.meta())
    store.put_meta("inputs", p.inputs())
    store.close()
    return _files(run)


def _files(run: Path) -> list[tuple[str, bytes]]:
    return sorted((f.name, f.read_bytes()) for f in run.iterdir() if f.is_file())


def _refused(out: Ran) -> str:
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("invar: error: "), out.stderr
    assert "resume with:" not in out.stderr, out.stderr
    return out.stderr


def test_another_configuration_names_the_recorded_one_not_the_rejected_one(cli: InvarSession, tmp_path: Path) -> None:
    config, run = _config(tmp_path), tmp_path / "run"
    before = _stopped_run(config, run)
    other = _config(tmp_path, "other", lr=5e-3)
    err = _refused(cli.run("train", other, "--run", run))
    assert "the run was made with configuration" in err
    assert f"resume it with the configuration it was made with ({config}, as recorded), or train {other} in a new " \
           "run directory" in err
    assert _files(run) == before


def test_a_changed_model_names_both_digests_and_no_resume_hint(cli: InvarSession, tmp_path: Path) -> None:
    config, run = _config(tmp_path), tmp_path / "run"
    before = _stopped_run(config, run)
    old = plan(config).model_digest
    card = tmp_path / "model" / "MODEL_CARD.md"
    card.write_text(card.read_text(encoding="utf-8") + "\nedited\n", encoding="utf-8")
    new = plan(config).model_digest
    err = _refused(cli.run("train", config, "--run", run))
    assert f"the model folder changed since the run started ({old[:16]}… → {new[:16]}…)" in err
    assert _files(run) == before


def test_unreadable_records_get_no_resume_hint(cli: InvarSession, tmp_path: Path) -> None:
    config, run = _config(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "records.sqlite").write_bytes(b"not a database, " * 400)
    before = _files(run)
    err = _refused(cli.run("train", config, "--run", run))
    assert "records.sqlite: the database cannot be read" in err
    assert "it cannot be resumed: restore its records, or choose a new run directory" in err
    assert _files(run) == before


def test_a_missing_prompts_digest_names_the_config_field(cli: InvarSession, tmp_path: Path) -> None:
    config = _config(tmp_path, sha_file=False)
    err = _refused(cli.run("train", config, "--run", tmp_path / "run"))
    assert "--population-sha256" not in err
    assert f"p.jsonl: no p.sha256 beside it; set prompts.sha256 to the digest you expect, or write it to " \
           f"{tmp_path / 'p.sha256'}" in err
    assert not (tmp_path / "run").exists()


def test_the_shared_layout_is_refused_with_ray_before_anything_starts(cli: InvarSession, tmp_path: Path) -> None:
    config = _config(tmp_path)
    config.write_text(config.read_text(encoding="utf-8") + '[rollout]\nlayout = "shared"\n', encoding="utf-8")
    err = _refused(cli.run("train", config, "--run", tmp_path / "run", "--ray", "127.0.0.1:1"))
    assert err == (f'invar: error: {config}: rollout.layout: "shared" runs both roles in one local worker process, '
                   'and --ray places the inference workers on a cluster; set layout = "split" to train there\n')
    assert not (tmp_path / "run").exists()
