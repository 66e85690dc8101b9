"""An in-process worker for orchestration tests: the real protocol server on in-memory pipes, answering from a
script, started through the `Transport` seam the runners take (`use_run(..., transport=...)`).

Decisions:
- **Only the engine is fake.** The worker is `invar.protocol.Server` serving its loop on a thread, over byte pipes
  the client reads and writes exactly as it does a subprocess's: real frames, a real handshake and identity, call
  digests bound by the real client and recorded by the real `RunStore`. What a real engine would compute (tokens,
  log-probabilities) comes from `Script`, a deterministic function of each request, so a re-issued call answers
  what the lost one would have, as a seeded engine does.
- **It passes for the engine it is started as.** The command line names a worker module (`invar.workers.hf_worker`);
  the fake reports that engine, the launch settings its command line gives, the tests' engine versions
  (`ENGINE_VERSION`) and the worker code digest of that module's files, so a contract prepared with those values
  names it and every check before the first call runs as for a real worker.
- **It learns too.** Started as a learner it answers `learner_step` as a learner must: it reads the batch under the
  policy the update starts from, computes the objective's terms with the core's own function, takes a step that
  is a deterministic function of the start adapter, the batch and the optimizer settings (never of how the core
  scheduled the work), and saves a PEFT checkpoint with its optimizer moments that passes the core's checks. With
  `Script.policy_logprobs` the engine's log-probabilities of a response are a function of the policy that scores
  it (the adapter's digest, the base model's for none), the prompt and the response, so the learner's proximal
  reading equals the engine's behavior reading exactly when they use the same policy, as a matched pair does.
- **Failures are scripted too** (`Fault`): a worker dies on its k-th call of a method (the call is on record, its
  report never comes), answers an error, hangs until it is stopped, or refuses to start with one line on stderr as
  a worker refusing its launch options does. A loss is a process gone: exit code -9, end of its streams.
- Pipes are in memory rather than `os.pipe()`: a killed fake's server thread may still be writing, and closing a
  file descriptor under a writing thread could hand its number to another file; an in-memory pipe just breaks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from invar import canonical
from invar.engines import ENGINES, LAUNCH_SETTINGS, worker_digest
from invar.errors import ContractError
from invar.formats.checkpoint import (
    ADAPTER_CONFIG,
    BASE_DIGEST_KEY,
    MANIFEST,
    MOMENTS,
    OPTIMIZER_WEIGHTS,
    PEFT_WEIGHTS,
    BaseModel,
    inspect_adapter,
    read_safetensors,
    save_atomically,
)
from invar.loop.objective import ObjectiveSettings, loss_terms
from invar.protocol import MethodError, Role, Server
from invar.protocol.payloads import GenerateResult, LearnerStepParams, LearnerStepResult
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import answer_of

ENGINE_VERSION = {"invar-fake-engine": "1"}
"""The engine versions every fake worker reports: a contract's packages declare these to name a fake worker."""
MAX_MODEL_LEN = 128
_PIDS = itertools.count(100_000)
"""The pid each fake reports, unique in this process as a live process's is: a resumed run's workers must not share
an identity (and so a record key) with the workers of its first attempt."""


