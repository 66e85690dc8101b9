"""vLLM's effective configuration is read from the model inside the engine: where its engine core runs in a process
of its own and vLLM will not send the reading function there, the load is refused in one line naming both fixes,
never run with a configuration nobody read back."""

from __future__ import annotations

from typing import Any

import pytest

from invar.engines import start_worker
from invar.errors import WorkerError

pytestmark = pytest.mark.engine


def test_a_core_in_its_own_process_without_serialization_is_refused_in_one_line(
        load_params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the worker keeps an explicit choice
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    client = start_worker("vllm")
    try:
        with pytest.raises(WorkerError) as refused:
            client.call("load_model", load_params)
    finally:
        client.close()
    line = str(refused.value)
    assert "\n" not in line
    assert "vLLM's engine core runs in its own process, where this worker cannot read back the configuration it " \
           "built of" in line, line
    assert line.endswith("(vLLM sends the reading function there only with VLLM_ALLOW_INSECURE_SERIALIZATION=1); set "
                         "that in the package's env, or run the core in the worker's process "
                         "(VLLM_ENABLE_V1_MULTIPROCESSING=0)"), line
