"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `python -m llama_cpp.server`, the build the llamacpp
worker runs) as an `openai` endpoint, on the shipped SmolLM2 Q4_1 GGUF: what it honours, measured over HTTP, and the
endpoint worker's one-line refusals of what it does not (docs/endpoints.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai_server import free_port

from invar import canonical
from invar.engines import start_worker
from invar.errors import WorkerError
from invar.tasks import ModelTokenizer

SERVED = "smollm2"
START_TIMEOUT_S = 120.0
STORY = "Once upon a time, in a village by the sea, there lived"
"""A prompt whose repeat the server computes otherwise (measured: its first token -0.10266 fresh, -0.11188 repeated)."""
NEUTRAL = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
"""llama.cpp's sampler defaults undone (top-k 40, min-p 0.05, repetition penalty 1.1), as the worker sends."""


def server_argv(gguf: Path, port: int) -> list[str]:
    """The launch command docs/endpoints.md gives: one thread, a 512-token context, every position's logits kept
    (`--logits_all`, without which the server refuses log-probabilities)."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", SERVED,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "1",
            "--n_threads_batch", "1", "--logits_all", "True", "--verbose", "False"]


@pytest.fixture(scope="module")
def gguf_dir(smollm2_build: tuple[Path, Path, Path]) -> Path:
    return smollm2_build[2]


@pytest.fixture(scope="module")
def server(gguf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running llama.cpp server of the shipped GGUF on a free loopback port; its root URL."""
    (gguf,) = gguf_dir.glob("*.gguf")
    port = free_port()
    log = tmp_path_factory.mktemp("llamacpp-serve") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(server_argv(gguf, port), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        started, deadline = time.perf_counter(), time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"no answer in {START_TIMEOUT_S:.0f} s: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5):
                    break
            except OSError:
                time.sleep(0.5)
        print(f"measured: llama.cpp server up in {time.perf_counter() - started:.1f} s")
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps({"model": SERVED, **body}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())["choices"][0]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def sample(url: str, prompt: str, **extra: Any) -> dict[str, Any]:
    status, choice = post(url, {"prompt": prompt, "max_tokens": 4, "temperature": 1.0, "top_p": 1.0, "seed": 5,
                                "logprobs": 1, **NEUTRAL, **extra})
    assert status == 200, choice
    assert isinstance(choice, dict)
    return choice


def numbers(choice: dict[str, Any]) -> tuple[list[str], list[float]]:
    return choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]


def load_params(gguf_dir: Path) -> dict[str, Any]:
    return {"model_dir": str(gguf_dir), "model_digest": canonical.tree_digest(gguf_dir), "dtype": "float32",
            "quantization": "none", "adapter": None}


def test_it_takes_text_prompts_only(server: str) -> None:
    status, body = post(server, {"prompt": [1, 2, 3], "max_tokens": 1})
    assert status == 500
    assert "Input should be a valid string" in body


def test_seeds_log_probabilities_and_the_end_token_measured(server: str, gguf_dir: Path) -> None:
    tok = ModelTokenizer.from_model_dir(gguf_dir)
    # a seed is honoured from the same state: the story after another prompt, twice, is the same bits
    sample(server, "Zebra stripes are")
    fresh = numbers(sample(server, STORY))
    sample(server, "Zebra stripes are")
    assert numbers(sample(server, STORY)) == fresh
    # ... but the same request right after itself is computed otherwise (only its last prompt token is recomputed)
    repeated = numbers(sample(server, STORY))
    assert repeated[1][0] != fresh[1][0]
    # sampled log-probabilities are at temperature 1 (raw): the greedy and T = 0.5 runs of a fresh prompt report
    # the T = 1 value of the same first token
    sample(server, "Zebra stripes are")
    t1 = numbers(sample(server, STORY, max_tokens=1, temperature=0.0))
    sample(server, "Zebra stripes are")
    half = numbers(sample(server, STORY, max_tokens=1, temperature=0.5))
    assert t1 == half == (fresh[0][:1], fresh[1][:1])
    # the sampled token's value is its entry among the top log-probabilities, labelled by its text
    choice = sample(server, STORY, logprobs=2)
    for label, value, top in zip(*numbers(choice), choice["logprobs"]["top_logprobs"], strict=True):
        assert top[label] == value
        assert len(top) >= 2
    # a reply that ends stops on the end token without reporting it: neither its text nor its log-probability
    chat = tok.decode(tok.prompt_ids(messages=[{"role": "user", "content": "Say hi."}]), stop_at_eos=False)
    ended = sample(server, chat, max_tokens=40, temperature=0.0)
    assert ended["finish_reason"] == "stop"
    assert "<|im_end|>" not in ended["logprobs"]["tokens"]
    assert "".join(numbers(ended)[0]) == ended["text"]


def test_the_endpoint_worker_names_the_server_and_refuses_it(server: str, gguf_dir: Path) -> None:
    params = load_params(gguf_dir)
    client = start_worker("openai", args=["--base-url", server, "--served-model", SERVED, "--prompt", "ids"])
    try:
        # recognised by its OpenAPI title, as vLLM's server is by /version
        assert client.identity.settings["server"] == {
            "kind": "llama-cpp-python", "version": "0.3.36",
            "model": {"id": SERVED, "root": None, "max_model_len": None, "owned_by": "me"}}
        with pytest.raises(WorkerError) as ids_refused:
            client.call("load_model", params)
        assert "takes text prompts only" in str(ids_refused.value)
        assert "declare prompt = text" in str(ids_refused.value)
        assert "\n" not in str(ids_refused.value)
    finally:
        client.close()
    client = start_worker("openai", args=["--base-url", server, "--served-model", SERVED, "--prompt", "text"])
    try:
        with pytest.raises(WorkerError) as refused:
            client.call("load_model", params)
        message = str(refused.value)
        assert "the same seeded request sent twice came back different" in message
        assert "depend on the request before it" in message
        assert "\n" not in message
    finally:
        client.close()
