"""Exports that cannot be decided from are refused in one line, exit 2, with nothing written.

The exports start from real ones (tests/imported/data: lm-eval's `--log_samples` file and Inspect's `.eval` log of
the tiny model on 40 arithmetic problems, README there) and are then damaged the ways real files are: an item
missing, an id repeated, a score NaN, an edited prompt, a truncated line or archive, a failed evaluation, a file of
1 GB, a FIFO.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from invar.cli.app import main

DATA = Path(__file__).resolve().parent / "data"
LM_EVAL = DATA / "lm-eval-samples.jsonl"
INSPECT = DATA / "inspect-log.eval"


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def invar(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`invar ARGS` run in this process through the command's own entry point (its exit status and what it prints),
    in folder `cwd`: the same parsing and error reporting as the installed command, without a new interpreter."""

    def run(*args: str | Path, cwd: Path) -> Result:
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        monkeypatch.setattr(sys, "argv", ["invar", *map(str, args)])
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


def declaration(folder: Path, fmt: str, reference: str, candidate: str, metric: str, extra: str = "") -> Path:
    path = folder / "decl.toml"
    path.write_text(f'name = "hostile"\n[imported]\nformat = "{fmt}"\nmetric = "{metric}"\n{extra}'
                    f'reference = {{ path = "{reference}" }}\ncandidate = {{ path = "{candidate}" }}\n'
                    '[requirement]\nstandard = "population"\nepsilon = "0.2"\nconfidence = "0.95"\n'
                    'method = "paired-binary-exact"\n', encoding="utf-8")
    return path


def _lines() -> list[dict[str, object]]:
    return [json.loads(line) for line in LM_EVAL.read_text(encoding="utf-8").splitlines()]


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _missing(rows: list[dict[str, object]]) -> None:
    del rows[7]


def _duplicate(rows: list[dict[str, object]]) -> None:
    rows.append(dict(rows[3]))


def _nan(rows: list[dict[str, object]]) -> None:
    rows[5]["exact_match"] = float("nan")


def _edited_prompt(rows: list[dict[str, object]]) -> None:
    args = rows[2]["arguments"]
    assert isinstance(args, dict)
    args["gen_args_0"]["arg_0"] = "1+1="


def _other_task(rows: list[dict[str, object]]) -> None:
    # another task's item under the same doc_id, consistently hashed: the pairing must see the content differs
    import hashlib

    args = rows[4]["arguments"]
    assert isinstance(args, dict)
    args["gen_args_0"]["arg_0"] = "2+2="
    rows[4]["prompt_hash"] = hashlib.sha256(b"2+2=").hexdigest()


def _wrong_id(rows: list[dict[str, object]]) -> None:
    rows[9]["doc_id"] = 4000


def _no_metric(rows: list[dict[str, object]]) -> None:
    del rows[0]["exact_match"]


def _graded(rows: list[dict[str, object]]) -> None:
    rows[1]["exact_match"] = 0.5


LM_EVAL_DEFECTS: dict[str, tuple[Callable[[list[dict[str, object]]], None], str]] = {
    "missing item": (_missing, "item '7' is in the reference's export"),
    "duplicated item": (_duplicate, "item '3' appears twice"),
    "NaN score": (_nan, "doc_id 5: the score is nan, not a finite number"),
    "edited prompt": (_edited_prompt, "doc_id 2: prompt_hash is not the sha256"),
    "other content": (_other_task, "item '4' has a different prompt or target"),
    "wrong id": (_wrong_id, "item '4000' is in the candidate's export"),
    "no metric": (_no_metric, "doc_id 0: no metric 'exact_match'"),
    "graded score": (_graded, "doc_id 1: the loss is 0.5, not 0 or 1"),
}


def _refused(out: Result, expected: str, folder: Path, before: set[str]) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert expected in lines[0], lines[0]
    assert "Traceback" not in out.stderr
    assert out.stdout == ""
    assert {p.name for p in folder.iterdir()} == before  # nothing written


@pytest.mark.parametrize("defect", sorted(LM_EVAL_DEFECTS))
def test_damaged_lm_eval_export_is_one_line(invar: Callable[..., Result], tmp_path: Path, defect: str) -> None:
    damage, expected = LM_EVAL_DEFECTS[defect]
    _write(tmp_path / "ref.jsonl", _lines())
    rows = _lines()
    damage(rows)
    _write(tmp_path / "cand.jsonl", rows)
    declaration(tmp_path, "lm-eval", "ref.jsonl", "cand.jsonl", "exact_match")
    before = {p.name for p in tmp_path.iterdir()}
    _refused(invar("use", "prepare", "decl.toml", cwd=tmp_path), expected, tmp_path, before)


