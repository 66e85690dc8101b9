"""The endpoint worker: an OpenAI-compatible HTTP server (vLLM's `vllm serve`, and servers that speak its
completions API) as an inference engine.

    python -m invar.workers.openai_worker --role inference --base-url URL --served-model ID
        [--api-key-env NAME] [--logprobs-mode raw_logprobs|processed_logprobs] [--prompt ids|text] [--max-in-flight N]
        [--request-timeout S] [--retries N]

Decisions this worker embodies:

- **The deployment is the engine.** The question is whether a served endpoint may replace the trusted
  implementation, so this worker computes nothing itself: every token and log-probability is the server's. What the
  worker can check it checks (the local model folder's digest, the server's own report of its version and served
  model, that it ran the core's prompt ids, that a seeded request repeats); what it cannot (that the server runs
  the weights of that folder, with the launch options the package states) is a premise the contract declares.
- **Identity.** The base URL, the served model id, the declared log-probability mode and what the server reports of
  itself (`/version`; `/v1/models`: the model's id, root and maximum length) are the worker's settings. They are
  read once before the handshake and again before every call: a server that changed under a run (restarted with
  another version or model) is refused, not used. An API key is read from the environment variable the package
  names and is never recorded.
- **Prompts are token ids** (the core's tokenization), sent as the completions API's token-id prompt; the server's
  `prompt_token_ids` must equal them. Sampled tokens come back as ids (`return_token_ids`), checked against the
  `token_id:N` labels of their log-probabilities. For a server that takes no token-id prompts (`--prompt text`)
  the worker sends the text the model folder's tokenizer (the core's) encodes back to exactly those ids, and
  refuses ids no text gives; a text-only answer is re-tokenized and refused unless it round-trips.
- **Top-k** log-probabilities are served where a request asks `top_logprobs` (vLLM's `logprobs: k`).
- **Log-probabilities as the server computes them.** vLLM's server reports them at temperature 1
  (`raw_logprobs`) unless it was started with `--logprobs-mode processed_logprobs`, which the package must declare
  (`logprobs_mode`) and `load_model` checks: the most likely first token's log-probability is the same at T = 1
  and T = 0.5 under raw, and not under processed. Under `raw_logprobs` a request at a temperature other than 0 or
  1 is refused: its reported values would not be the probabilities the token was drawn with. top_p < 1 is refused
  (a processed value is renormalized over the nucleus).
- **Seeds.** Each request carries its seed. At `load_model` one seeded probe runs twice and must repeat, and
  within a call two identical seeded requests must agree: a server that ignores seeds is refused, not trusted.
- **Layouts.** A batch of the call's layout is sent as its requests in flight at once (one HTTP request each, at
  most `--max-in-flight` together); batches run one after another, in the declared order. The client cannot see
  how the server schedules them: what the records state is which requests were in flight together.
- **Teacher-forced scoring** sends prompt + response as one token-id prompt with `prompt_logprobs` (and one token
  to generate, as vLLM needs). At temperature 1 without capture steps the server is asked for the scored tokens
  only; otherwise for the whole vocabulary (the server must allow it: `--max-logprobs -1`), rescaled to T by the
  worker exactly as the vLLM worker does.
- **llama.cpp's server** (llama-cpp-python's `python -m llama_cpp.server`) has no /version; it is recognised by its
  OpenAPI title and named as `kind` in the server's identity. Its requests undo llama.cpp's sampler defaults
  (top-k 40, min-p, repetition penalty). It takes text prompts only, and it recomputes just the last token of a
  prompt it has just run (its prompt cache), so its seed probe sends each probe right after another prompt and
  then again: measured, the repeat comes back different, and the server is refused at `load_model` in one line
  (docs/endpoints.md); it reports no context size either.
- **Failures.** A refused connection, a timeout, HTTP 5xx or 429 is retried up to `--retries` times with
  exponential backoff, each attempt logged on stderr and counted in the output (`attempts`); a 4xx is the server
  refusing the request and is not retried. What cannot be answered is a `MethodError`: the core records the
  failure, and a resumed run sends the call again when the server is back.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from invar import __version__
from invar.errors import ContractError
from invar.formats.tokenizer import ModelTokenizer
from invar.protocol import MethodError, Role, Server, exit_worker
from invar.protocol.methods import GENERATE, LOAD_MODEL, SCORE, serves
from invar.protocol.payloads import (
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
    GenerateResult,
    LoadModelParams,
    LoadModelResult,
    ScoreOutput,
    ScoreParams,
    ScoreResult,
)
from invar.workers.common import (
    at_temperature,
    check_prompt_ids,
    check_tokens,
    response_end_ids,
    verify_dir,
)

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
PROMPT_FORMS = ("ids", "text")
MODE_PROBE_TEMPERATURE = 0.5
"""The second temperature of the log-probability mode probe: far enough from 1 that a processed value moves."""
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses that say "not now" (timeout, rate limit, server error): retried. Any other 4xx is a refusal."""
BACKOFF_CAP_S = 8.0


