"""What the core knows of each engine, and how it starts the engine's worker process.

An engine is a module under `invar.workers` that serves the invocation protocol; the core knows only its command
line and the environment it needs, and says both in one typed table (`ENGINE_TABLE`): per engine, the worker module,
each launch setting (its flag, type, choices and default) and the environment. Contracts, `--setting` and the
launch of every worker read that table. A new engine joins by adding its entry here and implementing the methods of
docs/protocol.md.
"""

from __future__ import annotations

import enum
import hashlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from invar.errors import InvarError
from invar.home import HOME

# The protocol, the transport and the worker-code digests (numpy, sockets, the canonical codec) are imported where a
# worker is started or its code digested: a command's start and its `--help` read only the table below.
if TYPE_CHECKING:
    from invar.protocol import Role
    from invar.transport import Recorder, WorkerClient, WorkerProcess

FOLLOWED = "invar"
"""`invar.worker_code.FOLLOWED`: the package whose imports a worker's code digest follows (checked equal in
tests/cli/test_lazy_imports.py)."""

EngineName = Literal["hf", "vllm", "mlx", "llamacpp", "openai"]
"""The engines a package can name (a contract's `engine`): each has its entry in `ENGINE_TABLE`."""


class Engine(enum.StrEnum):
    """The engines a command can run (`--engine`): `EngineName`'s, as an option's choices."""

    HF = "hf"
    VLLM = "vllm"
    MLX = "mlx"
    LLAMACPP = "llamacpp"
    """llama.cpp on a GGUF model folder (`invar.workers.llamacpp_worker`; docs/gguf.md): inference only."""
    OPENAI = "openai"
    """An OpenAI-compatible server (`invar.workers.openai_worker`; docs/endpoints.md): inference only."""


class Dtype(enum.StrEnum):
    """The dtype an engine computes in (`--dtype`; `invar.runner.engine` exports it too)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class Quantization(enum.StrEnum):
    """Weight quantization (`--quantization`; `invar.runner.engine` exports it too)."""

    NONE = "none"
    NF4 = "nf4"


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
    default: Any = None
    """The value the worker takes when the setting is not given (its own command line's default); None: the worker
    decides (the model's own maximum, vLLM's choice, ...). The worker reports the value it took in its identity."""


@dataclass(frozen=True)
class EngineInfo:
    """What the core knows of one engine: the worker module that serves it, its launch settings and how they become
    the worker's command line (the environment its worker needs is its module's, `invar.transport.environment`)."""

    name: str
    module: str
    """The worker module the core starts (`python -m module`), serving the protocol."""
    settings: Mapping[str, LaunchSetting] = field(default_factory=dict)
    """The package settings that are launch options of the worker (its own command line); every other setting is
    fixed by the worker itself and only checked against its identity at handshake."""
    reported: frozenset[str] | None = None
    """The names of the settings the worker fixes itself and reports in its identity, beside its launch settings: a
    package setting named in neither is refused before any worker starts (`invar.owner_files.check_launch_settings`),
    since no worker of this engine could report it. None: not listed, so other names wait for the handshake."""
    needs: str = ""
    """What the required settings are, said when one is missing."""
    host_cores: Callable[[Mapping[str, Any], int], int | None] = field(default=lambda settings, cores: None)
    """How many of the host's `cores` one call of a worker with these settings (a prepared package's, which name
    the device the worker resolved) keeps computing; None where that is not known or the work is done elsewhere (a
    GPU, a server). `use run` lets no more calls compute at once than the cores hold (`calls_at_once_for`)."""

    def launch_args(self, settings: Mapping[str, Any], patches: Mapping[str, str],
                    patch_dirs: Mapping[str, str] | None = None) -> list[str]:
        """The worker command-line options that make this engine's worker start with `settings` and `patches`
        (reference → sha256); `patch_dirs`: where a reference's folder lies when it is not the reference itself."""
        args: list[str] = []
        for key, launch in self.settings.items():
            value = settings.get(key)
            if launch.kind is bool:
                if value is launch.flag_when:
                    args.append(launch.flag)
            elif value is not None:
                args += [launch.flag, str(value)]
        for name, sha in sorted(patches.items()):
            args += ["--patch", f"{name}={sha}"]
        for name, folder in sorted((patch_dirs or {}).items()):
            args += ["--patch-dir", f"{name}={folder}"]
        return args

    def missing(self, given: Mapping[str, Any]) -> list[str]:
        """The required launch settings that `given` lacks (or leaves null)."""
        return [name for name, launch in self.settings.items() if launch.required and given.get(name) is None]


