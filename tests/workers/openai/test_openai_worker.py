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
from invar.tasks import ModelTokenizer
from invar.transport import WorkerClient

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


TEMPERATURE_ROUNDING = 2e-6
"""How far a float64 rescaling of float32 temperature-1 log-probabilities and the engine's float32 log_softmax at T
may part near 0 nats: a few ulps of values below 16 nats (ulp 1.9e-6 there); measured up to 2.4e-7 on this model."""
ULPS_4 = 4 * 2.0**-23
"""The same, relative, for the unlikely tokens of a capture (-40 nats and below, ulp 3.8e-6): four ulps of the value;
measured up to one."""


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
    for s, r, it in zip(served, local, items, strict=True):
        assert s["item_id"] == r["item_id"]
        assert s["vocab_logprobs"].shape == r["vocab_logprobs"].shape
        if it["temperature"] == 1.0:  # the server's values and the engine's, unchanged on both sides
            assert s["logprobs"].tobytes() == r["logprobs"].tobytes()
            assert s["vocab_logprobs"].tobytes() == r["vocab_logprobs"].tobytes()
        else:
            # The endpoint brings the server's temperature-1 values to T in float64 (all a server gives); the
            # in-process worker has the engine compute them at T (docs/vllm.md): equal up to float32 rounding.
            for a, b in ((s["logprobs"], r["logprobs"]), (s["vocab_logprobs"], r["vocab_logprobs"])):
                np.testing.assert_allclose(a, b, rtol=ULPS_4, atol=TEMPERATURE_ROUNDING)


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


# -- prompts as text (prompt = text) -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_endpoint(vllm_server: VllmServer, load_params: dict[str, Any]) -> Iterator[WorkerClient]:
    client = start_worker("openai", args=endpoint_args(vllm_server.url, "--prompt", "text"))
    try:
        client.call("load_model", load_params)
        yield client
    finally:
        client.close()


def _same_outputs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["prompt_tokens"], y["prompt_tokens"])
        np.testing.assert_array_equal(x["tokens"], y["tokens"])
        assert x["logprobs"].tobytes() == y["logprobs"].tobytes()
        assert x["finish_reason"] == y["finish_reason"]


def test_text_prompts_run_the_cores_ids_and_give_the_same_bits(endpoint: WorkerClient, text_endpoint: WorkerClient,
                                                                vocab: ModelTokenizer) -> None:
    assert text_endpoint.identity.settings["prompt"] == "text"
    assert "prompt" not in endpoint.identity.settings  # the default is unstated: older packages keep their identity
    reqs = requests_for(vocab)
    _same_outputs(text_endpoint.call("generate", {"requests": reqs})["outputs"],
                  endpoint.call("generate", {"requests": reqs})["outputs"])
    items = [{"item_id": "0", "prompt_ids": reqs[0]["prompt_ids"], "response_tokens": np.array([11, 10], np.int64),
              "temperature": 1.0}]
    assert (text_endpoint.call("score", {"items": items})["outputs"][0]["logprobs"].tobytes()
            == endpoint.call("score", {"items": items})["outputs"][0]["logprobs"].tobytes())
    # Ids that no text gives (a prompt without the BOS a text prompt is encoded with): refused, not approximated.
    no_bos = {**reqs[0], "prompt_ids": reqs[0]["prompt_ids"][1:]}
    with pytest.raises(WorkerError, match="no text encodes to these ids"):
        text_endpoint.call("generate", {"requests": [no_bos]})
    assert endpoint.call("generate", {"requests": [no_bos]})["outputs"][0]["tokens"].size > 0  # ids are sent as is


