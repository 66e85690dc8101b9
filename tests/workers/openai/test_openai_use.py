"""A use decision about a deployment: may the served endpoint replace the in-process vLLM engine of the same
build? Decided end to end from the README's commands (`use package`, `use prepare`, `use run`, `use admit`) on the
shipped model, with requests one at a time and 16 in flight as invariance layouts, and recomputed from the records.

The endpoint going away mid-run is a proxy in front of the real server that stops listening (the client sees
exactly what a killed server gives it: connection refused) and comes back on the same address: the run fails in
one line keeping its records, and the same command resumes it to the same decision.

The command lines run one after another in one process (`cli`, tests/support/cli_batch.py), each as `python -m
invar.cli` runs it, its workers started as a user's command starts them: what is killed here is the server, never the
command, so no claim needs a process of its own.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai_server import SERVED, VllmServer, restart_server, stop_server
from support.cli_batch import InvarSession

from invar import canonical
from invar.contract.admit import admit
from invar.engines import DEFAULT_MODEL
from invar.errors import RecordError
from invar.records import RunStore

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout these tests belong to
POPULATION = REPO_ROOT / "data" / "arith-eval.jsonl"
UNITS = 32

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    with InvarSession(bound_s=900) as session:
        yield session


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


_PACKAGES: dict[tuple[str, ...], dict[str, Any]] = {}
"""`use package`'s answers by its arguments: each worker's identity is probed once per module (the two declarations
name the same packages), not once per declaration."""


def package(cli: InvarSession, engine: str, *settings: str) -> dict[str, Any]:
    """What `invar use package` says the package must state, plus the model it runs."""
    args = ("use", "package", engine, *(a for s in settings for a in ("--setting", s)), "--json")
    if args not in _PACKAGES:
        out = cli.run(*args)
        assert out.returncode == 0, out.stderr
        _PACKAGES[args] = json.loads(out.stdout)
    pkg = _PACKAGES[args]
    return {**{k: pkg[k] for k in ("engine", "engine_version", "settings", "worker_digest")},
            "model_dir": str(DEFAULT_MODEL), "model_digest": canonical.tree_digest(DEFAULT_MODEL),
            "dtype": "float32"}


INVARIANCE = ("one-at-a-time", "in-flight-16", "in-flight-16-shuffled")


def write_declaration(cli: InvarSession, folder: Path, url: str, *, invariance: tuple[str, ...] = INVARIANCE,
                      per_call: int = 16, name: str = "served-vllm") -> Path:
    reference = package(cli, "vllm")
    candidate = package(cli, "openai", f"base_url={url}", f"served_model={SERVED}", "retries=0")
    layouts = {"one-at-a-time": ["batch_size = 1"], "in-flight-16": ["batch_size = 16"],
               "in-flight-16-shuffled": ["batch_size = 16", 'order = "shuffled"']}
    lines = [
        f'name = "{name}"',
        "[population]", f'path = "{POPULATION}"',
        f'sha256 = "{POPULATION.with_suffix(".sha256").read_text().split()[0]}"', f"sample = {UNITS}",
        "[scorer]", 'name = "arithmetic-exact"',
        "[sampling]", "temperature = 1.0", "max_tokens = 5",
        "[requirement]", 'standard = "population"', 'epsilon = "0.2"', 'confidence = "0.95"',
        'method = "paired-binary-exact"',
        "[pairing]", "seed = 20261201", 'layout = "in-flight-16"',
        *(line for n, spec in layouts.items() if n in {"in-flight-16", *invariance}
          for line in (f"[layouts.{n}]", *spec)),
        "[invariance]", f"required = {json.dumps(bool(invariance))}",
        *([f"layouts = {json.dumps(list(invariance))}"] if invariance else []),
        "[execution]", f"requests_per_call = {per_call}",
        "[reference]", *(f"{k} = {_toml(v)}" for k, v in reference.items()),
        "[candidate]", *(f"{k} = {_toml(v)}" for k, v in candidate.items()),
        "[[premises]]",
        'statement = "The server at base_url runs vLLM on the weights of model_dir, launched as docs/endpoints.md '
        'says."',
        'party = "deployment owner"', f'basis_sha256 = "{canonical.tree_digest(DEFAULT_MODEL)}"',
        'reliance = "vouched"',
    ]
    decl = folder / f"{name}.toml"
    decl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return decl


GONE = ("[Errno 111] Connection refused", "[Errno 104] Connection reset by peer",
        "Remote end closed connection without response")
"""How a request fails when the endpoint stops listening under it (urllib's reasons, as the worker reports them)."""


class Gate:
    """A TCP relay on a fixed port in front of the real server that can stop listening and listen again."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.budget: int | None = None
        """Close after this many more connections (the worker opens one per HTTP request)."""
        self.on_close: Callable[[], None] | None = None
        """Run when the budget is spent, before the relay stops listening (e.g. kill the server itself)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        self.thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.listener is not None:
            # shutdown wakes the accepting thread, so the port is free again at once; new connections are refused
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None
            if self.thread is not None and self.thread is not threading.current_thread():
                self.thread.join(timeout=10)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server itself is gone (the session is ending)
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
            if self.budget is not None:
                self.budget -= 1
                if self.budget <= 0:
                    self.budget = None
                    if self.on_close is not None:
                        self.on_close()
                        self.on_close = None
                    self.close()
                    return

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def gate(vllm_server: VllmServer) -> Iterator[Gate]:
    g = Gate(int(vllm_server.url.rsplit(":", 1)[1]))
    g.open()
    try:
        yield g
    finally:
        g.close()


@pytest.fixture(scope="module")
def contract(cli: InvarSession, gate: Gate, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    out = cli.run("use", "prepare", str(write_declaration(cli, folder, gate.url)))
    assert out.returncode == 0, out.stderr
    return folder / "served-vllm.contract.json"


def test_the_endpoint_is_admitted_for_the_use_and_the_decision_recomputes(cli: InvarSession, contract: Path,
                                                                           tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = cli.run("use", "run", str(contract), "--run", str(run), "--json")
    assert out.returncode == 0, out.stderr
    head = json.loads(out.stdout)["chain_head"]
    out = cli.run("use", "admit", str(run), "--contract", str(contract), "--expect-head", head, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["answer"] == "Admitted"
    assert doc["invariance"]["holds"] is True  # one at a time, 16 in flight, shuffled: the same bits
    # Served and in-process: the same tokens on every unit (same vLLM build, same seeds).
    assert doc["task_loss"]["n"] == UNITS
    assert (doc["task_loss"]["worse"], doc["task_loss"]["better"]) == (0, 0), doc["task_loss"]
    decision = admit(contract, run)  # from the records alone, in this process
    assert decision.answer.value == "Admitted"


def connections_before(calls: int, per_call: int) -> int:
    """Connections the endpoint worker opens (one per HTTP request) before the first request of its generate call
    number `calls + 1`: 2 at start (the server's identity), 6 at load_model (identity, the seed probe twice, the
    log-probability mode probe at two temperatures), then 2 + n + 2 per generate call of n requests (identity
    before and after), and 2 for the next call's identity."""
    return 2 + 6 + calls * (per_call + 4) + 2


def _generate_records(run: Path, engine: str | None = None) -> int:
    """Answered generate calls in a run being written (0 while it is still being created), of one engine's worker
    or of all."""
    try:
        store = RunStore.open(run)
    except RecordError:
        return 0
    with store:
        return sum(1 for c in store.calls() if c.call.method == "generate" and c.report is not None
                   and c.report.report.ok and engine in (None, c.identity.engine))


def test_an_endpoint_that_goes_away_mid_run_loses_nothing_and_the_run_resumes(
        cli: InvarSession, contract: Path, gate: Gate, tmp_path: Path) -> None:
    run = tmp_path / "run"
    # The gate closes five requests into the candidate's third call: two of its six calls answered, the third lost
    # mid-flight.
    gate.budget = connections_before(2, 16) + 5
    try:
        out = cli.run("use", "run", str(contract), "--run", str(run), "--quiet")  # no phase before the error
    finally:
        if gate.listener is None:
            gate.open()
    err = out.stderr
    assert out.returncode == 2, err
    assert err.startswith("invar: error: "), err
    assert err.count("\n") == 1, err
    # What the lost request met depends on when it connected: after the relay stopped listening (refused), or in its
    # backlog as it closed (reset, or closed before an answer). Each names the server going away, and nothing else.
    assert any(f"(last: {why}" in err for why in GONE), err
    # the CLI's own hint, not the worker's words (which also say a use run resumes)
    assert err.rstrip("\n").endswith(f"; resume with: invar use run {contract} --run {run}"), err
    kept = _generate_records(run)
    assert kept >= 2
    with urllib.request.urlopen(gate.url + "/v1/models", timeout=10) as resp:
        assert resp.status == 200  # back
    out = cli.run("use", "run", str(contract), "--run", str(run), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["calls_reused"] >= kept  # every answered call kept, none sent again
    assert doc["calls_issued"] + doc["calls_reused"] == doc["calls_total"]
    out = cli.run("use", "admit", str(run), "--contract", str(contract), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["answer"] == "Admitted"


class _Relabelled(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the real server that reports another maximum length for the served model: what a
    server restarted with another `--max-model-len` tells a client."""

    upstream = ""

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))) if self.command == "POST" else None
        req = urllib.request.Request(self.upstream + self.path, data=body, method=self.command,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = resp.read()
        if self.path == "/v1/models":
            doc = json.loads(data)
            for m in doc["data"]:
                m["max_model_len"] = 2 * m["max_model_len"]
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


def test_a_killed_server_restarted_resumes_the_run_and_a_changed_server_is_refused(
        cli: InvarSession, vllm_server: VllmServer, gate: Gate, tmp_path: Path) -> None:
    decl = write_declaration(cli, tmp_path, gate.url, invariance=(), name="served-kill")
    out = cli.run("use", "prepare", str(decl))
    assert out.returncode == 0, out.stderr
    contract = tmp_path / "served-kill.contract.json"
    run = tmp_path / "run"
    server_port = gate.upstream_port
    # The vLLM server process itself is killed three requests into the candidate's second call (of two, 16
    # requests each); the relay then stops listening too, as the killed server's port does.
    gate.budget = connections_before(1, 16) + 3
    gate.on_close = lambda: stop_server(vllm_server)
    relabelled: http.server.ThreadingHTTPServer | None = None
    try:
        out = cli.run("use", "run", str(contract), "--run", str(run), "--quiet")
        err = out.stderr
        assert vllm_server.process.poll() is not None, err  # really killed
        assert out.returncode == 2, err
        assert err.startswith("invar: error: "), err
        assert err.count("\n") == 1, err
        assert err.rstrip("\n").endswith(f"; resume with: invar use run {contract} --run {run}"), err
        kept = _generate_records(run, "openai")
        assert kept == 1  # the answered call, none of the lost one
        kept_all = _generate_records(run)

        # The same model and launch options, on the same port: a new process, the same identity.
        print(f"measured: vLLM server restarted in {restart_server(vllm_server):.1f} s")
        # First a server that reports itself otherwise (another maximum length): refused in one line, nothing lost.
        _Relabelled.upstream = vllm_server.url
        relabelled = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Relabelled)
        threading.Thread(target=relabelled.serve_forever, daemon=True).start()
        gate.upstream_port = relabelled.server_address[1]
        gate.open()
        out = cli.run("use", "run", str(contract), "--run", str(run), "--quiet")
        err = out.stderr
        assert out.returncode == 2, err
        assert err.startswith("invar: error: "), err
        assert err.count("\n") == 1, err
        assert "max_model_len" in err, err
        assert _generate_records(run) == kept_all

        # The restarted server as it was: the same command resumes the run and completes it.
        gate.upstream_port = server_port
        out = cli.run("use", "run", str(contract), "--run", str(run), "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["calls_reused"] == kept_all  # every answered call kept, none sent again
        assert doc["calls_issued"] + doc["calls_reused"] == doc["calls_total"]
        assert _generate_records(run, "openai") == 2
    finally:
        if vllm_server.process.poll() is not None:  # failed before the restart: the next tests need the server
            restart_server(vllm_server)
        gate.upstream_port = server_port
        gate.on_close = gate.budget = None
        if gate.listener is None:
            gate.open()
        if relabelled is not None:
            relabelled.shutdown()
    out = cli.run("use", "admit", str(run), "--contract", str(contract), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["answer"] == "Admitted"
    assert (doc["task_loss"]["worse"], doc["task_loss"]["better"]) == (0, 0), doc["task_loss"]
    assert admit(contract, run).answer.value == "Admitted"  # from the records alone, in this process


def test_infer_records_the_top_k_it_asked_and_an_engine_without_them_refuses(
        cli: InvarSession, vllm_server: VllmServer, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = cli.run("infer", "37+58=", "--engine", "openai", "--setting", f"base_url={vllm_server.url}",
                  "--setting", f"served_model={SERVED}", "--max-tokens", "4", "--top-logprobs", "2", "--run",
                  str(run), "--json")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["outputs"][0]
    assert len(row["top_ids"]) == len(row["tokens"])
    assert all(len(t) == 2 for t in row["top_ids"])
    with RunStore.open(run) as store:
        (call,) = [c for c in store.calls() if c.call.method == "generate"]
        assert call.call.params["requests"][0]["top_logprobs"] == 2  # what was asked, recorded
        assert call.report is not None
        assert call.report.report.result is not None
        recorded = call.report.report.result["outputs"][0]
        assert recorded["top_ids"].tolist() == row["top_ids"]
        assert recorded["top_logprobs"].astype(float).tolist() == row["top_logprobs"]
    out = cli.run("infer", "37+58=", "--engine", "hf", "--top-logprobs", "2", "--run", str(tmp_path / "hf"), "--quiet")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "does not report top-k log-probabilities" in out.stderr