_VLLM_BACKENDS = ("mp", "ray", "uni", "external_launcher")  # `invar.workers.vllm_worker.EXECUTOR_BACKENDS`


def _torch_threads(settings: Mapping[str, Any], cores: int) -> int | None:
    """The HF worker on the CPU computes with its `threads` (torch's intra-op threads, 1 by default)."""
    if settings.get("device", "cpu") != "cpu":
        return None
    threads = settings.get("threads", 1)
    return min(cores, threads) if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None


def _vllm_cores(settings: Mapping[str, Any], cores: int) -> int | None:
    """vLLM's CPU engine computes every step on all the host's cores (one OpenMP thread per core)."""
    return cores if settings.get("device") == "cpu" else None

ENGINE_TABLE: dict[str, EngineInfo] = {e.name: e for e in (
    # The protocol's test worker: it echoes and reports what it is told; no engine behind it.
    EngineInfo("echo", "invar.workers.echo", reported=frozenset()),
    # The HF worker passes its --device to torch: "cpu", or "cuda" where one is present (its usage line).
    EngineInfo("hf", "invar.workers.hf_worker", {
        "device": LaunchSetting("--device", str, ("cpu", "cuda"), default="cpu"),
        "threads": LaunchSetting("--threads", int, default=1),
        "attn_implementation": LaunchSetting("--attn-implementation", str, ("sdpa", "eager"))},
        reported=frozenset({"interop_threads", "deterministic_algorithms"}), host_cores=_torch_threads),
    EngineInfo("vllm", "invar.workers.vllm_worker", {
        "device": LaunchSetting("--device", str, ("auto", "cpu", "cuda"), default="auto"),
        "max_model_len": LaunchSetting("--max-model-len", int),
        "gpu_memory_utilization": LaunchSetting("--gpu-memory-utilization", float),
        "max_num_seqs": LaunchSetting("--max-num-seqs", int, default=256),
        "max_num_batched_tokens": LaunchSetting("--max-num-batched-tokens", int),
        "max_lora_rank": LaunchSetting("--max-lora-rank", int, (1, 8, 16, 32, 64, 128, 256), default=8),
        "max_loras": LaunchSetting("--max-loras", int, default=2),
        "engine_seed": LaunchSetting("--seed", int, default=0),
        "tensor_parallel_size": LaunchSetting("--tensor-parallel-size", int),
        "pipeline_parallel_size": LaunchSetting("--pipeline-parallel-size", int),
        "distributed_executor_backend": LaunchSetting("--distributed-executor-backend", str, _VLLM_BACKENDS),
        "enforce_eager": LaunchSetting("--no-enforce-eager", bool, flag_when=False, default=True)},
        host_cores=_vllm_cores,
        reported=frozenset({"logprobs_mode", "prompt_logprobs", "enable_prefix_caching", "enable_lora",
                            "lora_target_modules", "top_p", "env"})),
    EngineInfo("mlx", "invar.workers.mlx_worker", {
        "map_rope_parameters": LaunchSetting("--no-map-rope-parameters", bool, flag_when=False, default=True),
        "blas": LaunchSetting("--blas", str, ("bundled", "openblas"), default="bundled")},
        reported=frozenset({"device", "decode", "teacher_forcing", "blas_core", "blas_threads",
                            "blas_library_sha256"})),
    # llama.cpp in the worker's process, on a folder holding one GGUF file and its tokenizer; on the CPU, with its
    # --threads as the HF worker's.
    EngineInfo("llamacpp", "invar.workers.llamacpp_worker", {
        "threads": LaunchSetting("--threads", int, default=1),
        "parallel": LaunchSetting("--parallel", int, default=8),
        "context": LaunchSetting("--context", int, default=1024)},
        reported=frozenset({"device", "n_batch", "n_ubatch", "prefill", "decode", "kv_unified", "kv_cache_type",
                            "flash_attention", "sampling", "teacher_forcing"}),
        host_cores=_torch_threads),
    # An OpenAI-compatible server: where it is and what it serves; the key is named, never given (docs/endpoints.md).
    EngineInfo("openai", "invar.workers.openai_worker", {
        "base_url": LaunchSetting("--base-url", str, required=True),
        "served_model": LaunchSetting("--served-model", str, required=True),
        "api_key_env": LaunchSetting("--api-key-env", str),
        "logprobs_mode": LaunchSetting("--logprobs-mode", str, ("raw_logprobs", "processed_logprobs"),
                                       default="raw_logprobs"),
        "prompt": LaunchSetting("--prompt", str, ("ids", "text"), default="ids"),
        "max_in_flight": LaunchSetting("--max-in-flight", int, default=64),
        "request_timeout": LaunchSetting("--request-timeout", float, default=120.0),
        "retries": LaunchSetting("--retries", int, default=4)},
        reported=frozenset({"top_p", "server"}), needs="where the server is and the model id it serves"),
)}
"""Every engine the core can start, by name: the one place that says what each engine's worker is, takes and
needs. The workers keep their own command lines (they import nothing of the core beyond the protocol); a test reads
their sources and checks that they take exactly these flags, types, choices and defaults."""