class _TextOnly(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the real server that withholds token ids: it drops vLLM's return_token_ids and
    return_tokens_as_token_ids from each completion request, so the answers carry text only (the sampled text,
    each token's text piece), as a server without those extensions gives them. With `corrupt`, it also changes the
    sampled text's last piece, as a server whose text is not its tokens would."""

    upstream = ""
    corrupt = False

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))) if self.command == "POST" else None
        if body is not None:
            doc = json.loads(body)
            doc.pop("return_token_ids", None)
            doc.pop("return_tokens_as_token_ids", None)
            body = json.dumps(doc).encode()
        req = urllib.request.Request(self.upstream + self.path, data=body, method=self.command,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = resp.read()
        if self.command == "POST" and type(self).corrupt:
            doc = json.loads(data)
            choice = doc["choices"][0]
            choice["text"] = choice["text"][:-1] + ("1" if choice["text"][-1:] != "1" else "2")
            data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _forward
    do_POST = _forward

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_that_returns_text_only_is_re_tokenized_and_refused_unless_it_round_trips(
        vllm_server: VllmServer, endpoint: WorkerClient, load_params: dict[str, Any], vocab: ModelTokenizer) -> None:
    _TextOnly.upstream, _TextOnly.corrupt = vllm_server.url, False
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TextOnly)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    text_only = start_worker("openai", args=endpoint_args(url, "--prompt", "text"))
    ids_only = start_worker("openai", args=endpoint_args(url))
    try:
        text_only.call("load_model", load_params)  # its probes re-tokenized too
        reqs = [{**r, "top_logprobs": 2} for r in requests_for(vocab)]
        served = text_only.call("generate", {"requests": reqs})["outputs"]
        direct = endpoint.call("generate", {"requests": reqs})["outputs"]
        _same_outputs(served, direct)  # the same ids, recovered from text
        for s, d in zip(served, direct, strict=True):
            np.testing.assert_array_equal(s["top_ids"], d["top_ids"])
            assert s["top_logprobs"].tobytes() == d["top_logprobs"].tobytes()
        _TextOnly.corrupt = True
        with pytest.raises(WorkerError, match="does not round-trip"):
            text_only.call("generate", {"requests": reqs[:1]})
        _TextOnly.corrupt = False
        # A token-id package refuses a server that gives no ids: it cannot check what it ran.
        with pytest.raises(WorkerError, match="no token ids"):
            ids_only.call("load_model", load_params)
    finally:
        text_only.close()
        ids_only.close()
        proxy.shutdown()


# -- top-k log-probabilities -----------------------------------------------------------------------------------------


def test_top_k_log_probabilities_are_the_servers_and_other_engines_refuse_them(
        endpoint: WorkerClient, reference: WorkerClient, vocab: ModelTokenizer) -> None:
    k = 3
    reqs = [{**r, "top_logprobs": k} for r in requests_for(vocab)]
    served = endpoint.call("generate", {"requests": reqs})["outputs"]
    plain = endpoint.call("generate", {"requests": requests_for(vocab)})["outputs"]
    _same_outputs(served, plain)  # asking for the top k changes nothing else
    assert "top_ids" not in plain[0]  # absent unless asked
    assert "top_logprobs" not in plain[0]
    # The in-process engine's whole-vocabulary log-probabilities of the same sequences at T = 1, every step.
    items = [{"item_id": r["request_id"], "prompt_ids": r["prompt_ids"],
              "response_tokens": o["tokens"].astype(np.int64), "temperature": 1.0,
              "vocab_steps": list(range(o["tokens"].size))} for r, o in zip(reqs, served, strict=True)]
    whole = reference.call("score", {"items": items})["outputs"]
    for o, w in zip(served, whole, strict=True):
        n = o["tokens"].size
        assert o["top_ids"].shape == o["top_logprobs"].shape == (n, k)
        assert o["top_ids"].dtype == np.int32
        assert o["top_logprobs"].dtype == np.float32
        assert np.all(np.diff(o["top_logprobs"], axis=1) <= 0)  # most likely first
        for i in range(n):
            row = w["vocab_logprobs"][i]
            order = np.lexsort((np.arange(row.size), -row))[:k]
            np.testing.assert_array_equal(o["top_ids"][i], order)
            hit = np.flatnonzero(o["top_ids"][i] == o["tokens"][i])
            if hit.size:  # the sampled token among them: the same value as its own log-probability
                assert o["top_logprobs"][i, hit[0]] == o["logprobs"][i]
    with pytest.raises(WorkerError, match="does not report top-k"):
        reference.call("generate", {"requests": reqs})