class _Pipe:
    """One direction of a pipe: bytes written at one end are read at the other, in order; `close_write` is the
    writer's end of stream, `break_` a process gone (its unread input lost, further writes `BrokenPipeError`)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._write_closed = False
        self._broken = False

    def write(self, data: bytes | memoryview) -> int:
        with self._cond:
            if self._write_closed or self._broken:
                raise BrokenPipeError(32, "Broken pipe")
            self._buf += data
            self._cond.notify_all()
            return len(memoryview(data).cast("B"))

    def readinto(self, buf: memoryview | bytearray) -> int:
        with self._cond:
            while not self._buf and not self._write_closed and not self._broken:
                self._cond.wait()
            if self._broken:
                return 0
            n = min(len(buf), len(self._buf))
            buf[:n] = self._buf[:n]
            del self._buf[:n]
            return n

    def read(self, size: int = -1) -> bytes:
        out = bytearray(size if size > 0 else 1 << 16)
        n = self.readinto(memoryview(out))
        return bytes(out[:n])

    def close_write(self) -> None:
        with self._cond:
            self._write_closed = True
            self._cond.notify_all()

    def break_(self) -> None:
        with self._cond:
            self._broken = True
            self._buf.clear()
            self._cond.notify_all()


class _WriteEnd:
    """The end of a `_Pipe` a process writes to (a file object as `frames.write_parts` and `close` use it)."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        if self.closed:
            raise ValueError("write to a closed pipe")
        return self._pipe.write(data)

    def flush(self) -> None:
        if self.closed:
            raise ValueError("flush of a closed pipe")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._pipe.close_write()