ENGINES: dict[str, str] = {name: e.module for name, e in ENGINE_TABLE.items()}
"""Engine name → the worker module the core starts for it (`ENGINE_TABLE`'s; tests substitute a module here)."""

LAUNCH_SETTINGS: dict[str, Mapping[str, LaunchSetting]] = {name: e.settings for name, e in ENGINE_TABLE.items()
                                                           if e.settings}
"""Each engine's package settings that are launch options of its worker (`EngineInfo.settings`). A contract's
packages and `--setting` are checked against them before any worker starts."""


def engine_info(engine: str) -> EngineInfo:
    """The engine named `engine`; `InvarError` naming the engines there are."""
    info = ENGINE_TABLE.get(engine)
    if info is None:
        raise InvarError(f"unknown engine {engine!r}; choose one of: {', '.join(sorted(ENGINES))}")
    return info


def launch_args(engine: str, settings: Mapping[str, Any], patches: Mapping[str, str],
                patch_dirs: Mapping[str, str] | None = None) -> list[str]:
    """The worker command-line options that make a worker of `engine` start with `settings` and `patches` (none for
    an engine whose worker takes no launch settings); `patch_dirs` as `EngineInfo.launch_args` takes it."""
    info = ENGINE_TABLE.get(engine)
    return (info or EngineInfo(engine, "")).launch_args(settings, patches, patch_dirs)


