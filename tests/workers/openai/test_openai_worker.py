"""The endpoint worker against a real OpenAI-compatible server (vLLM's, on loopback): it answers the protocol with
the server's own tokens and log-probabilities, bound to the ids the core sent; it refuses what the server cannot
honour exactly; it retries what is transient and counts each attempt.

The in-process vLLM worker of the same vLLM build is the yardstick: the same requests, seeds and layouts must give
the same tokens and the same log-probability bits through the server.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai_server import SERVED, VllmServer, free_port, served_models

from invar.engines import start_worker
from invar.errors import ProtocolError, WorkerError
from invar.protocol import WorkerClient
from invar.tasks import ModelTokenizer

PROMPTS = ["37+58=", "12*7=", "305-187=", "9*9=", "37+58="]


def endpoint_args(url: str, *extra: str) -> list[str]:
    return ["--base-url", url, "--served-model", SERVED, *extra]


@pytest.fixture(scope="module")
def endpoint(vllm_server: VllmServer, load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    client = start_worker("openai", args=endpoint_args(vllm_server.url))
    try:
        client.call("load_model", load_params)
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def load_params(model_dir: Path, model_digest: str) -> dict[str, Any]:
    return {"model_dir": str(model_dir), "model_digest": model_digest, "dtype": "float32", "quantization": "none",
            "adapter": None}


@pytest.fixture(scope="module")
def reference(load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    """The in-process vLLM worker, launched as the server is."""
    client = start_worker("vllm", args=["--max-model-len", "128"])
    try:
        client.call("load_model", load_params)
        yield client
    finally:
        client.close()


def requests_for(vocab: ModelTokenizer, temperature: float = 1.0, seed: int = 0) -> list[dict[str, Any]]:
    return [{"request_id": str(i), "prompt": p, "prompt_ids": vocab.prompt_ids(prompt=p), "seed": seed + i,
             "temperature": temperature, "top_p": 1.0, "max_tokens": 5} for i, p in enumerate(PROMPTS)]


def test_identity_names_the_server_and_what_it_serves(endpoint: WorkerClient, vllm_server: VllmServer) -> None:
    ident = endpoint.identity
    assert ident.engine == "openai"
    settings = ident.settings
    assert settings["base_url"] == vllm_server.url
    assert settings["served_model"] == SERVED
    assert settings["server"]["model"]["id"] == SERVED
    assert settings["server"]["model"]["root"] == str(vllm_server.model_dir)
    assert settings["server"]["model"]["max_model_len"] == 128
    assert settings["server"]["version"] == ident.engine_version["server"]
    assert "api_key_env" not in settings  # none named: nothing to record (a key itself never is)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_served_tokens_and_log_probabilities_equal_the_in_process_engine(
        endpoint: WorkerClient, reference: WorkerClient, vocab: ModelTokenizer, temperature: float) -> None:
    reqs = requests_for(vocab, temperature)
    layout = [[0, 1, 2], [3], [4]]
    served = endpoint.call("generate", {"requests": reqs, "layout": layout})["outputs"]
    local = reference.call("generate", {"requests": reqs, "layout": layout})["outputs"]
    for s, r, req in zip(served, local, reqs, strict=True):
        assert s["request_id"] == req["request_id"]
        np.testing.assert_array_equal(s["prompt_tokens"], req["prompt_ids"])
        np.testing.assert_array_equal(s["tokens"], r["tokens"])
        assert s["logprobs"].dtype == np.float32
        assert s["logprobs"].tobytes() == r["logprobs"].tobytes()  # the same bits through HTTP and JSON
        assert s["finish_reason"] == r["finish_reason"]
        assert s["attempts"] == 1


def test_teacher_forced_scores_equal_the_in_process_engine(endpoint: WorkerClient, reference: WorkerClient,
                                                            vocab: ModelTokenizer) -> None:
    reqs = requests_for(vocab)
    tokens = reference.call("generate", {"requests": reqs})["outputs"]
    items = [{"item_id": f"{r['request_id']}@{t}", "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"].astype(np.int64), "temperature": t,
              "vocab_steps": [0] if t != 1.0 else []}
             for r, o in zip(reqs, tokens, strict=True) for t in (1.0, 0.7)]
    served = endpoint.call("score", {"items": items})["outputs"]
    local = reference.call("score", {"items": items})["outputs"]
    for s, r in zip(served, local, strict=True):
        assert s["item_id"] == r["item_id"]
        assert s["logprobs"].tobytes() == r["logprobs"].tobytes()
        assert s["vocab_logprobs"].shape == r["vocab_logprobs"].shape
        assert s["vocab_logprobs"].tobytes() == r["vocab_logprobs"].tobytes()


def test_what_the_server_cannot_honour_exactly_is_refused(endpoint: WorkerClient, vocab: ModelTokenizer) -> None:
    req = requests_for(vocab)[0]
    with pytest.raises(WorkerError, match="raw_logprobs"):
        endpoint.call("generate", {"requests": [{**req, "temperature": 0.5}]})
    with pytest.raises(WorkerError, match="top_p"):
        endpoint.call("generate", {"requests": [{**req, "top_p": 0.9}]})
    with pytest.raises(WorkerError, match="send no adapter"):
        endpoint.call("generate", {"requests": [req], "adapter": "mine"})
    with pytest.raises(WorkerError, match="maximum length 128"):
        endpoint.call("generate", {"requests": [{**req, "max_tokens": 127}]})
    with pytest.raises(WorkerError, match="outside the model's vocabulary"):
        endpoint.call("generate", {"requests": [{**req, "prompt_ids": [1, 99]}]})
    # The worker keeps serving after each refusal.
    assert endpoint.call("generate", {"requests": [req]})["outputs"][0]["finish_reason"] == "stop"


def _start_failure(args: list[str], env: dict[str, str] | None = None) -> str:
    started = time.monotonic()
    with pytest.raises(ProtocolError) as caught:
        start_worker("openai", args=args, env=env, handshake_timeout=60)
    assert time.monotonic() - started < 30
    return str(caught.value)


def test_a_server_that_is_absent_or_serves_another_model_is_refused_at_start(vllm_server: VllmServer) -> None:
    assert SERVED in served_models(vllm_server.url)
    message = _start_failure(["--base-url", vllm_server.url, "--served-model", "no-such-model"])
    assert "serves no model 'no-such-model'" in message
    assert SERVED in message  # says what it does serve
    message = _start_failure(["--base-url", f"http://127.0.0.1:{free_port()}", "--served-model", SERVED,
                              "--retries", "1"])
    assert "failed 2 times" in message
    message = _start_failure([*endpoint_args(vllm_server.url), "--api-key-env", "INVAR_TEST_NO_SUCH_KEY"])
    assert "INVAR_TEST_NO_SUCH_KEY" in message
    assert "is not set" in message


class _Flaky(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the real server that answers the first `failures` completions with HTTP 503."""

    upstream = ""
    failures = 0
    seen = 0

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))) if self.command == "POST" else None
        if self.path == "/v1/completions":
            type(self).seen += 1
            if type(self).seen <= type(self).failures:
                self.send_response(503)
                self.end_headers()
                self.wfile.write(b'{"error": "overloaded"}')
                return
        req = urllib.request.Request(self.upstream + self.path, data=body, method=self.command,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = resp.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _forward
    do_POST = _forward

    def log_message(self, *args: Any) -> None:
        pass


def test_transient_server_errors_are_retried_and_counted(vllm_server: VllmServer, load_params: dict[str, Any],
                                                         vocab: ModelTokenizer) -> None:
    _Flaky.upstream, _Flaky.seen = vllm_server.url, 0
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    client = start_worker("openai", args=endpoint_args(url, "--retries", "2"))
    try:
        client.call("load_model", load_params)
        req = requests_for(vocab)[0]
        _Flaky.failures, _Flaky.seen = 2, 0
        out = client.call("generate", {"requests": [req]})["outputs"][0]
        assert out["attempts"] == 3  # two 503s, then the answer
        assert out["finish_reason"] == "stop"
        _Flaky.failures, _Flaky.seen = 3, 0
        with pytest.raises(WorkerError, match="failed 3 times"):
            client.call("generate", {"requests": [req]})
    finally:
        client.close()
        proxy.shutdown()


class _Seedless(http.server.BaseHTTPRequestHandler):
    """A stand-in for a server that ignores request seeds (vLLM's honours them): every completion is drawn afresh,
    with well-formed ids and log-probabilities, so only the repetition check can tell."""

    draws = np.random.default_rng()

    def _send(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/version":
            self._send({"version": "0.0.0-seedless"})
        else:
            self._send({"data": [{"id": SERVED, "root": "seedless", "max_model_len": 128, "owned_by": "test"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = [int(t) for t in self.draws.integers(3, 18, size=body["max_tokens"])]
        self._send({"choices": [{
            "prompt_token_ids": body["prompt"], "token_ids": ids, "finish_reason": "length",
            "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-1.0] * len(ids)}}]})

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_that_ignores_seeds_is_refused(load_params: dict[str, Any]) -> None:
    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Seedless)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    client = start_worker("openai", args=endpoint_args(f"http://127.0.0.1:{stand_in.server_address[1]}"))
    try:
        with pytest.raises(WorkerError, match="does not honour request seeds"):
            client.call("load_model", load_params)
    finally:
        client.close()
        stand_in.shutdown()
