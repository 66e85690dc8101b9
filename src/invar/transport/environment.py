"""What a worker process's environment holds where its caller's does not set the names, by worker module: the hub
offline, tokenizers quiet, output unbuffered, and an engine's own names. The core adds it to every worker it starts
(`invar.engines.worker_env`), and a fork server to its own environment before it imports the engine
(`invar.transport.forkserver.served_env`), so that a server started beside the commands has the environment their
workers ask for. It lives here, below both, as the one table they read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

COMMON_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                 "PYTHONUNBUFFERED": "1"}
"""Every worker: offline (no hub), quiet, unbuffered."""

MODULE_ENV: Mapping[str, Mapping[str, str]] = {
    # A small KV cache on the CPU (GiB), and vLLM's own logging kept to warnings.
    "invar.workers.vllm_worker": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"},
}
"""A worker module's own names, beside `COMMON_ENV`."""


def worker_defaults(modules: Iterable[str]) -> dict[str, str]:
    """The names a worker of these modules gets where its caller's environment does not set them: `COMMON_ENV`,
    then each module's `MODULE_ENV` in turn (the first to name a variable gives its value)."""
    defaults = dict(COMMON_ENV)
    for module in modules:
        for name, value in MODULE_ENV.get(module, {}).items():
            defaults.setdefault(name, value)
    return defaults
