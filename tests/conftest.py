"""Shared fixtures: paths of the repository and the worker command lines."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Engines must never reach for a hub: every model is the project's own.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# A suite started in the background by a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored, and
# so does every `invar` it starts: the Ctrl-C tests would then see a command that never hears Ctrl-C. They test a
# command run from a terminal, where Python's own handler is installed.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


BUILD_SMOLLM2 = ROOT / "scripts" / "build_smollm2.py"
SMOLLM2_FOLDERS = ("smollm2-135m-instruct", "smollm2-135m-instruct-mlx", "smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def smollm2_build() -> tuple[Path, Path, Path]:
    """The real model's three folders (float32, its mlx-lm copy, the shipped Q4_1 GGUF), built or checked against the
    pins by `scripts/build_smollm2.py` before any test reads them: a no-op once `models/` matches the pins. The
    suite's two lanes may both ask at once, so the build holds a lock and the later one finds the folders pinned. A
    build that cannot run fails the test with the script's own message; it is never skipped."""
    (ROOT / "models").mkdir(exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with (ROOT / "models" / ".smollm2-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, str(BUILD_SMOLLM2)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=1800, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        pytest.fail(f"{BUILD_SMOLLM2.name} exited {done.returncode}: {' | '.join(lines[-3:])}", pytrace=False)
    full, mlx, gguf = (ROOT / "models" / name for name in SMOLLM2_FOLDERS)
    return full, mlx, gguf


def python_argv(*args: str) -> list[str]:
    """A command line that runs this interpreter with the repository importable."""
    return [sys.executable, *args]


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mounts small tmpfs of our own (CI and these machines run as root), to make a full disk and read-only media real:
    `mount_tmpfs("256k")` is the folder of a fresh one, unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=True)