# -- the declared log-probability mode ------------------------------------------------------------------------------


def test_a_declared_mode_the_real_server_does_not_have_is_refused(vllm_server: VllmServer,
                                                                   load_params: dict[str, Any]) -> None:
    client = start_worker("openai", args=endpoint_args(vllm_server.url, "--logprobs-mode", "processed_logprobs"))
    try:
        with pytest.raises(WorkerError, match="logprobs_mode is processed_logprobs but the server reports raw"):
            client.call("load_model", load_params)
    finally:
        client.close()


_LOGITS = np.full(18, -np.inf)
_LOGITS[4:14] = np.linspace(0.0, 2.0, 10)  # the digits: a spread distribution over ids 4..13


def _log_softmax(z: np.ndarray) -> np.ndarray:
    top = np.max(z)
    out: np.ndarray = z - (top + np.log(np.sum(np.exp(z - top))))
    return out


class _Modal(http.server.BaseHTTPRequestHandler):
    """A stand-in server over a fixed next-token distribution that honours seeds and reports log-probabilities raw
    (at T = 1) or processed (at the request's temperature), by `processed`."""

    processed = False

    def _send(self, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/version":
            self._send({"version": "0.0.0-modal"})
        else:
            self._send({"data": [{"id": SERVED, "root": "modal", "max_model_len": 128, "owned_by": "test"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        t = float(body["temperature"])
        drawn = _log_softmax(_LOGITS / t) if t > 0 else _log_softmax(_LOGITS)
        reported = drawn if type(self).processed else _log_softmax(_LOGITS)
        rng = np.random.default_rng(body["seed"])
        ids, top = [], []
        for _ in range(body["max_tokens"]):
            ids.append(int(np.argmax(drawn)) if t == 0 else int(rng.choice(18, p=np.exp(drawn))))
            best = np.argsort(-reported, kind="stable")[:body["logprobs"]]
            top.append({f"token_id:{int(i)}": float(reported[i]) for i in {*best.tolist(), ids[-1]}})
        self._send({"choices": [{
            "prompt_token_ids": body["prompt"], "token_ids": ids, "finish_reason": "length",
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [float(reported[i]) for i in ids],
                         "top_logprobs": top}}]})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("processed", [True, False])
def test_the_declared_mode_is_checked_against_what_the_server_reports(
        processed: bool, load_params: dict[str, Any], vocab: ModelTokenizer) -> None:
    _Modal.processed = processed
    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Modal)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{stand_in.server_address[1]}"
    declared_processed = start_worker("openai", args=endpoint_args(url, "--logprobs-mode", "processed_logprobs"))
    declared_raw = start_worker("openai", args=endpoint_args(url))
    try:
        right, wrong = (declared_processed, declared_raw) if processed else (declared_raw, declared_processed)
        right.call("load_model", load_params)
        found = "processed_logprobs" if processed else "raw_logprobs"
        with pytest.raises(WorkerError, match=f"but the server reports {found}"):
            wrong.call("load_model", load_params)
        if processed:  # a processed server is then used at any temperature, with its values at that temperature
            req = {**requests_for(vocab, temperature=0.5)[0], "top_logprobs": 1}
            out = right.call("generate", {"requests": [req]})["outputs"][0]
            expected = _log_softmax(_LOGITS / 0.5).astype(np.float32)[out["tokens"]]
            assert out["logprobs"].tobytes() == expected.tobytes()
    finally:
        declared_processed.close()
        declared_raw.close()
        stand_in.shutdown()
