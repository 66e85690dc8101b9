"""How the core starts each engine's worker process.

An engine is a module under `invar.workers` that serves the invocation protocol; the core knows only its command
line and the environment it needs. A new engine joins by adding its module here and implementing the methods of
docs/protocol.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from invar.errors import InvarError
from invar.home import HOME
from invar.protocol import Recorder, Role, WorkerClient, WorkerProcess
from invar.protocol.client import spawn_local
from invar.worker_code import WorkerCodeError, code_digest, search_path

ENGINES: dict[str, str] = {
    "echo": "invar.workers.echo",
    "hf": "invar.workers.hf_worker",
    "vllm": "invar.workers.vllm_worker",
    "mlx": "invar.workers.mlx_worker",
    "openai": "invar.workers.openai_worker",
}
"""Engine name → the worker module that serves it."""


class Transport(Protocol):
    """Where a command's workers start instead of as local subprocesses, and how many times one that is lost may
    be replaced: a Ray placement (`invar.protocol.ray_transport.RayPlacement`), or in tests an in-process worker
    serving the protocol from scripted answers (tests/support/fake_worker.py). The frames, the binding and the
    records are the client's whichever transport carries them."""

    @property
    def restarts(self) -> int:
        """How many times a command may replace one lost worker before it stops (0: a loss stops it)."""
        ...

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> WorkerProcess:
        """Start the worker's command line (`invar.protocol.client.Spawn`); `OSError` if it cannot start."""
        ...


@dataclass(frozen=True)
class LaunchSetting:
    """A package setting that is a launch option of a worker: its flag, the type of its value, the values it takes.

    A `bool` setting is a flag given only when the value is `flag_when` (the other value is the worker's default).
    """

    flag: str
    kind: type[int] | type[float] | type[str] | type[bool]
    choices: tuple[Any, ...] = ()
    flag_when: bool | None = None
    required: bool = False
    """The worker cannot start without it (an endpoint's URL): refused before any worker starts when absent."""


_VLLM_BACKENDS = ("mp", "ray", "uni", "external_launcher")  # `invar.workers.vllm_worker.EXECUTOR_BACKENDS`

LAUNCH_SETTINGS: dict[str, dict[str, LaunchSetting]] = {
    # The HF worker passes its --device to torch: "cpu", or "cuda" where one is present (its usage line).
    "hf": {"device": LaunchSetting("--device", str, ("cpu", "cuda")), "threads": LaunchSetting("--threads", int),
           "attn_implementation": LaunchSetting("--attn-implementation", str, ("sdpa", "eager"))},
    "vllm": {"device": LaunchSetting("--device", str, ("auto", "cpu", "cuda")),
             "max_model_len": LaunchSetting("--max-model-len", int),
             "gpu_memory_utilization": LaunchSetting("--gpu-memory-utilization", float),
             "max_num_seqs": LaunchSetting("--max-num-seqs", int),
             "max_num_batched_tokens": LaunchSetting("--max-num-batched-tokens", int),
             "max_lora_rank": LaunchSetting("--max-lora-rank", int, (1, 8, 16, 32, 64, 128, 256)),
             "max_loras": LaunchSetting("--max-loras", int), "engine_seed": LaunchSetting("--seed", int),
             "tensor_parallel_size": LaunchSetting("--tensor-parallel-size", int),
             "pipeline_parallel_size": LaunchSetting("--pipeline-parallel-size", int),
             "distributed_executor_backend": LaunchSetting("--distributed-executor-backend", str, _VLLM_BACKENDS),
             "enforce_eager": LaunchSetting("--no-enforce-eager", bool, flag_when=False)},
    "mlx": {"map_rope_parameters": LaunchSetting("--no-map-rope-parameters", bool, flag_when=False)},
    # An OpenAI-compatible server: where it is and what it serves; the key is named, never given (docs/endpoints.md).
    "openai": {"base_url": LaunchSetting("--base-url", str, required=True),
               "served_model": LaunchSetting("--served-model", str, required=True),
               "api_key_env": LaunchSetting("--api-key-env", str),
               "logprobs_mode": LaunchSetting("--logprobs-mode", str, ("raw_logprobs", "processed_logprobs")),
               "prompt": LaunchSetting("--prompt", str, ("ids", "text")),
               "max_in_flight": LaunchSetting("--max-in-flight", int),
               "request_timeout": LaunchSetting("--request-timeout", float),
               "retries": LaunchSetting("--retries", int)},
}
"""Each engine's package settings that are launch options of its worker (the worker's own command line), with the
type and the values its worker takes; every other setting is fixed by the worker itself and only checked against
its identity. A contract's packages and `use package --setting` are checked against this before any worker
starts."""

