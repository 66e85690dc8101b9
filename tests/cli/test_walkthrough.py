"""The README's main job, end to end: the walkthrough script with the real engines on the shipped model, one whole
use decision from declaration to a verified receipt, with a run killed part-way and resumed."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
from support.venv_path import with_venv_bin

from invar.records import RunStore

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout these tests belong to

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_walkthrough_decides_a_contract_from_a_resumed_run(tmp_path: Path) -> None:
    out = tmp_path / "walk"
    env = dict(os.environ, INVAR_WALKTHROUGH_OUT=str(out),
               PATH=with_venv_bin())
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "walkthrough.sh")], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in range(1, 11):
        assert f"== {step}." in proc.stdout
    for run in ("infer-hf", "eval-fp32"):
        with RunStore.open(out / run) as store:
            v = store.verify()
            assert v.calls == v.reports > 0
            assert v.errors == 0
            assert v.closed
    with RunStore.open(out / "use-run") as store:
        assert store.verify().closed
    envelope = json.loads((out / "receipt.json").read_text())  # a DSSE envelope around an in-toto statement
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == "https://invar.dev/use-decision/v1"
    assert statement["predicate"]["answer"] in ("Admitted", "Violated", "Unknown")
    assert [sorted(s) for s in envelope["signatures"]] == [["keyid", "publicKey", "sig"]]
    assert "verified: " in proc.stdout
    assert "signature: valid, by the key you gave" in proc.stdout
