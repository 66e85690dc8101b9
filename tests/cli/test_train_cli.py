"""`invar train` refuses a configuration it cannot run before any worker starts: one line on stderr, exit 2, and no
run directory made. Its help lists every configuration field."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_batch import InvarSession

from invar.cli.train_fields import FIELDS
from invar.engines import DEFAULT_MODEL
from invar.loop.config import field_help

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to


def _config(folder: Path, extra: str) -> Path:
    path = folder / "c.toml"
    path.write_text(f'name = "c"\nbackend = "mlx"\nmodel = "{DEFAULT_MODEL}"\n'
                    f'[prompts]\npath = "{REPO_ROOT / "data" / "arith-train.jsonl"}"\n{extra}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(("extra", "message"), [
    ("per_cycle = 16\nshuffle = true", "prompts.shuffle: is not a known field; remove it or check its spelling"),
    ("[rollout]\ngroup_size = 1", "rollout.group_size: input should be greater than or equal to 2; got 1"),
    ("[objective]\nclip_low = 1.5", "objective.clip_low: input should be less than 1; got 1.5"),
])
def test_a_bad_config_is_one_line_and_no_run(cli: InvarSession, tmp_path: Path, extra: str, message: str) -> None:
    out = cli.run("train", _config(tmp_path, extra), "--run", tmp_path / "run")
    assert out.returncode == 2
    assert out.stderr == f"invar: error: {tmp_path / 'c.toml'}: {message}\n"
    assert not (tmp_path / "run").exists()


def test_the_evaluation_population_is_never_trained_on(cli: InvarSession, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'name = "c"\nbackend = "mlx"\nmodel = "{DEFAULT_MODEL}"\n'
                    f'[prompts]\npath = "{REPO_ROOT / "data" / "arith-eval.jsonl"}"\n', encoding="utf-8")
    out = cli.run("train", path, "--run", tmp_path / "run")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "a prompt of the evaluation split; train on the training set" in out.stderr
    assert not (tmp_path / "run").exists()


def test_the_helps_table_of_fields_is_the_configurations() -> None:
    """`invar train --help` lists the fields from a table, so that its start imports no configuration model: the
    table is `field_help()`'s rows (`python -m invar.cli.train_fields` rewrites it)."""
    assert tuple(field_help()) == FIELDS


def test_help_lists_every_configuration_field(cli: InvarSession) -> None:
    out = cli.run("train", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for name, _, _ in field_help():
        assert f"{name} =" in text, name
