"""A kernel that computes NaN mid-call: the hf worker answers the call with `NonFiniteOutput` (sampled or greedy,
generate or score) rather than a token drawn from NaN, and `use run`'s one line names the call, the package and its
patches. The worker half runs the real engine on the shipped tiny model with the `nan-matmul` fixture from a folder
outside the checkout."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from invar.contract.model import Package
from invar.engines import start_worker
from invar.errors import WorkerError
from invar.patches import patch_digest
from invar.protocol import Role
from invar.runner.use_run import failed_call
from invar.transport import WorkerClient

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "workers" / "hf"))
sys.path.insert(0, str(_TESTS / "patches"))

from hf_calls import generate, load_params, make_requests, score  # noqa: E402
from patch_helpers import load_module  # noqa: E402

_shared = load_module(_TESTS / "workers" / "conftest.py", "invar_tests_contract_nan_workers_conftest")
model_dir = _shared.model_dir
model_digest = _shared.model_digest
problems = _shared.problems

FIXTURE = Path(__file__).resolve().parent / "kernels" / "nan-matmul"


@pytest.fixture(scope="module")
def nan_worker(tmp_path_factory: pytest.TempPathFactory, model_dir: Path,
               model_digest: str) -> Iterator[WorkerClient]:
    folder = tmp_path_factory.mktemp("elsewhere") / "nan-matmul"
    shutil.copytree(FIXTURE, folder)
    client = start_worker("hf", Role.INFERENCE, args=["--patch", f"{folder}={patch_digest(folder)}"])
    try:
        client.call("load_model", load_params(model_dir, model_digest))
        yield client
    finally:
        client.close()


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