LLAMACPP_KIND = "llama-cpp-python"
"""llama-cpp-python's server (`python -m llama_cpp.server`), recognised by its OpenAPI title; vLLM's has /version."""
LLAMACPP_SAMPLING = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                     "frequency_penalty": 0.0}
"""llama.cpp's sampler defaults a request must undo (top-k 40, min-p 0.05, repetition penalty 1.1): with them a
token is drawn from a truncated, penalized distribution while its reported log-probability is the full one's."""


HISTORY_PROBE_TEXT = "Once upon a time, in a village by the sea, there lived"
HISTORY_PROBE_CHAT = "Write a long poem about the sea."
"""The seed probes for llama-cpp-python's server, a plain prompt and a chat (one that does not end within the
probe's 8 tokens): long enough that a repeat can reuse a cached prefix."""


class EndpointError(Exception):
    """The server could not be reached or refused: the message says which URL and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status of a refusal; None when the server was not reached or answered no JSON."""


@dataclass(frozen=True)
class Settings:
    base_url: str
    served_model: str
    api_key_env: str | None
    logprobs_mode: str
    prompt_form: str
    max_in_flight: int
    request_timeout: float
    retries: int


def _first_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + "…"


class Endpoint:
    """HTTP calls to one server, with bounded retries."""

    def __init__(self, settings: Settings, api_key: str | None) -> None:
        self.settings = settings
        self.api_key = api_key

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.settings.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key is not None:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(req, timeout=self.settings.request_timeout) as resp:
            return json.loads(resp.read())

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
             label: str = "") -> tuple[Any, int]:
        """The decoded JSON answer and the number of attempts it took; `EndpointError` once retries are spent or
        the server refused."""
        url = self.settings.base_url + path
        attempts = self.settings.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, path, body), attempt
            except urllib.error.HTTPError as exc:
                detail = _first_line(exc.read().decode("utf-8", "replace"))
                why = f"HTTP {exc.code}: {detail}"
                if exc.code not in RETRY_STATUS:
                    raise EndpointError(f"{url} refused {label or 'the request'} ({why})", exc.code) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                why = _first_line(str(reason) or type(exc).__name__)
            except json.JSONDecodeError:
                raise EndpointError(f"{url} answered {label or 'the request'} with something that is not JSON; "
                                    "is --base-url an OpenAI-compatible API (ending in /v1's parent)?") from None
            print(f"invar.workers.openai_worker: attempt {attempt}/{attempts} of {label or path} failed: {why}",
                  file=sys.stderr, flush=True)
            if attempt < attempts:
                time.sleep(min(BACKOFF_CAP_S, 0.5 * 2 ** (attempt - 1)))
        raise EndpointError(f"{url}: {label or 'the request'} failed {attempts} times (last: {why}); check that the "
                            "server is running, then run the command again (a use run resumes)")


def server_identity(endpoint: Endpoint) -> dict[str, Any]:
    """What the server reports of itself: its version and the served model (the parts that do not change between
    requests; `created` and permission ids do). llama-cpp-python's server has no /version: it is recognised by its
    OpenAPI title, which carries its version, and named as `kind` (vLLM's identity has no `kind`, as before)."""
    kind = None
    try:
        version, _ = endpoint.call("GET", "/version", label="GET /version")
    except EndpointError as exc:
        if exc.status != 404:
            raise
        try:
            api, _ = endpoint.call("GET", "/openapi.json", label="GET /openapi.json")
        except EndpointError:
            raise exc from None
        info = api.get("info") if isinstance(api, dict) else None
        if not isinstance(info, dict) or "llama.cpp" not in str(info.get("title")):
            raise exc from None
        kind, version = LLAMACPP_KIND, {"version": info.get("version")}
    models, _ = endpoint.call("GET", "/v1/models", label="GET /v1/models")
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list):
        raise EndpointError(f"{endpoint.settings.base_url}/v1/models: no model list in the answer")
    served = endpoint.settings.served_model
    match = [m for m in entries if isinstance(m, dict) and m.get("id") == served]
    if not match:
        ids = sorted(str(m.get("id")) for m in entries if isinstance(m, dict))
        raise EndpointError(f"{endpoint.settings.base_url} serves no model {served!r} (it serves: "
                            f"{', '.join(ids) or 'none'}); set served_model to one of these")
    m = match[0]
    return {**({} if kind is None else {"kind": kind}),
            "version": version.get("version") if isinstance(version, dict) else None,
            "model": {k: m.get(k) for k in ("id", "root", "max_model_len", "owned_by")}}


