"""A kernel that computes NaN mid-call: the hf worker answers the call with `NonFiniteOutput` (sampled or greedy,
generate or score) rather than a token drawn from NaN; `use run` closes the run at the first candidate call so
answered, and `use admit` decides it Violated from that recorded error, naming the call, without the calls never made
(a receipt binds the error record and `use verify` recomputes it). The worker half runs the real engine on the
shipped tiny model with the `nan-matmul` fixture from a folder outside the checkout."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract.contract_runs import make_workspace
from support.cli_batch import InvarSession
from support.fake_worker import ENGINE_VERSION, FakeTransport, FakeWorker, Script

from invar.contract.admit import admit
from invar.contract.model import Package
from invar.contract.receipt import receipt_body
from invar.errors import WorkerError
from invar.records import RunStore
from invar.runner.use_run import failed_call, use_run
from invar.transport import WorkerClient

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "workers" / "hf"))
sys.path.insert(0, str(_TESTS / "patches"))

from hf_calls import generate, make_requests, score  # noqa: E402
from patch_helpers import load_module  # noqa: E402
from support.kernel_workers import NAN_MATMUL, nan_worker, outside  # noqa: E402

_shared = load_module(_TESTS / "workers" / "conftest.py", "invar_tests_contract_nan_workers_conftest")
model_dir = _shared.model_dir
model_digest = _shared.model_digest
problems = _shared.problems
__all__ = ["nan_worker"]  # the shared fixture, used here


@pytest.mark.engine
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_nan_is_the_calls_error_not_a_token(nan_worker: WorkerClient, problems: list[object],
                                            temperature: float) -> None:
    requests = make_requests(problems[:4], temperature=temperature)
    with pytest.raises(WorkerError) as caught:
        generate(nan_worker, requests)
    assert caught.value.error_type == "NonFiniteOutput"
    assert "log-probabilities hold NaN at response step 0" in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.engine
def test_teacher_forcing_through_nan_is_refused_too(nan_worker: WorkerClient, problems: list[object]) -> None:
    import numpy as np

    requests = make_requests(problems[:2], temperature=1.0)
    forced = [{"tokens": np.array([5, 6], dtype=np.int32)} for _ in requests]
    with pytest.raises(WorkerError) as caught:
        score(nan_worker, requests, forced)
    assert caught.value.error_type == "NonFiniteOutput"


def _package(patches: dict[str, str]) -> Package:
    return Package.model_validate({"engine": "hf", "engine_version": {"torch": "2"}, "settings": {}, "patches": patches,
                                   "model_dir": "model", "model_digest": "a" * 64, "dtype": "float32",
                                   "tokenizer_digest": "b" * 64})


def test_use_runs_line_names_the_package_and_its_patches() -> None:
    error = WorkerError("generate", "NonFiniteOutput", "the model's log-probabilities hold NaN at response step 0")
    message = failed_call(error, "candidate call candidate/solo#0 (call id 2)", _package({"./nan-matmul": "c" * 64}))
    assert message.startswith("candidate call candidate/solo#0 (call id 2): the package (hf, patches ./nan-matmul) "
                              "produced non-finite values: the model's log-probabilities hold NaN at response step 0;")
    assert "a resume repeats the call, which fails the same way while the package is unchanged" in message
    other = failed_call(WorkerError("generate", "RuntimeError", "out of memory"), "reference call reference/solo#0",
                        _package({}))
    assert other == "reference call reference/solo#0: the package (hf) failed: out of memory"


@pytest.fixture
def cli() -> Iterator[InvarSession]:
    """The command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py), their workers started as a user's command starts them: the CLI's start-up once."""
    with InvarSession(bound_s=900) as session:
        yield session


@pytest.mark.engine
def test_a_nan_kernels_run_is_closed_at_the_call_and_decided_violated(cli: InvarSession, tmp_path: Path) -> None:
    """The whole loop on the real worker: init, prepare, run (closed at the first non-finite candidate call, exit 0),
    admit (Violated, exit 10, the call named and bound), a receipt that verify recomputes, a resume with nothing to
    do."""
    outside(NAN_MATMUL, tmp_path)
    made = cli.run("use", "init", "k.toml", "--candidate-patch", "./nan-matmul", "--sample", "32", "--temperature",
                   "0", "--requests-per-call", "16", "--no-invariance", "--no-measurements", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert cli.run("use", "prepare", "k.toml", cwd=tmp_path).returncode == 0
    ran = cli.run("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "stopped: candidate call candidate/b16#0" in ran.stdout
    assert "answered NonFiniteOutput" in ran.stdout
    with RunStore.open(tmp_path / "run") as store:
        assert store.verify().closed
        failed = [c for c in store.calls() if c.report is not None and not c.report.report.ok]
    assert len(failed) == 1
    error = failed[0]
    assert error.report is not None
    assert error.report.report.error is not None
    assert error.report.report.error.type == "NonFiniteOutput"

    admitted = cli.run("use", "admit", "run", "--contract", "k.contract.json", "--json", "--receipt", "receipt.json",
                       cwd=tmp_path)
    assert admitted.returncode == 10, admitted.stderr
    decision = json.loads(admitted.stdout)
    assert decision["answer"] == "Violated"
    assert decision["reason"].startswith("the candidate package produced non-finite values in candidate call "
                                         f"candidate/b16#0 (call id {error.call.call_id}, record {error.seq}; ")
    assert "log-probabilities hold NaN at response step 0" in decision["reason"]
    nonfinite = decision["nonfinite"]
    assert (nonfinite["call"], nonfinite["call_id"], nonfinite["record"], nonfinite["call_digest"]) == \
        ("candidate/b16#0", error.call.call_id, error.seq, error.call_digest)
    assert nonfinite["report_digest"] == error.report.report_digest
    assert decision["bound"] is None  # the recorded error decides; no bound over the units paired before it
    assert decision["task_loss"]["n"] < 32

    verified = cli.run("use", "verify", "receipt.json", "--run", "run", "--contract", "k.contract.json",
                       "--trust-embedded-key", "--json", cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    envelope = json.loads((tmp_path / "receipt.json").read_text())
    predicate = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    assert predicate["answer"] == "Violated"
    assert predicate["figures"]["nonfinite"] == nonfinite  # the receipt binds the error record
    again = cli.run("use", "run", "k.contract.json", "--run", "run", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stdout


@pytest.mark.parametrize("measurements", [{"capture_steps": [0, "last"], "max_kl": "0.0001"}])
def test_a_run_closed_at_a_nan_call_under_measurements_is_decided(tmp_path: Path, measurements: dict[str, Any]) -> None:
    """The contract `use init --candidate-patch` proposes has measurements: the plan's measurement calls after the
    non-finite call were never made, and admission decides from the recorded error without them (a receipt binds
    the measurement records made before it)."""
    ws = make_workspace(tmp_path, units=32, reference={"engine_version": ENGINE_VERSION},
                        candidate={"engine_version": ENGINE_VERSION, "patches": None},
                        execution={"requests_per_call": 8}, measurements=measurements)
    outcome = use_run(ws.contract_path, tmp_path / "run", transport=FakeTransport(_nan_on_the_candidates_second_call()))
    assert outcome.nonfinite is not None
    decision = admit(ws.contract_path, tmp_path / "run")
    assert decision.answer.value == "Violated"
    assert decision.nonfinite is not None
    assert receipt_body(decision)["figures"]["nonfinite"] == decision.nonfinite.output().model_dump()


class NonFiniteOutput(RuntimeError):
    """Raised by the fake engine as the hf worker raises its own: the worker answers the call with this error type."""


def _nan_on_the_candidates_second_call() -> Script:
    calls = [0]

    def report(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        if method == "generate" and worker.package == "candidate":
            calls[0] += 1
            if calls[0] == 2:
                raise NonFiniteOutput("the model's log-probabilities hold NaN at response step 1 in 2 of 8 rows of the "
                                      "batch (first: row 3); the forward computed a non-finite value")
        return result

    return Script(report=report)


def test_use_run_closes_at_the_candidates_nan_call_and_admission_decides_from_it(tmp_path: Path) -> None:
    """Over fake workers (the core alone): the run stops issuing calls at the candidate's non-finite call, closes, and
    admission is Violated from that record, every other figure left out of the decision; the reference's own NaN is
    not the candidate's fault and leaves the run unclosed, as any failed call."""
    ws = make_workspace(tmp_path, units=32, reference={"engine_version": ENGINE_VERSION},
                        candidate={"engine_version": ENGINE_VERSION, "patches": None},
                        execution={"requests_per_call": 8})
    outcome = use_run(ws.contract_path, tmp_path / "run", transport=FakeTransport(_nan_on_the_candidates_second_call()))
    assert outcome.nonfinite is not None
    assert "answered NonFiniteOutput: the model's log-probabilities hold NaN at response step 1" in outcome.nonfinite
    assert outcome.calls_issued < outcome.calls_total
    with RunStore.open(tmp_path / "run") as store:
        assert store.verify().closed
        errors = [c for c in store.calls() if c.report is not None and not c.report.report.ok]
    assert len(errors) == 1
    decision = admit(ws.contract_path, tmp_path / "run")
    assert decision.answer.value == "Violated"
    assert decision.nonfinite is not None
    assert (decision.nonfinite.record_seq, decision.nonfinite.call_digest) == (errors[0].seq, errors[0].call_digest)
    assert decision.reason.startswith(f"the candidate package produced non-finite values in candidate call "
                                      f"{decision.nonfinite.key} (call id {errors[0].call.call_id}, record "
                                      f"{errors[0].seq}; 8 units from ")
    assert decision.bound is None
    assert decision.task_loss.n < 32
    assert receipt_body(decision)["figures"]["nonfinite"] == decision.nonfinite.output().model_dump()
    # Closed: a second use run has nothing to do, and decides the same.
    assert use_run(ws.contract_path, tmp_path / "run", transport=FakeTransport()).already_closed
    # compare numerical has no candidate outputs past the call: one line naming it, exit 2, no traceback.
    compared = subprocess.run([sys.executable, "-m", "invar.cli", "compare", "numerical", str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=300)
    assert compared.returncode == 2
    refusal = compared.stderr.strip().splitlines()[-1]
    assert "answered NonFiniteOutput: the candidate has no outputs there to compare" in refusal
    assert "Traceback" not in compared.stderr

    def reference_nan(worker: FakeWorker, method: str, result: dict[str, Any]) -> dict[str, Any]:
        if method == "generate" and worker.package == "reference":
            raise NonFiniteOutput("the model's log-probabilities hold NaN at response step 0")
        return result

    with pytest.raises(WorkerError, match=r"the package .* produced non-finite values"):
        use_run(ws.contract_path, tmp_path / "ref", transport=FakeTransport(Script(report=reference_nan)))
    with RunStore.open(tmp_path / "ref") as store:
        assert not store.verify().closed