def test_truncated_lm_eval_export_is_one_line(invar: Callable[..., Result], tmp_path: Path) -> None:
    text = LM_EVAL.read_bytes()
    (tmp_path / "ref.jsonl").write_bytes(text)
    (tmp_path / "cand.jsonl").write_bytes(text[: len(text) // 2])
    declaration(tmp_path, "lm-eval", "ref.jsonl", "cand.jsonl", "exact_match")
    before = {p.name for p in tmp_path.iterdir()}
    _refused(invar("use", "prepare", "decl.toml", cwd=tmp_path), "(the file is truncated)", tmp_path, before)


def test_a_gigabyte_and_a_fifo_are_refused_unread(invar: Callable[..., Result], tmp_path: Path) -> None:
    (tmp_path / "ref.jsonl").write_bytes(LM_EVAL.read_bytes())
    with (tmp_path / "huge.jsonl").open("wb") as f:  # sparse: 1 GB on the size, nothing on the disk
        f.truncate(10**9)
    declaration(tmp_path, "lm-eval", "ref.jsonl", "huge.jsonl", "exact_match")
    before = {p.name for p in tmp_path.iterdir()}
    _refused(invar("use", "prepare", "decl.toml", cwd=tmp_path), "holds 1,000,000,000 bytes, over the 268,435,456",
             tmp_path, before)
    os.mkfifo(tmp_path / "pipe.jsonl")  # nobody writes to it: reading it would block forever
    declaration(tmp_path, "lm-eval", "ref.jsonl", "pipe.jsonl", "exact_match")
    before = {p.name for p in tmp_path.iterdir()}
    _refused(invar("use", "prepare", "decl.toml", cwd=tmp_path), "is a FIFO, not a regular file", tmp_path, before)


def _eval_entries() -> dict[str, bytes]:
    """The real .eval archive's entries, decompressed (Inspect writes them with zstd)."""
    import zstandard

    out = {}
    with zipfile.ZipFile(INSPECT) as archive:
        for info in archive.infolist():
            raw = archive.fp
            assert raw is not None
            raw.seek(info.header_offset)
            head = raw.read(30)
            raw.seek(info.header_offset + 30 + int.from_bytes(head[26:28], "little")
                     + int.from_bytes(head[28:30], "little"))
            data = raw.read(info.compress_size)
            out[info.filename] = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read() \
                if info.compress_type == 93 else data
    return out


def _eval_archive(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def test_inspect_defects_are_one_line(invar: Callable[..., Result], tmp_path: Path) -> None:
    entries = _eval_entries()
    header = json.loads(entries["header.json"])
    samples = sorted(n for n in entries if n.startswith("samples/"))
    # the real archive (zstd) against an archive of the same entries (deflate) pairs: the reader reads both
    (tmp_path / "ref.eval").write_bytes(INSPECT.read_bytes())
    _eval_archive(tmp_path / "same.eval", entries)
    declaration(tmp_path, "inspect", "ref.eval", "same.eval", "exact")
    ok = invar("use", "prepare", "decl.toml", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "hostile.contract.json").unlink()
    (tmp_path / "hostile.contract.json.sha256").unlink()

    failed = {**entries, "header.json": json.dumps({**header, "status": "error"}).encode()}
    nan = json.loads(entries[samples[0]])
    nan["scores"]["exact"]["value"] = float("nan")
    sample_id = nan["id"]
    cases = {
        "failed.eval": ({**entries, "header.json": failed["header.json"]}, 'status is "error", not "success"'),
        "missing.eval": ({k: v for k, v in entries.items() if k != samples[0]},
                         f"item '{sample_id}' is in the reference's export"),
        "nan.eval": ({**entries, samples[0]: json.dumps(nan).encode()}, "the score is nan, not a finite number"),
        "noheader.eval": ({k: v for k, v in entries.items() if k != "header.json"}, "has no header.json"),
    }
    for name, (content, expected) in cases.items():
        _eval_archive(tmp_path / name, content)
        declaration(tmp_path, "inspect", "ref.eval", name, "exact")
        before = {p.name for p in tmp_path.iterdir()}
        _refused(invar("use", "prepare", "decl.toml", cwd=tmp_path), expected, tmp_path, before)
    (tmp_path / "cut.eval").write_bytes(INSPECT.read_bytes()[:-200])  # the archive's directory is at its end
    declaration(tmp_path, "inspect", "ref.eval", "cut.eval", "exact")
    before = {p.name for p in tmp_path.iterdir()}
    _refused(invar("use", "prepare", "decl.toml", cwd=tmp_path), "not a complete .eval archive", tmp_path, before)


def test_an_export_changed_after_prepare_is_refused_at_admission(invar: Callable[..., Result], tmp_path: Path) -> None:
    rows = _lines()
    _write(tmp_path / "ref.jsonl", rows)
    _write(tmp_path / "cand.jsonl", rows)
    declaration(tmp_path, "lm-eval", "ref.jsonl", "cand.jsonl", "exact_match")
    assert invar("use", "prepare", "decl.toml", cwd=tmp_path).returncode == 0
    rows[0]["exact_match"] = 1.0 - float(rows[0]["exact_match"])  # type: ignore[arg-type]
    _write(tmp_path / "cand.jsonl", rows)
    before = {p.name for p in tmp_path.iterdir()}
    out = invar("use", "admit", "--contract", "hostile.contract.json", "--junit", "j.xml", "--summary", "s.md",
                 cwd=tmp_path)
    _refused(out, "not the", tmp_path, before)
    assert "the contract pins" in out.stderr
