"""A function kernel on the real Hugging Face worker, on the shipped tiny model: plumbed, counted and proven active
by the host (`invar.workers.kernel_host`); a bad kernel refused at start in one line (exit 2, no handshake), and a
kernel that fails mid-call, or never runs, an error of that call."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from invar.engines import start_worker, worker_argv, worker_env
from invar.errors import WorkerError
from invar.patches import patch_digest
from invar.protocol import Role
from invar.transport import WorkerClient
from invar.workers.common import PatchRefused, load_patches
from invar.workers.kernel_host import KernelRefused

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "workers" / "hf"))
sys.path.insert(0, str(_TESTS / "patches"))

from hf_calls import generate, load_params, make_requests  # noqa: E402
from patch_helpers import load_module  # noqa: E402
from support.kernel_workers import hf_worker, outside, patch_args  # noqa: E402

_shared = load_module(_TESTS / "workers" / "conftest.py", "invar_tests_kernels_workers_conftest")
model_dir = _shared.model_dir
model_digest = _shared.model_digest
problems = _shared.problems

pytestmark = pytest.mark.engine

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kernels"


def _kernel(tmp: Path, name: str, code: str, toml: str | None = None) -> Path:
    folder = tmp / name
    shutil.copytree(EXAMPLES / "softmax-fp32", folder)
    (folder / "kernel.py").write_text("import torch\n\n" + code)
    if toml is not None:
        (folder / "kernel.toml").write_text(toml)
    return folder


@pytest.fixture(scope="module")
def stock_eager(model_dir: Path, model_digest: str) -> Iterator[WorkerClient]:
    yield from hf_worker(["--attn-implementation", "eager"], model_dir, model_digest)


@pytest.fixture(scope="module")
def softmax_kernel(tmp_path_factory: pytest.TempPathFactory, model_dir: Path,
                   model_digest: str) -> Iterator[tuple[WorkerClient, Path]]:
    """The example fp32 softmax, from a copy outside the checkout."""
    folder = outside(EXAMPLES / "softmax-fp32", tmp_path_factory.mktemp("elsewhere"), "my-softmax")
    for client in hf_worker(patch_args(folder), model_dir, model_digest):
        yield client, folder


def _requests(problems: list[Any]) -> list[dict[str, Any]]:
    return make_requests(problems[:6], temperature=0.0)


def test_a_kernel_folder_anywhere_runs_and_is_counted(softmax_kernel: tuple[WorkerClient, Path],
                                                      stock_eager: WorkerClient, problems: list[Any]) -> None:
    worker, folder = softmax_kernel
    settings = worker.identity.settings
    assert settings["patches"] == {str(folder): patch_digest(folder)}
    assert settings["attn_implementation"] == "eager"  # eager attention is where the model's softmax is
    requests = _requests(problems)
    result = worker.call("generate", {"requests": requests, "layout": [list(range(len(requests)))],
                                      "adapter": None, "reference_adapter": None})
    assert result["patch_calls"][str(folder)] > 0
    # A correct softmax: the greedy answers are the stock engine's, the log-probabilities within float rounding.
    stock = generate(stock_eager, requests)
    for mine, theirs in zip(result["outputs"], stock, strict=True):
        assert np.array_equal(mine["tokens"], theirs["tokens"])
        assert float(np.max(np.abs(mine["logprobs"] - theirs["logprobs"]), initial=0.0)) < 1e-4


def test_a_kernel_that_does_not_replace_attention_keeps_sdpa(model_dir: Path, model_digest: str,
                                                             problems: list[Any]) -> None:
    folder = EXAMPLES / "silu-fp32"
    for worker in hf_worker(patch_args(folder), model_dir, model_digest):
        assert worker.identity.settings["attn_implementation"] == "sdpa"
        requests = _requests(problems)[:2]
        result = worker.call("generate", {"requests": requests, "layout": [[0, 1]], "adapter": None,
                                          "reference_adapter": None})
        assert result["patch_calls"][str(folder)] > 0


def test_a_kernel_never_called_makes_the_call_an_error(tmp_path: Path, model_dir: Path, model_digest: str,
                                                       problems: list[Any]) -> None:
    folder = _kernel(tmp_path, "bf16-only",
                     "def softmax(input, dim, dtype=None):\n    return torch.softmax(input, dim)\n",
                     'op = "softmax"\nengines = ["hf"]\ndtypes = ["bfloat16"]\n')
    for worker in hf_worker(patch_args(folder), model_dir, model_digest):
        with pytest.raises(WorkerError, match="the kernel was never called: op softmax is not on this engine's path"):
            generate(worker, _requests(problems)[:2])


def test_a_kernel_failing_mid_call_is_that_calls_error(tmp_path: Path, model_dir: Path, model_digest: str,
                                                       problems: list[Any]) -> None:
    """Right on the self-check's short rows, wrong on the model's longer ones: the call fails, naming the shapes;
    the worker keeps serving."""
    code = ("def softmax(input, dim, dtype=None):\n    out = torch.softmax(input, dim)\n"
            "    return out if input.shape[-1] <= 7 else out[..., :-1]\n")
    folder = _kernel(tmp_path, "short-rows", code)
    for worker in hf_worker(patch_args(folder), model_dir, model_digest):
        with pytest.raises(WorkerError, match=r"returned shape .* the stock op returns shape"):
            generate(worker, _requests(problems)[:2])
        assert worker.identity.settings["patches"] == {str(folder): patch_digest(folder)}


BAD = {
    "syntax error": ("def softmax(input, dim:\n    return input\n", "syntax error at line"),
    "wrong signature": ("def softmax(x):\n    return torch.softmax(x, -1)\n", "does not take the stock op's"),
    "raises": ("def softmax(input, dim, dtype=None):\n    raise ValueError('boom')\n", "raised ValueError"),
    "wrong shape": ("def softmax(input, dim, dtype=None):\n    return input[..., :1]\n", "returned shape (2, 3, 1)"),
    "wrong dtype": ("def softmax(input, dim, dtype=None):\n    return torch.softmax(input, dim).double()\n",
                    "float64"),
    "NaN": ("def softmax(input, dim, dtype=None):\n    return input * float('nan')\n", "NaN or infinity"),
    "no function": ("def soft_max(input, dim, dtype=None):\n    return input\n", "defines no function softmax"),
}


def _refusal(folder: Path) -> str:
    """The one line `load_patches` and the self-check refuse a kernel with (what the worker prints before exit 2)."""
    try:
        patches = load_patches(patch_args(folder)[1:], [])
        kernel = patches.modules[str(folder)]
        kernel.self_check()
    except (PatchRefused, KernelRefused) as exc:
        return f"--patch {folder}: {exc}" if isinstance(exc, KernelRefused) else str(exc)
    raise AssertionError("the kernel was accepted")


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_kernel_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    """The checks the worker makes at start, in this process: fast, and the same code."""
    code, words = BAD[case]
    message = _refusal(_kernel(tmp_path, "bad", code))
    assert "\n" not in message
    assert words in message
    assert str(tmp_path / "bad") in message


def test_the_worker_refuses_a_bad_kernel_before_any_handshake(tmp_path: Path) -> None:
    code, words = BAD["NaN"]
    folder = _kernel(tmp_path, "bad", code)
    done = subprocess.run(worker_argv("hf", Role.INFERENCE, patch_args(folder)), env=worker_env(), capture_output=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    message = done.stderr.decode()
    assert done.returncode == 2, message
    assert done.stdout == b"", "no handshake may be sent"
    assert message.count("\n") == 1, message
    assert words in message
    assert str(folder) in message


def test_a_matmul_kernel_runs_on_vllm_where_the_linear_layers_are(tmp_path: Path, model_dir: Path,
                                                                    model_digest: str, problems: list[Any]) -> None:
    """On vLLM (CPU) the host makes each linear layer's cpu_linear the kernel: counted like on HF."""
    folder = _kernel(tmp_path, "matmul", "def matmul(a, b):\n    return torch.matmul(a, b)\n",
                     'op = "matmul"\nengines = ["hf", "vllm"]\ndtypes = ["float32"]\n')
    client = start_worker("vllm", Role.INFERENCE, args=patch_args(folder))
    try:
        assert client.identity.settings["patches"] == {str(folder): patch_digest(folder)}
        client.call("load_model", load_params(model_dir, model_digest))
        requests = _requests(problems)[:2]
        result = client.call("generate", {"requests": requests, "layout": [[0, 1]], "adapter": None,
                                          "reference_adapter": None})
        assert result["patch_calls"][str(folder)] > 0
    finally:
        client.close()


def test_infer_runs_with_a_kernel_folder_and_says_so(tmp_path: Path) -> None:
    folder = EXAMPLES / "silu-fp32"
    out = subprocess.run([sys.executable, "-m", "invar.cli", "infer", "23+18=", "--temperature", "0", "--max-tokens",
                          "4", "--patch", str(folder), "--json", "--run", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["patches"] == {str(folder.resolve()): patch_digest(folder)}
