"""The chat task for the real model (scripts/make_chat_task.py): committed bytes, loadable units, the task's scorer."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from invar.tasks.population import kinds, load_units
from invar.tasks.scorers import load_scorer

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
STEMS = ("chat-eval", "chat-train")
SIZES = {"chat-eval": 400, "chat-train": 2000}
KINDS = ("add", "next", "count", "lookup")


def _declared(stem: str) -> str:
    digest, name = (DATA / f"{stem}.sha256").read_text().split()
    assert name == f"{stem}.jsonl"
    return digest


def test_regenerating_gives_the_committed_bytes(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_chat_task.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for stem in STEMS:
        assert (tmp_path / f"{stem}.jsonl").read_bytes() == (DATA / f"{stem}.jsonl").read_bytes()
        assert (tmp_path / f"{stem}.sha256").read_bytes() == (DATA / f"{stem}.sha256").read_bytes()
        assert hashlib.sha256((DATA / f"{stem}.jsonl").read_bytes()).hexdigest() == _declared(stem)


def test_units_load_and_the_splits_are_disjoint() -> None:
    questions: dict[str, set[str]] = {}
    for stem in STEMS:
        units = load_units(DATA / f"{stem}.jsonl", _declared(stem))
        assert len(units) == SIZES[stem]
        assert kinds(units) == {k: SIZES[stem] // len(KINDS) for k in KINDS}
        for u in units:
            assert u.messages is not None
            assert u.messages[0].role == "system"
            assert [m.role for m in u.messages[1:]] == ["user", "assistant"] * 2 + ["user"]
            assert isinstance(u.answer, str)
            assert u.answer.isdigit()
        questions[stem] = {u.messages[-1].content for u in units if u.messages is not None}
        assert len(questions[stem]) == len(units)
    assert not questions["chat-eval"] & questions["chat-train"]


def test_the_task_scorer_reads_a_typical_reply() -> None:
    scorer = load_scorer("numeric", {"which": "last"}, ROOT)
    for stem in STEMS:
        for u in load_units(DATA / f"{stem}.jsonl"):
            scorer.check(u)
            right, wrong = u.answer, str(int(u.answer) + 1)
            for reply in (f"The answer is {right}.", right, f"{right}<|im_end|>"):
                assert scorer.loss(u, reply) == 0.0, (u.id, reply)
            assert scorer.loss(u, f"The answer is {wrong}.") == 1.0
            assert scorer.loss(u, "I do not know.") == 1.0