class _ReadEnd:
    """The end of a `_Pipe` a process reads from."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self.closed = False

    def readinto(self, buf: memoryview | bytearray) -> int:
        return 0 if self.closed else self._pipe.readinto(buf)

    def read(self, size: int = -1) -> bytes:
        return b"" if self.closed else self._pipe.read(size)

    read1 = read

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class Fault:
    """A scripted failure: on the calls numbered `calls` (1-based) of `method` that workers for which `where`
    holds receive, counted over every worker the transport started (replacements included), the worker does
    `action`: `die` (it is lost, the call unanswered), `error` (an error report; it keeps serving) or `hang` (no
    report until it is stopped)."""

    action: Literal["die", "error", "hang"]
    method: str = "generate"
    calls: Container[int] = (1,)
    where: Callable[[FakeWorker], bool] = lambda worker: True


@dataclass(frozen=True)
class Script:
    """What the fake engine answers, as a function of the request and the package the worker loaded.

    A generate request is answered with the correct answer to its arithmetic prompt (decoded from its prompt ids
    with the model's tokenizer), made wrong (the answer + 1) for a share `wrong(worker)` of the requests chosen by
    a hash of the request's seed and prompt ids: the same request always gets the same answer, whichever batch it
    is in, unless `batch_dependent(worker)`, when requests in batches of more than one are answered wrong for half
    the prompts (an engine whose sample depends on its batch). Log-probabilities are drawn from the same hash.
    """

    wrong: Callable[[FakeWorker], float] = lambda worker: 0.0
    batch_dependent: Callable[[FakeWorker], bool] = lambda worker: False
    report: Callable[[FakeWorker, str, dict[str, Any]], dict[str, Any]] = lambda worker, method, result: result
    """The generate or score result as sent: a report that names another model than the one loaded, say."""
    load_seconds: Callable[[int], float] = lambda number: 0.0
    """How long the worker started `number`-th (from 1) takes to load its model: a slow load, say NF4's."""
    effective_config: Callable[[FakeWorker, Path], Mapping[str, Any] | None] = lambda worker, model: None
    """The effective configuration the worker reports at `load_model` for the model folder it loaded (None: it
    reports none, as a worker that cannot read its engine's)."""
    policy_logprobs: bool = False
    """Log-probabilities of a response drawn from the policy scoring it, the prompt and the response (what a learner
    can reproduce) rather than from the request's seed; a generate call then also scores its `reference_adapter`."""


def _unit_hash(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(canonical.encode(list(parts))).digest()[:8], "big")


def _uniform(*parts: Any) -> float:
    """A number in [0, 1) fixed by `parts`."""
    return _unit_hash(*parts) / 2**64


def policy_logprobs(policy: str | None, prompt_ids: Sequence[int], tokens: np.ndarray) -> np.ndarray:
    """float32 [T]: the fake's log-probabilities of `tokens` after `prompt_ids` under `policy` (an adapter's digest;
    None: the base model), the same in the engine and the learner."""
    rng = np.random.default_rng(_unit_hash("policy-logprobs", policy, [int(t) for t in prompt_ids],
                                           [int(t) for t in np.asarray(tokens)]))
    return -rng.random(len(tokens)).astype(np.float32)


class FakeWorker:
    """The worker program one `spawn` starts: its identity from the command line, its methods from the script."""

    process: FakeProcess
    """The process serving it (set when that starts)."""

    def __init__(self, transport: FakeTransport, number: int, argv: Sequence[str], pid: int | None = None) -> None:
        self.transport, self.number, self.argv = transport, number, list(argv)
        self.module = module = self.argv[self.argv.index("-m") + 1]
        self.engine = next(name for name, mod in ENGINES.items() if mod == module)
        self.role = Role(self.argv[self.argv.index("--role") + 1])
        self.loaded: dict[str, Any] | None = None
        """The `load_model` params of this worker (which package it serves), once loaded."""
        self.tokenizer: ModelTokenizer | None = None
        self.adapters: dict[str, str] = {}
        self.trainee: _Trainee | None = None
        """A learner's adapter under training (None before its first update when it loaded none)."""
        self.stopped = threading.Event()
        methods = {"load_model": self.load_model, "load_adapter": self.load_adapter, "generate": self.generate,
                   "score": self.score}
        if self.role == Role.LEARNER:
            methods["learner_step"] = self.learner_step
        server = Server(engine=self.engine, engine_version=ENGINE_VERSION, role=self.role,
                        settings=self._settings(), methods={k: self._faulty(k, m) for k, m in methods.items()})
        # In-process there is no worker `__main__` to describe: state the code it stands in for, as that worker would.
        server.identity = dataclasses.replace(server.identity, pid=next(_PIDS) if pid is None else pid, worker={
            "module": module, "sha256": canonical.sha256(module.encode()), "digest": transport.digest(self.engine)})
        server.identity_digest = server.identity.digest
        self.server = server

    def _settings(self) -> dict[str, Any]:
        """The launch settings the command line gives, typed as the engine's worker reports them."""
        settings: dict[str, Any] = {"device": "cpu", "threads": 1} if self.engine == "hf" else {}
        for name, launch in LAUNCH_SETTINGS.get(self.engine, {}).items():
            if launch.flag in self.argv:
                at = self.argv.index(launch.flag)
                settings[name] = True if launch.kind is bool else launch.kind(self.argv[at + 1])
        return settings

    @property
    def package(self) -> str:
        """`reference` or `candidate` as the tests' contracts tell them apart: by the quantization loaded."""
        return "candidate" if (self.loaded or {}).get("quantization") == "nf4" else "reference"

    def _faulty(self, name: str, method: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[
            [dict[str, Any]], dict[str, Any]]:
        def run(params: dict[str, Any]) -> dict[str, Any]:
            self.transport.received.append((self.number, name))
            fault = self.transport.fault_for(self, name)
            if fault is not None:
                if fault.action == "die":
                    self.process.die(-9)
                    raise SystemExit  # the process is gone: no report leaves it
                if fault.action == "hang":
                    self.stopped.wait()
                    raise SystemExit
                raise RuntimeError(f"scripted failure of {name}")
            return method(params)
        return run

    # -- methods ----------------------------------------------------------------------------------------------

    def load_model(self, params: dict[str, Any]) -> dict[str, Any]:
        model = Path(params["model_dir"])
        if not model.is_dir():
            raise MethodError(f"load_model: {model} is not a folder")
        digest = canonical.tree_digest(str(model))
        if digest != params["model_digest"]:
            raise MethodError(f"load_model: {model} has digest {digest}, not {params['model_digest']}")
        adapter = params.get("adapter")
        if adapter is not None and canonical.tree_digest(adapter["path"]) != adapter["digest"]:
            raise MethodError("load_model: the adapter's digest differs")
        time.sleep(self.transport.script.load_seconds(self.number))
        if adapter is not None and self.role == Role.LEARNER:
            self.trainee = _Trainee.read(Path(adapter["path"]), adapter["digest"])
        self.loaded = dict(params)
        self.tokenizer = ModelTokenizer.from_model_dir(model)
        result = {"model_digest": digest, "adapter_digest": None if adapter is None else adapter["digest"],
                  "vocab_size": self.tokenizer.size, "eos_token_id": self.tokenizer.eos_token_id,
                  "max_model_len": MAX_MODEL_LEN}
        effective = self.transport.script.effective_config(self, model)
        if effective is not None:
            result["effective_config"] = dict(effective)
        return result

    def load_adapter(self, params: dict[str, Any]) -> dict[str, Any]:
        digest = canonical.tree_digest(params["path"])
        if digest != params["digest"]:
            raise MethodError("load_adapter: the adapter's digest differs")
        self.adapters[params["name"]] = digest
        return {"name": params["name"], "adapter_digest": digest}

    def _adapter_digest(self, name: str | None) -> str | None:
        if name is None:
            adapter = (self.loaded or {}).get("adapter")
            return None if adapter is None else str(adapter["digest"])
        return None if name == "base" else self.adapters[name]

    def _answer(self, request: Mapping[str, Any], batch: int) -> tuple[np.ndarray, np.ndarray, str]:
        vocab = self.tokenizer
        assert vocab is not None
        prompt_ids = [int(t) for t in request["prompt_ids"]]
        text = vocab.decode([t for t in prompt_ids if t not in vocab.special_ids])
        key = (request["seed"], prompt_ids)
        script = self.transport.script
        wrong = _uniform("wrong", *key) < script.wrong(self)
        if batch > 1 and script.batch_dependent(self):
            wrong = _uniform("batch", *key) < 0.5
        try:
            answer = answer_of(text)
            reply = str(answer + 1 if wrong else answer)
        except ContractError:  # not an arithmetic prompt: digits drawn from the hash
            reply = str(_unit_hash("reply", *key) % 1000)
        tokens = [*vocab.encode(reply), vocab.eos_token_id]
        finish = "stop"
        if len(tokens) > request["max_tokens"]:
            tokens, finish = tokens[: request["max_tokens"]], "length"
        rng = np.random.default_rng(_unit_hash("logprobs", *key, tokens))
        logprobs = -rng.random(len(tokens)).astype(np.float32)
        return np.array(tokens, dtype=np.int32), logprobs, finish

    def _policy(self, name: str | None) -> str | None:
        """The digest of the policy an adapter name samples or scores under (None: the base model)."""
        return None if name is None or name == "base" else self.adapters[name]

    def generate(self, params: dict[str, Any]) -> dict[str, Any]:
        requests = params["requests"]
        self.transport.layouts.append((self.package, [list(b) for b in params["layout"]]))
        outputs: list[dict[str, Any] | None] = [None] * len(requests)
        for batch in params["layout"]:  # the batches one after another, as an engine runs them
            for i in batch:
                req = requests[i]
                tokens, logprobs, finish = self._answer(req, len(batch))
                outputs[i] = {"request_id": req["request_id"],
                              "prompt_tokens": np.array(req["prompt_ids"], dtype=np.int32),
                              "tokens": tokens, "logprobs": logprobs, "finish_reason": finish}
                if self.transport.script.policy_logprobs:
                    outputs[i]["logprobs"] = policy_logprobs(self._policy(params.get("adapter")), req["prompt_ids"],
                                                             tokens)
                    if params.get("reference_adapter") is not None:
                        outputs[i]["reference_logprobs"] = policy_logprobs(
                            self._policy(params["reference_adapter"]), req["prompt_ids"], tokens)
        assert self.loaded is not None
        result = self.transport.script.report(self, "generate", {
            "outputs": outputs, "model_digest": self.loaded["model_digest"],
            "adapter_digest": self._adapter_digest(params.get("adapter"))})
        if params.get("packed"):
            # As columns, as a worker answers a training cycle's call; a result a test's script made malformed is
            # sent as it made it.
            with contextlib.suppress(MethodError):
                result = dataclasses.replace(GenerateResult.from_wire(result), packed=True).to_wire()
        return result

    def score(self, params: dict[str, Any]) -> dict[str, Any]:
        vocab = self.tokenizer
        assert vocab is not None
        assert self.loaded is not None
        outputs = []
        for item in params["items"]:
            tokens = np.asarray(item["response_tokens"])
            rng = np.random.default_rng(_unit_hash("score", self.package, item["prompt_ids"], tokens.tolist(),
                                                   item["temperature"]))
            steps = list(item.get("vocab_steps", []))
            raw = rng.random((len(steps), vocab.size))
            vocab_lp = (raw - np.log(np.exp(raw).sum(axis=1, keepdims=True))).astype(np.float32)
            outputs.append({"item_id": item["item_id"], "logprobs": -rng.random(tokens.size).astype(np.float32),
                            "vocab_logprobs": vocab_lp.reshape(len(steps), vocab.size)})
        return self.transport.script.report(self, "score", {
            "outputs": outputs, "model_digest": self.loaded["model_digest"],
            "adapter_digest": self._adapter_digest(params.get("adapter"))})


    def learner_step(self, params: dict[str, Any]) -> dict[str, Any]:
        """One update: the batch read under the start policy, the objective's terms as the core computes them, a
        step fixed by the start adapter, the batch and the optimizer settings, and a checkpoint saved."""
        assert self.loaded is not None
        model_dir, model_digest = Path(self.loaded["model_dir"]), str(self.loaded["model_digest"])
        # Read as a learner reads it: the samples as a list of maps or as columns (`batch`), answered in the same
        # layout below.
        step = LearnerStepParams.from_wire(params, reductions=("float64-sequence", "float32-microbatch"))
        start = self.trainee
        if start is None:
            assert step.lora is not None
            start = _Trainee.fresh(BaseModel.from_dir(model_dir), step.lora.r, step.lora.alpha,
                                   list(step.lora.target_modules), step.seed)
        samples = step.samples
        proximal = [policy_logprobs(start.digest, s.prompt_ids, s.tokens) for s in samples]
        o = step.objective
        settings = ObjectiveSettings(o.clip_low, o.clip_high, o.kl_coef, o.importance, o.importance_cap)
        advantages = np.array([s.advantage for s in samples], dtype=np.float32)
        terms = loss_terms(proximal, [s.behavior_logprobs for s in samples], advantages, settings,
                           reference=[np.asarray(s.reference_logprobs) for s in samples] if settings.kl_coef
                           else None)
        batch = canonical.digest([[list(map(int, s.prompt_ids)), s.tokens.tolist(), s.behavior_logprobs.tobytes().hex(),
                                   float(s.advantage)] for s in samples])
        after = start.step(batch, step.optimizer.lr, terms.loss)
        folder = Path(step.save_dir)
        save_atomically(folder, lambda tmp: after.write(tmp, model_digest), optimizer_steps=after.steps)
        checked = inspect_adapter(folder, model_dir, base_model_digest=model_digest)
        after.digest = checked.digest
        self.trainee = after
        return LearnerStepResult(proximal, terms.loss, terms.policy, terms.kl, terms.importance_weight_mean,
                                 terms.tokens, abs(terms.loss), str(folder), checked.digest, checked.tensors,
                                 start.digest, after.steps, model_digest, packed=step.packed).to_wire()


@dataclass
class _Trainee:
    """A fake learner's LoRA adapter and AdamW-shaped moments, in PEFT's names and orientation."""

    rank: int
    alpha: float
    targets: list[str]
    weights: dict[str, np.ndarray]
    moments: dict[str, np.ndarray]
    steps: int
    digest: str | None
    """The saved folder's digest (None: not saved, a fresh adapter)."""

    @classmethod
    def fresh(cls, base: BaseModel, rank: int, alpha: float, targets: Sequence[str], seed: int) -> _Trainee:
        weights: dict[str, np.ndarray] = {}
        for layer in range(base.num_layers):
            for module, (n_in, n_out) in base.linears.items():
                if not any(module == t or module.endswith("." + t) for t in targets):
                    continue
                name = f"base_model.model.model.layers.{layer}.{module}"
                rng = np.random.default_rng(_unit_hash("lora-init", seed, name))
                weights[f"{name}.lora_A.weight"] = rng.uniform(-0.1, 0.1, (rank, n_in)).astype(np.float32)
                weights[f"{name}.lora_B.weight"] = np.zeros((n_out, rank), dtype=np.float32)
        moments = {f"{n}.{m}": np.zeros_like(w) for n, w in weights.items() for m in MOMENTS}
        return cls(rank, alpha, sorted(set(targets)), weights, moments, 0, None)

    @classmethod
    def read(cls, folder: Path, digest: str) -> _Trainee:
        """A saved checkpoint, to continue training it."""
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        peft, opt = read_safetensors(folder / PEFT_WEIGHTS), read_safetensors(folder / OPTIMIZER_WEIGHTS)
        steps = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["optimizer_steps"]
        return cls(config["r"], config["lora_alpha"], config["target_modules"],
                   {n: peft.array(n).copy() for n in peft.tensors}, {n: opt.array(n).copy() for n in opt.tensors},
                   int(steps), digest)

    def step(self, batch: str, lr: float, loss: float) -> _Trainee:
        """The adapter after one update on `batch` (its digest): each tensor moved by lr along a direction drawn
        from the start adapter and the batch, scaled by the loss."""
        weights, moments = {}, {}
        for name, w in sorted(self.weights.items()):
            rng = np.random.default_rng(_unit_hash("update", self.digest, batch, name))
            g = rng.standard_normal(w.shape).astype(np.float32) * np.float32(1.0 + abs(loss))
            weights[name] = (w - np.float32(lr) * g).astype(np.float32)
            moments[f"{name}.exp_avg"] = (np.float32(0.9) * self.moments[f"{name}.exp_avg"] + np.float32(0.1) * g)
            moments[f"{name}.exp_avg_sq"] = (np.float32(0.999) * self.moments[f"{name}.exp_avg_sq"]
                                             + np.float32(0.001) * g * g)
        return _Trainee(self.rank, self.alpha, self.targets, weights, moments, self.steps + 1, None)

    def write(self, folder: Path, model_digest: str) -> None:
        metadata = {"format": "pt", BASE_DIGEST_KEY: model_digest}
        _save_safetensors(folder / PEFT_WEIGHTS, self.weights, metadata)
        _save_safetensors(folder / OPTIMIZER_WEIGHTS, self.moments, metadata)
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                  "target_modules": self.targets, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
                  "use_rslora": False, "use_dora": False, "modules_to_save": None}
        (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """float32 tensors in the safetensors format, written the same way every time (sorted names and keys: the
    `safetensors` package orders its metadata by hash, so two saves of one adapter could differ in their bytes)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset, data = 0, []
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data.append(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(data))


class FakeProcess:
    """A started fake worker as the client drives it (`invar.protocol.WorkerProcess`): three byte streams, an exit
    code, and `kill`, which loses it at once as SIGKILL loses a process."""

    def __init__(self, worker: FakeWorker, refusal: str | None) -> None:
        self.worker = worker
        worker.process = self
        self._in, self._out, self._err = _Pipe(), _Pipe(), _Pipe()
        self.stdin = _WriteEnd(self._in)
        self.stdout = _ReadEnd(self._out)
        self.stderr = _ReadEnd(self._err)
        self.returncode: int | None = None
        self.lost_with: list[FakeProcess] = []
        """The workers lost when this one is (those sharing its process)."""
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(refusal,), name=f"fake-worker-{worker.number}",
                                        daemon=True)
        self._thread.start()

    def _main(self, refusal: str | None) -> None:
        out, err = _WriteEnd(self._out), _WriteEnd(self._err)
        if refusal is not None:
            # As a worker refusing its launch options: one line of its own on stderr, exit 2, no handshake.
            err.write(f"{self.worker.module}: {refusal}\n".encode())
            self._exit(2)
            return
        code = 1
        with contextlib.suppress(OSError, SystemExit):  # a write after it was lost, or a scripted death
            code = self.worker.server.serve(stdin=_ReadEnd(self._in), stdout=out)  # type: ignore[arg-type]
        self._exit(code)

    def _exit(self, code: int) -> None:
        with self._lock:
            if self.returncode is None:
                self.returncode = code
        self._err.close_write()
        self._out.close_write()
        self._done.set()

    def die(self, code: int) -> None:
        """Lost at once: unread input dropped, output ended after what was already written."""
        with self._lock:
            if self.returncode is None:
                self.returncode = code
        self._in.break_()
        self._out.close_write()
        self._err.close_write()
        self.worker.stopped.set()
        self._done.set()
        for other in self.lost_with:
            if other.poll() is None:
                other.die(code)

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("fake worker", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.die(-9)


@dataclass
class FakeTransport:
    """Starts fake workers in this process (`invar.engines.Transport`); `restarts`: how many times a command may
    replace a lost one. Keeps what its workers received, for tests to check."""

    script: Script = field(default_factory=Script)
    faults: Sequence[Fault] = ()
    restarts: int = 0
    refuse: Callable[[int, Sequence[str]], str | None] = lambda number, argv: None
    """The refusal line of the `number`-th start (1-based) of `argv`, or None to start."""
    started: list[FakeWorker] = field(default_factory=list)
    received: list[tuple[int, str]] = field(default_factory=list)
    """(worker number, method) of every call a worker received, in order."""
    layouts: list[tuple[str, list[list[int]]]] = field(default_factory=list)
    """(package, layout) of every generate call answered."""
    _counts: dict[int, int] = field(default_factory=dict)
    _digests: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def digest(self, engine: str) -> str:
        with self._lock:
            if engine not in self._digests:
                self._digests[engine] = worker_digest(engine)
            return self._digests[engine]

    def fault_for(self, worker: FakeWorker, method: str) -> Fault | None:
        """The fault this call meets, counting it against every fault of its method that selects its worker."""
        hit = None
        with self._lock:
            for i, fault in enumerate(self.faults):
                if fault.method == method and fault.where(worker):
                    self._counts[i] = self._counts.get(i, 0) + 1
                    if hit is None and self._counts[i] in fault.calls:
                        hit = fault
        return hit

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
              pid: int | None = None) -> FakeProcess:
        """A fake worker started by `argv`; `pid`: the pid it reports (default: one of its own)."""
        with self._lock:
            number = next(self._numbers)
        worker = FakeWorker(self, number, argv, pid)
        with self._lock:
            self.started.append(worker)
        return FakeProcess(worker, self.refuse(number, argv))


@dataclass
class FakeSharedProcess:
    """The training loop's shared layout faked (`invar.transport.shared.SharedProcess`): each role a fake worker of
    `transport` on a channel of its own, both reporting one pid, as the two roles of one process do; losing either
    loses both, as a process does. Not replaced when lost. `process` is itself: `pid` is what the runner records."""

    transport: FakeTransport
    pid: int = field(default_factory=lambda: next(_PIDS))
    roles: dict[Role, FakeProcess] = field(default_factory=dict)
    closed: bool = False

    @property
    def restarts(self) -> int:
        return 0

    @property
    def process(self) -> FakeSharedProcess:
        return self

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> FakeProcess:
        started = self.transport.spawn(argv, env, cwd, pid=self.pid)
        role = started.worker.role
        if role in self.roles:
            raise OSError(None, f"the {role.value} role of this shared worker process was started already")
        for other in self.roles.values():
            other.lost_with.append(started)
            started.lost_with.append(other)
        self.roles[role] = started
        return started

    def close(self) -> None:
        """After both roles' clients have closed (the runner's order): the process has ended."""
        self.closed = True
