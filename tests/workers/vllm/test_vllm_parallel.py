"""vLLM's own parallelism passed through a package's settings: a worker split over two CPU workers (tensor parallel
size 2) says so in its identity, and its numbers differ from one worker's only by the rounding of the split sums."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from test_vllm_worker import assert_engine_output_on_stderr

from invar.engines import DEFAULT_MODEL, start_worker
from invar.errors import ProtocolError
from invar.runner.engine import launch_args
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import Problem
from invar.transport import WorkerClient

pytestmark = pytest.mark.engine


def test_launch_args_pass_vllm_parallelism_through() -> None:
    settings = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "distributed_executor_backend": "mp"}
    args = launch_args("vllm", settings, {})
    assert args == ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                    "--distributed-executor-backend", "mp"]
    assert launch_args("hf", settings, {}) == []  # not an HF launch option: checked against the identity only


def test_parallel_cpu_workers_without_thread_binding_are_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with pytest.raises(ProtocolError) as info:
        start_worker("vllm", args=["--tensor-parallel-size", "2"], handshake_timeout=120)
    message = str(info.value)
    assert "VLLM_CPU_OMP_THREADS_BIND" in message
    assert "the worker refused to start: invar.workers.vllm_worker: " in message  # its own line, alone


def test_tensor_parallel_two_is_identity_and_changes_only_rounding(worker: WorkerClient, load_params: dict[str, Any],
                                                                   problems: list[Problem]) -> None:
    bind = "0|1" if (os.cpu_count() or 1) >= 2 else "0|0"
    # Two CPU workers: vLLM spawns its engine core, where the worker reads the configuration it built (and scores at
    # T != 1) only through `LLM.apply_model`, which vLLM sends there with insecure serialization allowed.
    split = start_worker("vllm", args=launch_args("vllm", {"tensor_parallel_size": 2}, {}),
                         env={"VLLM_CPU_OMP_THREADS_BIND": bind, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"})
    try:
        settings = split.identity.settings
        assert settings["tensor_parallel_size"] == 2
        assert settings["env"]["VLLM_CPU_OMP_THREADS_BIND"] == bind
        assert "tensor_parallel_size" not in worker.identity.settings  # unset: vLLM's default, left out
        split.call("load_model", load_params)
        assert_engine_output_on_stderr(split, spawned=True)  # two CPU workers: vLLM spawns its engine core
        tok = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
        reqs = [{"request_id": f"tp-{i}", "prompt": p.prompt, "prompt_ids": tok.prompt_ids(prompt=p.prompt),
                 "seed": 9000 + i, "temperature": 1.0, "top_p": 1.0, "max_tokens": 5}
                for i, p in enumerate(problems[:64])]
        one = worker.call("generate", {"requests": reqs})["outputs"]
        two = split.call("generate", {"requests": reqs})["outputs"]
    finally:
        split.close()
    same_tokens = sum(a["tokens"].tobytes() == b["tokens"].tobytes() for a, b in zip(one, two, strict=True))
    bitwise = sum(a["logprobs"].tobytes() == b["logprobs"].tobytes() for a, b in zip(one, two, strict=True))
    gaps = [float(np.max(np.abs(a["logprobs"].astype(np.float64) - b["logprobs"].astype(np.float64))))
            for a, b in zip(one, two, strict=True) if a["tokens"].tobytes() == b["tokens"].tobytes()]
    print(f"measured: tensor parallel 2 vs 1 on 64 requests at T = 1: tokens equal on {same_tokens}, log-probs "
          f"bit-identical on {bitwise}, max |diff| {max(gaps):.2e} nats")
    assert same_tokens >= 60
    assert max(gaps) < 1e-4
    assert bitwise < 64  # the split changes the order of the sums: the numbers move, which is what Invar measures