def missing_settings(engine: str, given: Mapping[str, Any]) -> list[str]:
    """The required launch settings of `engine` that `given` lacks (or leaves null)."""
    info = ENGINE_TABLE.get(engine)
    return [] if info is None else info.missing(given)


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_launch_settings(engine: str, items: Sequence[str]) -> dict[str, Any]:
    """`--setting NAME=VALUE` options as the typed launch settings of `engine`'s worker, checked before any worker
    starts: an unknown name, a value of the wrong type or outside its choices is refused in one line naming what
    the engine takes."""
    declared = LAUNCH_SETTINGS.get(engine, {})
    valid = ", ".join(declared) if declared else "none"
    settings: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvarError(f"--setting {item!r}: write NAME=VALUE, e.g. threads=1 (the {engine} launch settings: "
                             f"{valid})")
        launch = declared.get(name)
        if launch is None:
            takes = f"the {engine} launch settings are: {valid}" if declared else \
                f"the {engine} worker takes no launch settings"
            raise InvarError(f"--setting {item!r}: {engine} has no launch setting {name!r}; {takes}")
        value: Any
        try:
            if launch.kind is bool:
                if text.strip().lower() not in ("true", "false"):
                    raise ValueError(text)
                value = text.strip().lower() == "true"
            elif launch.kind is int:
                if not _INTEGER.fullmatch(text.strip()):  # int() would read 1_0 as 10
                    raise ValueError(text)
                value = int(text.strip(), 10)
            elif launch.kind is float:
                if not _DECIMAL.fullmatch(text.strip()):  # float() would read 1_0, nan and inf
                    raise ValueError(text)
                value = float(text.strip())
                if not math.isfinite(value):  # 1e999
                    raise ValueError(text)
            else:
                value = text
        except ValueError:
            raise InvarError(f"--setting {item!r}: {name} takes {_KIND_NAMES[launch.kind]}, not {text!r}") from None
        if launch.choices and value not in launch.choices:
            raise InvarError(f"--setting {item!r}: {name} is one of {', '.join(str(c) for c in launch.choices)}")
        if name in settings:
            raise InvarError(f"--setting {name} is given twice; give each setting once")
        settings[name] = value
    if missing := missing_settings(engine, settings):
        needs = ENGINE_TABLE[engine].needs
        raise InvarError(f"the {engine} worker needs " + " and ".join(f"--setting {name}=…" for name in missing)
                         + (f" ({needs})" if needs else ""))
    return settings


class Transport(Protocol):
    """Where a command's workers start instead of as local subprocesses, and how many times one that is lost may
    be replaced: a Ray placement (`invar.transport.ray_relay.RayPlacement`), or in tests an in-process worker
    serving the protocol from scripted answers (tests/support/fake_worker.py). The frames, the binding and the
    records are the client's whichever transport carries them."""

    @property
    def restarts(self) -> int:
        """How many times a command may replace one lost worker before it stops (0: a loss stops it)."""
        ...

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> WorkerProcess:
        """Start the worker's command line (`invar.transport.client.Spawn`); `OSError` if it cannot start."""
        ...


DEFAULT_MODEL = HOME / "models" / "tiny-arith"
"""The shipped tiny model, the default of every command that takes `--model`."""

# The folder holding the `invar` package this process imported: the workers must import the very same core.
_IMPORT_ROOT = Path(__file__).resolve().parents[1]


def worker_defaults(engines: Iterable[str] | None = None) -> dict[str, str]:
    """The names a worker of these engines gets where its caller's environment does not set them
    (`invar.transport.environment`: every worker's, then each engine's in turn; every engine's when `engines` is
    None). A fork server sets the same in its own environment, so that a command started beside it asks for what it
    has."""
    from invar.transport.environment import worker_defaults as module_defaults

    chosen = ENGINE_TABLE.values() if engines is None else (ENGINE_TABLE[name] for name in engines)
    return module_defaults(info.module for info in chosen)


def worker_env(extra: Mapping[str, str] | None = None, engine: str | None = None) -> dict[str, str]:
    """The environment a worker of `engine` runs in: offline (no hub), quiet, small on the CPU (`worker_defaults`,
    where this environment does not set them; every engine's when `engine` is None), then `extra`."""
    env = dict(os.environ)
    for name, value in worker_defaults(None if engine not in ENGINE_TABLE else (engine,)).items():
        env.setdefault(name, value)
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
    from invar.worker_code import code_digest, search_path

    module, path = _module(engine), tuple(search_path(worker_env(env).get("PYTHONPATH"), default))
    if module.partition(".")[0] != FOLLOWED:
        return code_digest(module, path)
    # Parsing the sources is most of a digest's cost, and a `use run` or a test session asks for the same one many
    # times: it is kept for as long as no source file of the `invar` packages on the path changes, appears or goes.
    sources = _package_sources(path)
    known = _DIGESTS.get((module, path))
    if known is None or known[0] != sources:
        known = _DIGESTS[(module, path)] = (sources, code_digest(module, path))
    return known[1]


