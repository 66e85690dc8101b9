"""`invar use package ENGINE --model DIR`: everything a package must state, the model and tokenizer digests included,
and a folder the core cannot read refused before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_batch import InvarSession

from invar import canonical
from invar.engines import DEFAULT_MODEL
from invar.formats.model_config import FIELDS
from invar.tasks import ModelTokenizer

CLI_BOUND_S = 300  # seconds a command may take in the module's session (tests/cli/conftest.py)


@pytest.mark.engine
def test_a_package_states_the_model_and_tokenizer_digests(cli: InvarSession) -> None:
    out = cli.run("use", "package", "hf", "--model", DEFAULT_MODEL, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["model_dir"] == str(DEFAULT_MODEL)
    assert doc["model_digest"] == canonical.tree_digest(DEFAULT_MODEL)
    assert doc["tokenizer_digest"] == ModelTokenizer.from_model_dir(DEFAULT_MODEL).digest
    assert doc["engine"] == "hf"
    assert "transformers" in doc["engine_version"]


@pytest.mark.parametrize("what", ["empty", "no-tokenizer"])
def test_a_folder_the_core_cannot_read_is_one_line_before_any_worker(cli: InvarSession, tmp_path: Path,
                                                                     what: str) -> None:
    folder = tmp_path / what
    folder.mkdir()
    if what == "no-tokenizer":
        (folder / "config.json").write_text((DEFAULT_MODEL / "config.json").read_text())
    out = cli.run("use", "package", "hf", "--model", folder)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert ("no config.json" if what == "empty" else "tokenizer.json does not exist") in out.stderr


@pytest.mark.engine
def test_the_effective_configuration_is_printed_field_by_field_beside_the_folders(cli: InvarSession,
                                                                                  tmp_path: Path) -> None:
    """The hf worker loads the model and the effective configuration it reports is printed beside the folder's
    config.json, field by field: every field of the shipped model equal (θ read back from float32 frequencies)."""
    out = cli.run("use", "package", "hf", "--model", DEFAULT_MODEL)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("#   ")]
    fields = [row[1] for row in rows]
    assert fields == list(FIELDS)
    assert all(row[-1] == "equal" for row in rows), out.stdout
    assert "#   rope_theta       [10000 × 3 layers] | [9999.998 × 3 layers]  equal" in out.stdout.splitlines()
    assert "known_premises" not in out.stdout
