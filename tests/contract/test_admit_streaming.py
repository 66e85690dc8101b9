"""Admission reads a run one call at a time: the evidence keeps no outputs (they are read again from the store when
a loss or an invariance check needs them), and gives exactly what binding every record with its outputs gives."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from contract_runs import RunWriter, Workspace, make_workspace, unit_ids

from invar import canonical
from invar.contract.admit import admit
from invar.contract.bind import bind_records, collect_evidence, layout_outputs, params_digest
from invar.contract.decide import Answer, check_invariance, layout_invariance, layout_losses
from invar.contract.prepare import contract_scorer
from invar.contract.reading import RunReader
from invar.records import RunStore

N = 120


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    # Three invariance layouts, several calls each, so a difference is found across calls and layouts.
    return make_workspace(tmp_path_factory.mktemp("stream"), units=N,
                          layouts={"solo": {"batch_size": 1}, "b4r": {"batch_size": 4, "order": "reverse"},
                                   "b8": {"batch_size": 8}},
                          invariance={"required": True, "layouts": ["solo", "b4r", "b8"]},
                          execution={"requests_per_call": 16})


def _differing_run(ws: Workspace, run: Path) -> Path:
    """Candidate outputs that differ across layouts: a token in b8, a log-probability's last bit in b4r."""
    writer = RunWriter(ws, run)
    ref, cand = writer.worker("reference"), writer.worker("candidate")

    def flip_bit(outputs: list[dict[str, Any]]) -> None:
        lp = outputs[5]["logprobs"]
        lp[0] = np.float32(np.nextafter(lp[0], np.float32(0)))

    def change_token(outputs: list[dict[str, Any]]) -> None:
        outputs[2]["tokens"][0] = (int(outputs[2]["tokens"][0]) + 1) % 10 + 3

    for planned in ws.plan.calls:
        edit = {"candidate/b4r#3": flip_bit, "candidate/b8#1": change_token}.get(planned.key)
        writer.generate(ref if planned.package == "reference" else cand, planned,
                        wrong=unit_ids(ws, 4, 10) if planned.package == "candidate" else (), edit_outputs=edit)
    return writer.close()


def test_streamed_evidence_keeps_no_outputs_and_gives_the_same_numbers(ws: Workspace, tmp_path: Path) -> None:
    run = _differing_run(ws, tmp_path / "run")
    eos = {r: frozenset(ws.vocab.eos_token_ids) for r in ("reference", "candidate")}
    scorer = contract_scorer(ws.contract, ws.contract_path.parent)
    layouts = ("solo", "b4r", "b8")
    with RunStore.open(run) as store:
        held = bind_records(store.calls(), ws.contract, ws.plan, eos).found  # every output kept, as before
        streamed = collect_evidence(store, ws.contract, ws.sha256, ws.plan, eos).found
        assert set(streamed) == set(held)
        assert all(e.kept is None for e in streamed.values())
        assert [e.output() for e in streamed.values()] == [e.output() for e in held.values()]
        for key, e in streamed.items():
            for a, b in zip(e.outputs, held[key].outputs, strict=True):
                assert a.tokens.tobytes() == b.tokens.tobytes()
                assert a.logprobs.tobytes() == b.logprobs.tobytes()
                assert a.finish_reason == b.finish_reason
        for role in ("reference", "candidate"):
            assert np.array_equal(layout_losses(ws.plan, streamed, role, "solo", ws.vocab, scorer),
                                  layout_losses(ws.plan, held, role, "solo", ws.vocab, scorer))
        expected = check_invariance({name: layout_outputs(ws.plan, held, "candidate", name) for name in layouts})
        assert expected[0] == 2
        assert layout_invariance(ws.plan, streamed, "candidate", layouts) == expected
        for pair in (("solo", "b4r"), ("solo", "b8"), ("b8", "solo")):
            assert layout_invariance(ws.plan, streamed, "candidate", pair) == \
                check_invariance({name: layout_outputs(ws.plan, held, "candidate", name) for name in pair})
    d = admit(ws.contract_path, run)
    assert d.answer is Answer.VIOLATED
    assert d.invariance.units_differing == 2
    assert expected[1] is not None
    assert expected[1] in d.reason


def test_one_pass_reads_each_record_once_and_gives_what_binding_then_scoring_gives(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`RunReader.read_scored` (what admission reads a run with, issue 49): every record decoded once, the same
    evidence, losses and invariance as `bind_complete` then `losses` and `layout_invariance` reading again."""
    run = _differing_run(ws, tmp_path / "run")
    layouts = ("solo", "b4r", "b8")
    with RunStore.open(run) as store:  # the bodies that carry outputs: every report, by its digest
        reports = sorted(rec.report.report_digest for rec in store.iter_calls() if rec.report is not None)
    decoded: list[str] = []
    real = canonical.decode
    monkeypatch.setattr(canonical, "decode", lambda data: decoded.append(canonical.sha256(data)) or real(data))
    with RunStore.open(run) as store, tempfile.TemporaryDirectory() as scratch:
        reader = RunReader.of_run(ws.contract, ws.sha256, ws.contract_path.parent, store, Path(scratch))
        decoded.clear()
        scored = reader.read_scored(store, layouts)
        assert sorted(d for d in decoded if d in set(reports)) == reports  # each report once, none read again
        seen = len(decoded)
        assert scored.verification == store.verify()
        assert len(decoded) == seen  # the pass is the store's verification: no second one
        monkeypatch.setattr(canonical, "decode", real)
        again = reader.bind_complete(store).found
        assert [e.output() for e in scored.bound.found.values()] == [e.output() for e in again.values()]
        for role, losses in reader.losses(again).items():
            assert losses.dtype == scored.losses[role].dtype
            assert np.array_equal(losses, scored.losses[role])
        assert layout_invariance(ws.plan, scored.bound.found, "candidate", layouts, scored.digests) == \
            layout_invariance(ws.plan, again, "candidate", layouts)


def test_params_digest_is_the_canonical_digest_of_decoded_params() -> None:
    """The params of a record, decoded, digest as `canonical.digest` digests them (packed in C); a value that was not
    decoded (a tuple, an array of another byte order) is left to `canonical.digest`."""
    rng = np.random.default_rng(0)
    values: list[Any] = [
        {"layout": [[0, 1], [2]], "requests": [
            {"max_tokens": 5, "prompt": "1+2=", "prompt_ids": np.arange(n, dtype=np.int32), "request_id": f"u{n}",
             "seed": 2**63 - n, "temperature": 1.0, "top_p": None} for n in (0, 1, 3)]},
        {"a": np.zeros(0, dtype="<f4"), "b": rng.random((2, 3)).astype("<f8"), "c": np.array(7, dtype="|u1"),
         "d": np.array([True, False]), "e": b"\x00\x01", "f": -(2**63), "g": [np.int16(3), 1.5, "é"]},
    ]
    for value in values:
        plain = canonical.decode(canonical.encode(value))
        assert params_digest(plain) == canonical.digest(plain) == canonical.digest(value)
    built = {"x": (1, 2), "y": np.arange(3, dtype=">i4")}
    assert params_digest(built) == canonical.digest(built)