_DIGESTS: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}
"""(worker module, search path) → (`_package_sources` when computed, worker code digest)."""


def _package_sources(path: Sequence[str]) -> str:
    """sha256 of the name and bytes of every Python file of each `invar` package folder on `path`, in path order."""
    h = hashlib.sha256()
    for entry in path:
        root = os.path.join(entry, FOLLOWED)
        if not os.path.isdir(root):
            continue
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    file = os.path.join(folder, name)
                    h.update(f"{len(file)}:{file}".encode())
                    try:
                        with open(file, "rb") as fh:
                            data = fh.read()
                    except OSError:  # code_digest says what is wrong, if the worker's code includes it
                        h.update(b"-")
                        continue
                    h.update(len(data).to_bytes(8, "little"))
                    h.update(data)
    return h.hexdigest()


def check_worker_code(engine: str, expected: str, who: str, env: Mapping[str, str] | None = None) -> str:
    """Refuse, before it starts, a worker whose code is not the package's: `WorkerCodeError` naming both digests.
    Returns the digest."""
    from invar.worker_code import WorkerCodeError

    actual = worker_digest(engine, env)
    if actual != expected:
        raise WorkerCodeError(
            f"the {who} worker's code is not the package's: the {engine} worker's files ({_module(engine)} and the "
            f"invar modules it imports) have worker digest {actual}, the contract names {expected}; run the worker "
            f"code the contract names, or prepare a contract for this code (invar use package {engine} prints its "
            "digest)")
    return actual


FORKSERVER_ENV = "INVAR_FORKSERVER"
"""`invar.transport.forkserver.ENV`, named here so that a command imports the fork server's client (sockets and all,
about 18 ms) only where the variable is set."""


def _spawn(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> WorkerProcess:
    """A local worker: forked by a fork server where `INVAR_FORKSERVER` names one that serves it (its engine already
    imported, `invar.transport.forkserver`), a fresh subprocess otherwise."""
    if os.environ.get(FORKSERVER_ENV):
        from invar.transport import forkserver

        forked = forkserver.spawn(argv, env, cwd)
        if forked is not None:
            return forked
    from invar.transport.client import spawn_local

    return spawn_local(argv, env, cwd)


def worker_argv(engine: str, role: Role, args: list[str] | None = None) -> list[str]:
    module = _module(engine)
    # -P: never put the working directory on sys.path, so an `invar/` folder where `invar` runs cannot stand in
    # for the installed worker (the module resolves through PYTHONPATH, set by `worker_env` to this installation).
    return [sys.executable, "-P", "-m", module, "--role", role.value, *(args or [])]


def start_worker(
    engine: str,
    role: Role | None = None,
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
    `role`: the inference role where not given.
    """
    from invar.protocol import Role
    from invar.transport import WorkerClient
    from invar.worker_code import WorkerCodeError

    role = Role.INFERENCE if role is None else role
    if code is not None:
        check_worker_code(engine, code[0], code[1], env)
    client = WorkerClient(
        worker_argv(engine, role, args),
        name=f"{engine}-{role.value}",
        env=worker_env(env, engine),
        expected_role=role,
        expected_engine=engine,
        recorder=recorder,
        echo_stderr=echo_stderr,
        handshake_timeout=handshake_timeout,
        call_timeout=call_timeout,
        spawn=_spawn if placement is None else placement.spawn,
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
