"""The core's types make its important misuses type errors: every accept fixture passes `mypy --strict` (the
project's configuration), and every reject fixture fails with exactly the diagnostic its `# reject: <fragment>`
comment states, on that line, and with nothing else. One mypy run checks them all (about half a minute cold)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from mypy import api

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to


HERE = Path(__file__).resolve().parent
ACCEPT = sorted((HERE / "accept").glob("*.py"))
REJECT = sorted((HERE / "reject").glob("*.py"))
MARK = re.compile(r"#\s*reject:\s*(.+?)\s*$")
DIAGNOSTIC = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*?)(?:  \[[a-z-]+\])?$")


def _expected(path: Path) -> dict[int, str]:
    return {n: m.group(1) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if (m := MARK.search(line))}


@pytest.fixture(scope="module")
def diagnostics(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, list[tuple[int, str]]]:
    """Every error mypy reports on the fixtures, by file: (line, message)."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    before = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = str(REPO_ROOT / "src")  # the fixtures import the core from this checkout
    try:
        started = time.perf_counter()
        stdout, stderr, status = api.run(["--config-file", str(REPO_ROOT / "pyproject.toml"), "--cache-dir",
                                          str(cache), "--no-error-summary", "--show-absolute-path",
                                          *map(str, ACCEPT + REJECT)])
        print(f"measured: mypy on {len(ACCEPT) + len(REJECT)} typing fixtures: {time.perf_counter() - started:.1f} s")
    finally:
        if before is None:
            os.environ.pop("MYPYPATH", None)
        else:
            os.environ["MYPYPATH"] = before
    assert status in (0, 1), f"mypy did not run: {stderr or stdout}"
    found: dict[Path, list[tuple[int, str]]] = {}
    for line in stdout.splitlines():
        if (m := DIAGNOSTIC.match(line)) is not None:
            found.setdefault(Path(m["path"]).resolve(), []).append((int(m["line"]), m["message"]))
        elif ": error:" in line:
            pytest.fail(f"unreadable mypy line: {line}")
    return found


def test_there_are_enough_fixtures_each_stating_one_diagnostic() -> None:
    assert len(ACCEPT) >= 8
    assert len(REJECT) >= 8
    for path in ACCEPT:
        assert _expected(path) == {}, f"{path.name}: an accept fixture states no diagnostic"
    for path in REJECT:
        assert len(_expected(path)) == 1, f"{path.name}: state exactly one '# reject: <fragment>'"


@pytest.mark.parametrize("path", ACCEPT, ids=[p.stem for p in ACCEPT])
def test_accept_fixture_type_checks(path: Path, diagnostics: dict[Path, list[tuple[int, str]]]) -> None:
    assert diagnostics.get(path, []) == []


@pytest.mark.parametrize("path", REJECT, ids=[p.stem for p in REJECT])
def test_reject_fixture_fails_for_its_stated_reason(path: Path,
                                                    diagnostics: dict[Path, list[tuple[int, str]]]) -> None:
    [(line, fragment)] = _expected(path).items()
    got = diagnostics.get(path, [])
    assert got, f"{path.name}: mypy accepted it; expected line {line}: {fragment}"
    for at, message in got:
        assert at == line, f"{path.name}: an error on line {at}, not the stated line {line}: {message}"
        assert fragment in message, f"{path.name}:{at}: mypy says {message!r}, not {fragment!r}"