def _logprob(v: Any) -> bool:
    """A log-probability as the protocol takes it: a finite number ≤ 0."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v <= 0


def _token_id(label: Any, where: str) -> int:
    if not isinstance(label, str) or not label.startswith("token_id:"):
        raise MethodError(f"{where}: the server labelled a token {label!r}, not 'token_id:N'; it must honour "
                          "return_tokens_as_token_ids (vLLM's server does)")
    return int(label.removeprefix("token_id:"))


@dataclass
class Loaded:
    model_dir: str
    model_digest: str
    vocab_size: int
    eos_ids: frozenset[int]
    max_model_len: int
    tokenizer: ModelTokenizer | None
    """The model folder's tokenizer (the core's), for a server that takes text prompts; None for token-id ones."""


class Engine:
    def __init__(self, settings: Settings, endpoint: Endpoint, identity: dict[str, Any]) -> None:
        self.settings = settings
        self.endpoint = endpoint
        self.identity = identity
        self.llamacpp = identity.get("kind") == LLAMACPP_KIND
        self.m: Loaded | None = None

    def loaded(self, where: str) -> Loaded:
        if self.m is None:
            raise MethodError(f"{where}: no model is loaded; call load_model first")
        return self.m

    def _same_server(self, where: str) -> None:
        try:
            now = server_identity(self.endpoint)
        except EndpointError as exc:
            raise MethodError(f"{where}: {exc}") from None
        if now != self.identity:
            raise MethodError(f"{where}: the server changed under this worker (it reported {self.identity}, now "
                              f"{now}); records of two servers are not one package's: start a new run for the new "
                              "server")

    def _post(self, body: dict[str, Any], label: str) -> tuple[dict[str, Any], int]:
        try:
            answer, attempts = self.endpoint.call("POST", "/v1/completions", body, label=label)
        except EndpointError as exc:
            raise MethodError(str(exc)) from None
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise MethodError(f"{label}: the server's answer holds no single choice")
        return choices[0], attempts

    # -- loading ----------------------------------------------------------------------------------------------

    def load_model(self, params: LoadModelParams) -> LoadModelResult:
        req = params.require(("float32", "bfloat16"), ("none",))
        if req.adapter is not None:
            raise MethodError("load_model.adapter: an endpoint serves the adapters it was started with; this worker "
                              "does not load adapters (name the served adapter as served_model instead)")
        digest = verify_dir(req.model_dir, req.model_digest, "model")
        if self.m is not None and self.m.model_digest != digest:
            raise MethodError(f"load_model: this worker already names model {self.m.model_digest[:16]}…; start a new "
                              "worker for another model")
        config_path = os.path.join(req.model_dir, "config.json")
        try:
            with open(config_path, encoding="utf-8") as f:
                vocab_size = int(json.load(f)["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError):
            raise MethodError(f"load_model: {config_path} names no vocab_size; pass the model folder the server "
                              "was started from") from None
        self._same_server("load_model")
        max_len = self.identity["model"].get("max_model_len")
        if self.llamacpp:
            max_len = self._llamacpp_probe_len(req.model_dir)
        if not isinstance(max_len, int) or max_len < 2:
            raise MethodError("load_model: the server reports no max_model_len for the served model")
        tokenizer = ModelTokenizer.from_model_dir(req.model_dir) if self.settings.prompt_form == "text" else None
        self.m = Loaded(req.model_dir, digest, vocab_size, response_end_ids(req.model_dir), max_len, tokenizer)
        self._check_seeds()
        self._check_logprobs_mode()
        if self.llamacpp:
            self.m = None
            raise MethodError("load_model: llama-cpp-python's server reports no context size (its --n_ctx), so no "
                              "request can be checked to fit before it is sent, and it shortens max_tokens silently "
                              "to what fits; it is refused")
        return LoadModelResult(digest, None, vocab_size, min(self.m.eos_ids), max_len)

    def _llamacpp_probe_len(self, model_dir: str) -> int:
        """For llama-cpp-python's server, which reports no context size: the model's own maximum length (its
        config.json), used only by the load probes' short requests; `load_model` refuses the server after them."""
        if self.settings.prompt_form != "text":
            raise MethodError("load_model: llama-cpp-python's server takes text prompts only (a token-id prompt is "
                              "answered with HTTP 500, a validation error); declare prompt = text")
        try:
            with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
                return int(json.load(f)["max_position_embeddings"])
        except (OSError, ValueError, KeyError, TypeError):
            raise MethodError(f"load_model: {model_dir}/config.json names no max_position_embeddings") from None

    def _check_seeds(self) -> None:
        """A seeded request sent twice must come back the same: a server that ignores seeds, or whose numbers depend
        on the request before, is refused here."""
        m = self.loaded("load_model")
        probes = [self._probe_ids(min(m.eos_ids))]
        if self.llamacpp and m.tokenizer is not None:
            # Prompts of many tokens, a chat among them: llama-cpp-python's server recomputes a one-token prompt in
            # full every time, and reuses the previous request's cache over a longer common prefix.
            probes = [m.tokenizer.encode(HISTORY_PROBE_TEXT, add_special_tokens=True)]
            if m.tokenizer.chat_template is not None:
                probes.append(m.tokenizer.prompt_ids(messages=[{"role": "user", "content": HISTORY_PROBE_CHAT}]))
        for k, ids in enumerate(probes):
            probe = GenerateRequest("seed-probe", ids, seed=20261201, temperature=1.0, top_p=1.0,
                                    max_tokens=min(8, m.max_model_len - len(ids)))
            if len(probes) > 1:
                # another prompt first, so the probe's first run does not find itself in the server's prompt cache
                other = probes[(k + 1) % len(probes)]
                self._generate_one(GenerateRequest("seed-probe-other", other, seed=1, temperature=0.0, top_p=1.0,
                                                   max_tokens=1), "load_model seed probe")
            first = self._generate_one(probe, "load_model seed probe")
            second = self._generate_one(probe, "load_model seed probe")
            same = np.array_equal(first.tokens, second.tokens) and np.array_equal(first.logprobs, second.logprobs)
            if not same and self.llamacpp:
                raise MethodError("load_model: the same seeded request sent twice came back different: llama-cpp-"
                                  "python's server recomputes only the last token of a prompt it has just run (its "
                                  "prompt cache), which rounds otherwise than the whole prompt's computation, so a "
                                  "request's numbers depend on the request before it; this server is refused")
            if not (np.array_equal(first.tokens, second.tokens) and np.array_equal(first.logprobs, second.logprobs)):
                raise MethodError("load_model: the same seeded request sent twice came back different; the server "
                                  "does not honour request seeds, so its samples cannot be paired (start it with a "
                                  "seed-honouring configuration)")

    def _check_logprobs_mode(self) -> None:
        """The declared `logprobs_mode` must be what the server does: the same seeded one-token request at T = 1
        and at T = 0.5 names the same most likely first token (a temperature keeps the order); its raw log-
        probability is the same at both, its processed one is not (unless the token is certain, which tells
        nothing: then the next probe prompt is tried)."""
        m = self.loaded("load_model")
        for token in sorted({min(m.eos_ids), m.vocab_size // 2, m.vocab_size - 1}):
            top: list[tuple[int, float]] = []
            for t in (1.0, MODE_PROBE_TEMPERATURE):
                probe = GenerateRequest("mode-probe", self._probe_ids(token), seed=20261202, temperature=t,
                                        top_p=1.0, max_tokens=1, top_logprobs=1)
                out = self._generate_one(probe, "load_model log-probability mode probe")
                if out.top_ids is None or out.top_logprobs is None:  # asked, so `_generate_one` filled them
                    raise MethodError("load_model: the log-probability mode probe got no top log-probabilities")
                top.append((int(out.top_ids[0, 0]), float(out.top_logprobs[0, 0])))
            (id1, lp1), (id2, lp2) = top
            if id1 != id2:
                raise MethodError(f"load_model: the most likely first token of the same prompt differs between "
                                  f"temperature 1 ({id1}) and {MODE_PROBE_TEMPERATURE:g} ({id2}); the server's top "
                                  "log-probabilities cannot be trusted")
            if lp1 == 0.0 and lp2 == 0.0:
                continue  # a certain token: both modes report 0
            processed = lp1 != lp2
            if processed != (self.settings.logprobs_mode == "processed_logprobs"):
                found = "processed_logprobs" if processed else "raw_logprobs"
                raise MethodError(f"load_model: logprobs_mode is {self.settings.logprobs_mode} but the server reports "
                                  f"{found} (the same token's log-probability is {lp1!r} at temperature 1 and "
                                  f"{lp2!r} at {MODE_PROBE_TEMPERATURE:g}); declare logprobs_mode = {found}, or "
                                  "start the server with the mode declared")
            return
        # Every probe token certain: the probe cannot tell the modes apart, and the declared one stays a premise.

    # -- calls ------------------------------------------------------------------------------------------------

    def _check_request(self, req: GenerateRequest, where: str) -> None:
        m = self.loaded(where)
        check_prompt_ids(list(req.prompt_ids), m.vocab_size, where)
        if req.top_p != 1.0 and req.temperature > 0:
            raise MethodError(f"{where}.top_p: the server's log-probabilities after top-p are renormalized over the "
                              "nucleus (or taken before it, by mode), not what the protocol reports; send top_p 1.0")
        if self.settings.logprobs_mode == "raw_logprobs" and req.temperature not in (0.0, 1.0):
            raise MethodError(f"{where}.temperature: {req.temperature:g}: this server reports log-probabilities at "
                              "temperature 1 (logprobs_mode raw_logprobs), not the ones a token was drawn with at "
                              f"{req.temperature:g}; sample at 0 or 1, or start the server with --logprobs-mode "
                              "processed_logprobs and declare logprobs_mode = processed_logprobs")
        if len(req.prompt_ids) + req.max_tokens > m.max_model_len:
            raise MethodError(f"{where}: {len(req.prompt_ids)} prompt tokens + max_tokens {req.max_tokens} exceed the "
                              f"served model's maximum length {m.max_model_len}; shorten the prompt or lower "
                              "max_tokens")

    def _prompt(self, ids: list[int], label: str) -> list[int] | str:
        """What the request's `prompt` carries: the ids themselves, or (`prompt = text`) the text the model folder's
        tokenizer gives back exactly these ids when it encodes a text prompt as a server does (with the special
        tokens its post-processor adds, e.g. BOS). Ids no text gives are refused, never sent approximately."""
        m = self.loaded(label)
        if m.tokenizer is None:
            return ids
        tok = m.tokenizer
        added = tok.encode("", add_special_tokens=True)  # what encoding a text prompt puts around it (e.g. [BOS])
        candidates = [ids[len(added):]] if added and ids[:len(added)] == added else []
        for body in (*candidates, ids):
            text = tok.decode(body, stop_at_eos=False)
            try:
                if tok.encode(text, add_special_tokens=True) == ids:
                    return text
            except ContractError:
                pass
        raise MethodError(f"{label}.prompt_ids: no text encodes to these ids under the model's tokenizer (as a "
                          "server tokenizes a text prompt), so a text-prompt server cannot be sent them; send a "
                          "prompt the core tokenized as text, or use a server that takes token-id prompts (prompt = "
                          "ids)")

    def _probe_ids(self, token: int) -> list[int]:
        """A probe prompt made of `token`: itself, or for a text-prompt server the ids its text encodes to."""
        m = self.loaded("load_model")
        if m.tokenizer is None:
            return [token]
        return m.tokenizer.encode(m.tokenizer.decode([token], stop_at_eos=False), add_special_tokens=True)

    def _sampled_ids(self, choice: dict[str, Any], labels: list[Any], label: str) -> list[int]:
        """The sampled tokens as ids: the server's own (`token_ids`, checked against the `token_id:N` labels of
        their log-probabilities), or for a text-prompt server that returns text only, its text re-tokenized with
        the model's tokenizer and refused unless it round-trips: each token's label must be the text of one id,
        and those ids must encode the whole text back."""
        m = self.loaded(label)
        ids = choice.get("token_ids")
        if ids is not None or m.tokenizer is None:
            if not isinstance(ids, list):
                raise MethodError(f"{label}: the server returned no token ids; it must honour return_token_ids "
                                  "(or declare prompt = text for a server that returns text)")
            if [_token_id(t, label) for t in labels] != ids:
                raise MethodError(f"{label}: the server's token ids and its log-probability labels disagree")
            return ids
        tok = m.tokenizer
        text = choice.get("text")
        if not isinstance(text, str) or not all(isinstance(t, str) for t in labels):
            raise MethodError(f"{label}: the server returned neither token ids nor the sampled text and its pieces")
        joined = "".join(labels)
        if joined != text and choice.get("finish_reason") == "stop" and labels and joined == text + labels[-1]:
            text = joined  # the text leaves out the stop token's own text (vLLM's and OpenAI's convention)
        try:
            ids = tok.encode(text, add_special_tokens=False)
            pieces = [tok.decode([t], stop_at_eos=False) for t in ids]
        except ContractError as exc:
            raise MethodError(f"{label}: the server's text does not re-tokenize: {exc}") from None
        if pieces != labels or joined != text:
            raise MethodError(f"{label}: the server's sampled text does not round-trip to the tokens it reported "
                              f"({len(labels)} pieces, re-tokenized as {len(ids)}); its tokens cannot be known as "
                              "ids, so they are refused rather than guessed")
        return ids

    def _generate_one(self, req: GenerateRequest, label: str) -> GenerateOutput:
        """One request's output, with the number of requests to the server it took (`attempts`)."""
        m = self.loaded(label)
        body = {"model": self.settings.served_model, "prompt": self._prompt(list(req.prompt_ids), label),
                "max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": 1.0, "seed": req.seed,
                "logprobs": req.top_logprobs or 0, "return_tokens_as_token_ids": True, "return_token_ids": True,
                "stop_token_ids": sorted(m.eos_ids), "ignore_eos": True, "skip_special_tokens": False,
                **(LLAMACPP_SAMPLING if self.llamacpp else {})}
        choice, attempts = self._post(body, label)
        ran = choice.get("prompt_token_ids")
        if ran is None and m.tokenizer is None:
            raise MethodError(f"{label}: the server returned no token ids for the prompt; it must honour "
                              "return_token_ids (or declare prompt = text for a server that returns text only)")
        if ran != list(req.prompt_ids) and not (ran is None and m.tokenizer is not None):
            # A text-prompt server that does not say what it ran is left with the worker's own round trip
            raise MethodError(f"{label}: the server ran other prompt tokens than the ids sent (it must accept a "
                              "token-id prompt as given, or tokenize the text prompt back to them)")
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            raise MethodError(f"{label}: the server returned no log-probabilities; it must honour logprobs")
        labels, values = lp.get("tokens"), lp.get("token_logprobs")
        if not isinstance(labels, list) or not isinstance(values, list) or len(labels) != len(values):
            raise MethodError(f"{label}: the server's log-probabilities do not cover each sampled token once")
        ids = self._sampled_ids(choice, labels, label)
        if len(ids) != len(values):
            raise MethodError(f"{label}: the server's log-probabilities do not cover each sampled token once")
        if not all(_logprob(v) for v in values):
            raise MethodError(f"{label}: the server reported a log-probability that is missing, not finite or "
                              "above 0; it cannot be used as the probability a token was drawn with")
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise MethodError(f"{label}: the server finished with {finish!r}, not stop or length")
        tokens = np.asarray(ids, dtype=np.int32)
        if finish == "stop" and (not ids or ids[-1] not in m.eos_ids):
            raise MethodError(f"{label}: the server stopped on something other than the model's end ids "
                              f"{sorted(m.eos_ids)}")
        top_ids = top_lps = None
        if req.top_logprobs:
            top_ids, top_lps = self._top(lp.get("top_logprobs"), len(ids), req.top_logprobs, label)
        return GenerateOutput(req.request_id, np.asarray(req.prompt_ids, dtype=np.int32), tokens,
                              np.asarray(values, dtype=np.float32), finish, attempts=attempts, top_ids=top_ids,
                              top_logprobs=top_lps)

    def _top(self, rows: Any, n: int, k: int, label: str) -> tuple[np.ndarray, np.ndarray]:
        """The k most likely tokens at each of n positions, [n, k] int32 ids and [n, k] float32 log-probabilities,
        most likely first (ties by id). vLLM lists the top k and the sampled token when it is not among them."""
        m = self.loaded(label)
        if not isinstance(rows, list) or len(rows) != n or not all(isinstance(r, dict) for r in rows):
            raise MethodError(f"{label}: the server returned no top log-probabilities for each sampled token; it "
                              "must honour logprobs = k")
        ids = np.zeros((n, k), dtype=np.int32)
        values = np.zeros((n, k), dtype=np.float32)
        for i, row in enumerate(rows):
            entries = sorted(((float(v), self._top_id(t, m, label)) for t, v in row.items() if _logprob(v)),
                             key=lambda e: (-e[0], e[1]))
            if len(entries) < k or len(entries) != len(row):
                raise MethodError(f"{label}: the server's top log-probabilities at position {i} hold "
                                  f"{len(entries)} usable entries, fewer than the {k} asked")
            ids[i] = [t for _, t in entries[:k]]
            values[i] = [v for v, _ in entries[:k]]
        return ids, values

    @staticmethod
    def _top_id(label_: Any, m: Loaded, where: str) -> int:
        if m.tokenizer is None or (isinstance(label_, str) and label_.startswith("token_id:")):
            return _token_id(label_, where)
        # a text-only server labels its top tokens by their text: one id's text, or refused
        try:
            ids = m.tokenizer.encode(str(label_), add_special_tokens=False)
        except ContractError:
            ids = []
        if len(ids) != 1 or m.tokenizer.decode(ids, stop_at_eos=False) != label_:
            raise MethodError(f"{where}: the server labelled a top token {label_!r}, which is not the text of one "
                              "token id")
        return ids[0]

    def generate(self, call: GenerateParams) -> GenerateResult:
        m = self.loaded("generate")
        requests = call.requests
        if call.adapter not in (None, "base") or call.reference_adapter is not None:
            raise MethodError("generate.adapter: an endpoint serves the model it was started with; send no adapter")
        for i, req in enumerate(requests):
            self._check_request(req, f"generate.requests[{i}]")
        self._same_server("generate")
        outputs: dict[int, GenerateOutput] = {}
        for batch in call.batches:
            # One batch: its requests in flight together, as far as a client can make them so.
            with ThreadPoolExecutor(max_workers=min(len(batch), self.settings.max_in_flight)) as pool:
                answers = list(pool.map(lambda i: self._generate_one(requests[i], f"generate.requests[{i}]"),
                                        batch))
            for i, out in zip(batch, answers, strict=True):
                outputs[i] = out
        seen: dict[tuple[Any, ...], int] = {}
        for i, req in enumerate(requests):
            key = (tuple(req.prompt_ids), req.seed, req.temperature, req.max_tokens, req.top_logprobs)
            j = seen.setdefault(key, i)
            if j != i and not (np.array_equal(outputs[i].tokens, outputs[j].tokens)
                               and np.array_equal(outputs[i].logprobs, outputs[j].logprobs)):
                raise MethodError(f"generate: requests {requests[j].request_id!r} and {req.request_id!r} are the same "
                                  "seeded request and came back different; the server does not honour request seeds")
        self._same_server("generate")
        return GenerateResult([outputs[i] for i in range(len(requests))], m.model_digest, None,
                              packed=call.packed)

    def score(self, call: ScoreParams) -> ScoreResult:
        m = self.loaded("score")
        items = call.items
        if call.adapter not in (None, "base"):
            raise MethodError("score.adapter: an endpoint serves the model it was started with; send no adapter")
        for i, it in enumerate(items):
            where = f"score.items[{i}]"
            check_tokens(it.tokens, m.vocab_size, f"{where}.response_tokens")
            check_prompt_ids(list(it.prompt_ids), m.vocab_size, where)
            if len(it.prompt_ids) + it.tokens.size + 1 > m.max_model_len:
                raise MethodError(f"{where}: {len(it.prompt_ids)} prompt tokens + {it.tokens.size} response "
                                  f"tokens leave no room in the served model's maximum length {m.max_model_len} "
                                  "(the server scores a sequence only with one position to spare)")
        self._same_server("score")
        outputs = []
        for i, it in enumerate(items):
            label = f"score.items[{i}]"
            whole = it.temperature != 1.0 or bool(it.vocab_steps)
            tokens = it.tokens
            ids = list(it.prompt_ids) + [int(t) for t in tokens]
            body = {"model": self.settings.served_model, "prompt": self._prompt(ids, label), "max_tokens": 1,
                    "temperature": 0.0, "prompt_logprobs": -1 if whole else 0, "return_tokens_as_token_ids": True,
                    "return_token_ids": True}
            choice, _ = self._post(body, label)
            if choice.get("prompt_token_ids") != ids:
                raise MethodError(f"{label}: the server scored other tokens than the ids sent")
            rows = choice.get("prompt_logprobs")
            if not isinstance(rows, list) or len(rows) != len(ids):
                raise MethodError(f"{label}: the server returned no prompt log-probabilities (it must support "
                                  "prompt_logprobs, as vLLM's server does)")
            rows = rows[len(it.prompt_ids):]
            if whole:
                full = np.full((len(rows), m.vocab_size), np.nan, dtype=np.float32)
                for r, row in enumerate(rows):
                    for key, v in (row or {}).items():
                        full[r, int(key.removeprefix("token_id:"))] = v["logprob"]
                if np.isnan(full).any():
                    raise MethodError(f"{label}: the server returned fewer than the whole vocabulary's log-"
                                      "probabilities; start it with --max-logprobs -1 to score at T != 1 or capture "
                                      "steps")
                scaled = at_temperature(full, it.temperature)
                lps = scaled[np.arange(tokens.size), tokens]
                vocab = scaled[list(it.vocab_steps)] if it.vocab_steps else np.zeros((0, m.vocab_size), np.float32)
            else:
                values = []
                for row, t in zip(rows, tokens, strict=True):
                    entry = (row or {}).get(str(int(t))) or (row or {}).get(f"token_id:{int(t)}")
                    if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
                        raise MethodError(f"{label}: the server's prompt log-probabilities miss a scored token")
                    values.append(entry["logprob"])
                lps = np.asarray(values, dtype=np.float32)
                vocab = np.zeros((0, m.vocab_size), dtype=np.float32)
            outputs.append(ScoreOutput(it.item_id, lps, vocab))
        return ScoreResult(outputs, m.model_digest, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar.workers.openai_worker")
    parser.add_argument("--role", choices=[r.value for r in Role], default=Role.INFERENCE.value)
    parser.add_argument("--base-url", required=True, help="the server's root, e.g. http://127.0.0.1:8000")
    parser.add_argument("--served-model", required=True, help="the model id the server serves it under")
    parser.add_argument("--api-key-env", default=None, help="the environment variable holding the API key")
    parser.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="raw_logprobs",
                        help="how the server computes sampled log-probabilities (vLLM's --logprobs-mode)")
    parser.add_argument("--prompt", choices=PROMPT_FORMS, default="ids",
                        help="send prompts as the core's token ids, or as the text they encode (servers that take no "
                             "token-id prompts)")
    parser.add_argument("--max-in-flight", type=int, default=64, help="HTTP requests in flight at once")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds per HTTP attempt")
    parser.add_argument("--retries", type=int, default=4, help="further attempts after a failed one")
    args = parser.parse_args(argv)
    me = "invar.workers.openai_worker"
    if args.role != Role.INFERENCE.value:
        print(f"{me}: an endpoint serves as an inference engine only; start the learner with the hf or mlx worker",
              file=sys.stderr, flush=True)
        return 2
    base = args.base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if not base.startswith(("http://", "https://")):
        print(f"{me}: --base-url {args.base_url!r} is not an http(s) URL", file=sys.stderr, flush=True)
        return 2
    if args.max_in_flight < 1 or args.retries < 0 or not (math.isfinite(args.request_timeout)
                                                           and args.request_timeout > 0):
        print(f"{me}: --max-in-flight must be ≥ 1, --retries ≥ 0, --request-timeout a positive number of seconds",
              file=sys.stderr, flush=True)
        return 2
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(f"{me}: the environment variable {args.api_key_env} (api_key_env) is not set; export the API key "
                  "in it", file=sys.stderr, flush=True)
            return 2
    settings = Settings(base, args.served_model, args.api_key_env, args.logprobs_mode, args.prompt, args.max_in_flight,
                        args.request_timeout, args.retries)
    endpoint = Endpoint(settings, api_key)
    try:
        identity = server_identity(endpoint)
    except EndpointError as exc:
        print(f"{me}: {exc}", file=sys.stderr, flush=True)
        return 2
    engine = Engine(settings, endpoint, identity)
    server = Server(
        engine="openai",
        engine_version={"invar": __version__, "server": str(identity["version"])},
        role=Role.INFERENCE,
        # Unset values are left out, not null (a TOML declaration cannot state null); the key itself never is.
        settings={"base_url": base, "served_model": settings.served_model,
                  **({} if settings.api_key_env is None else {"api_key_env": settings.api_key_env}),
                  "logprobs_mode": settings.logprobs_mode,
                  # token-id prompts are the default and stay unstated, so packages that predate the setting keep
                  # their identity
                  **({} if settings.prompt_form == "ids" else {"prompt": settings.prompt_form}),
                  "max_in_flight": settings.max_in_flight,
                  "request_timeout": settings.request_timeout, "retries": settings.retries,
                  "top_p": "1 only", "server": identity},
        methods={LOAD_MODEL.name: serves(LOAD_MODEL, engine.load_model),
                 GENERATE.name: serves(GENERATE, engine.generate,
                                       read=lambda params: GenerateParams.from_wire(params, top_logprobs=True)),
                 SCORE.name: serves(SCORE, engine.score)},
    )
    return server.serve()


if __name__ == "__main__":
    exit_worker(main())
