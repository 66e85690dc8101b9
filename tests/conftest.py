"""Shared fixtures: paths of the repository and the worker command lines."""

from __future__ import annotations

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

