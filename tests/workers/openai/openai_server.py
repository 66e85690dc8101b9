"""Starting a real OpenAI-compatible server for the endpoint tests: vLLM's own server
(`vllm.entrypoints.openai.api_server`, the CPU build the project installs) serving the shipped model on 127.0.0.1.

The server is started the way a deployment would be, with the launch options the in-process vLLM worker uses on
the CPU (float32, eager, no prefix caching, the same prefill budget), so the two can be compared call for call.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from invar.engines import worker_env

SERVED = "tiny"
START_TIMEOUT_S = 420.0  # two cores shared with the rest of the suite: vLLM's server takes 1-2 minutes to start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    """A running `vllm serve` of the shipped model; `url` is its root (no /v1)."""

    url: str
    model_dir: Path
    log: Path
    process: subprocess.Popen[bytes]

    def alive(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False


def start_server(model_dir: Path, port: int, log: Path, *extra: str) -> VllmServer:
    env = worker_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "INFO"})
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "128", "--gpu-memory-utilization", "0.3",
            "--no-enable-prefix-caching", "--max-num-batched-tokens", "16384", "--max-logprobs", "-1", *extra]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = VllmServer(f"http://127.0.0.1:{port}", model_dir, log, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {process.returncode}: {log.read_text()[-2000:]}")
        if server.alive():
            return server
        time.sleep(1.0)
    stop_server(server)
    raise RuntimeError(f"vLLM's server did not answer within {START_TIMEOUT_S:.0f} s: {log.read_text()[-2000:]}")


def stop_server(server: VllmServer) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGKILL)  # the server and its engine core
        server.process.wait(timeout=60)


def restart_server(server: VllmServer) -> float:
    """Start the server again on its own port, with the same model and launch options, after it was killed;
    returns the seconds it took to answer."""
    assert server.process.poll() is not None, "kill the server before restarting it"
    started = time.perf_counter()
    again = start_server(server.model_dir, int(server.url.rsplit(":", 1)[1]), server.log.with_suffix(".restart.log"))
    server.process, server.log = again.process, again.log
    return time.perf_counter() - started


def served_models(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]
