"""The one reader of a `.sha256` file beside a data file (`invar.owner_files.declared_sha256`, `sha256_file`), which
`evaluate`'s population, `train`'s prompts and `use run`'s contract read through: the declared digest wins, else the
sibling's first word; a missing, empty or unreadable sibling is one line naming it and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from invar.errors import ContractError
from invar.owner_files import declared_sha256, sha256_file
from invar.runner.evaluate import population_digest
from invar.runner.use_run import check_sha256_file

FIX = "pass the digest you expect"
DIGEST = "ab" * 32


def test_the_declared_digest_wins_and_no_sibling_is_read(tmp_path: Path) -> None:
    (tmp_path / "p.sha256").mkdir()  # would be refused if it were read
    assert declared_sha256(tmp_path / "p.jsonl", "cd" * 32, FIX) == "cd" * 32


def test_the_siblings_first_word_as_sha256sum_writes_it(tmp_path: Path) -> None:
    (tmp_path / "p.sha256").write_text(f"{DIGEST}  p.jsonl\n")
    assert declared_sha256(tmp_path / "p.jsonl", None, FIX) == DIGEST


@pytest.mark.parametrize(("content", "message"), [(None, "p.jsonl: no p.sha256 beside it; " + FIX),
                                                  ("", "p.sha256: empty; " + FIX),
                                                  (" \n", "p.sha256: empty; " + FIX)])
def test_a_missing_or_empty_sibling_is_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "p.sha256").write_text(content)
    with pytest.raises(ContractError) as refused:
        declared_sha256(tmp_path / "p.jsonl", None, FIX)
    assert str(refused.value).endswith(message)
    assert "\n" not in str(refused.value)


def test_a_sibling_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "p.sha256").mkdir()
    with pytest.raises(ContractError, match=r"sha256 file .*p\.sha256"):
        sha256_file(tmp_path / "p.sha256", FIX)


def test_the_three_readers_read_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "p.sha256").write_text(f"{DIGEST}  p.jsonl\n")
    assert population_digest(tmp_path / "p.jsonl", None) == DIGEST
    contract = tmp_path / "c.contract.json"
    (tmp_path / "c.contract.json.sha256").write_text(f"{DIGEST}  c.contract.json\n")
    check_sha256_file(contract, DIGEST)  # the sibling agrees
    with pytest.raises(ContractError, match="was changed after use prepare wrote it"):
        check_sha256_file(contract, "cd" * 32)
    (tmp_path / "c.contract.json.sha256").write_text("")
    with pytest.raises(ContractError, match=r"c.contract.json.sha256: empty; it should hold the contract's sha256"):
        check_sha256_file(contract, DIGEST)