def missing_settings(engine: str, given: Mapping[str, Any]) -> list[str]:
    """The required launch settings of `engine` that `given` lacks (or leaves null)."""
    return [name for name, launch in LAUNCH_SETTINGS.get(engine, {}).items()
            if launch.required and given.get(name) is None]


DEFAULT_MODEL = HOME / "models" / "tiny-arith"
"""The shipped tiny model, the default of every command that takes `--model`."""

# The folder holding the `invar` package this process imported: the workers must import the very same core.
_IMPORT_ROOT = Path(__file__).resolve().parents[1]


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a worker runs in: offline (no hub), quiet, and small on the CPU."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Workers import the same core (and its `invar.workers`) as this process, wherever the command is run from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_IMPORT_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _module(engine: str) -> str:
    module = ENGINES.get(engine)
    if module is None:
        raise InvarError(f"unknown engine {engine!r}; choose one of: {', '.join(sorted(ENGINES))}")
    return module


def worker_digest(engine: str, env: Mapping[str, str] | None = None) -> str:
    """The worker code digest (`invar.worker_code`) of the files `start_worker(engine, env=env)` would start: the
    engine's worker module and the core modules it imports, found on the search path that worker will have."""
    # `-P` leaves the script's folder (sys.path[0]) off the worker's path; the rest is this interpreter's own.
    default = sys.path if sys.flags.safe_path else sys.path[1:]
    return code_digest(_module(engine), search_path(worker_env(env).get("PYTHONPATH"), default))


def check_worker_code(engine: str, expected: str, who: str, env: Mapping[str, str] | None = None) -> str:
    """Refuse, before it starts, a worker whose code is not the package's: `WorkerCodeError` naming both digests.
    Returns the digest."""
    actual = worker_digest(engine, env)
    if actual != expected:
        raise WorkerCodeError(
            f"the {who} worker's code is not the package's: the {engine} worker's files ({_module(engine)} and the "
            f"invar modules it imports) have worker digest {actual}, the contract names {expected}; run the worker "
            f"code the contract names, or prepare a contract for this code (invar use package {engine} prints its "
            "digest)")
    return actual


def worker_argv(engine: str, role: Role, args: list[str] | None = None) -> list[str]:
    module = _module(engine)
    # -P: never put the working directory on sys.path, so an `invar/` folder where `invar` runs cannot stand in
    # for the installed worker (the module resolves through PYTHONPATH, set by `worker_env` to this installation).
    return [sys.executable, "-P", "-m", module, "--role", role.value, *(args or [])]


def start_worker(
    engine: str,
    role: Role = Role.INFERENCE,
    *,
    args: list[str] | None = None,
    recorder: Recorder | None = None,
    env: Mapping[str, str] | None = None,
    echo_stderr: bool = False,
    handshake_timeout: float = 300.0,
    call_timeout: float | None = 1800.0,
    placement: Transport | None = None,
    code: tuple[str, str] | None = None,
) -> WorkerClient:
    """Start an engine's worker and handshake with it (the role is checked).

    `placement`: start it there instead of as a local subprocess (a Ray placement: as an actor on that cluster);
    where a Ray actor ran is kept in the recorder's meta (`placement <actor id>`) when the recorder keeps meta (a
    run store).
    `code` = (worker digest, who): the worker code the package names. The digest of the files about to start is
    computed first and a mismatch refused before any process exists (`check_worker_code`); after the handshake the
    worker's own report of its digest must be the same (a Ray worker runs on another machine's files).
    """
    if code is not None:
        check_worker_code(engine, code[0], code[1], env)
    client = WorkerClient(
        worker_argv(engine, role, args),
        name=f"{engine}-{role.value}",
        env=worker_env(env),
        expected_role=role,
        expected_engine=engine,
        recorder=recorder,
        echo_stderr=echo_stderr,
        handshake_timeout=handshake_timeout,
        call_timeout=call_timeout,
        spawn=spawn_local if placement is None else placement.spawn,
    )
    client.start()
    if code is not None:
        reported = (client.identity.worker or {}).get("digest")
        if reported != code[0]:
            client.close()
            raise WorkerCodeError(
                f"the {code[1]} worker reports worker digest {reported}, not {code[0]}, the digest of the files the "
                "core started: it runs other code than the package names; run it where the worker code is the "
                "contract's")
    where = getattr(client.process, "where", None)
    put_meta = getattr(recorder, "put_meta", None)
    if where and put_meta is not None:
        put_meta(f"placement {where['actor_id']}", {**where, "worker": client.worker_key,
                                                     "address": getattr(placement, "address", None)})
    return client
