"""A worker refuses to start, before any handshake, when its patch arguments do not name the patch it would run."""

from __future__ import annotations

import subprocess

import pytest
from patch_helpers import patch_args

from invar.engines import worker_argv, worker_env
from invar.patches import patch_digest
from invar.protocol import Role

pytestmark = pytest.mark.engine


def start(engine: str, args: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(worker_argv(engine, Role.INFERENCE, args), env=worker_env(), capture_output=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_wrong_patch_digest_refuses_to_start(engine: str) -> None:
    wrong = "0" * 64
    done = start(engine, ["--patch", f"fixed-block={wrong}"])
    assert done.returncode == 2
    assert done.stdout == b"", "no handshake may be sent"
    message = done.stderr.decode()
    assert "fixed-block" in message
    assert wrong in message
    assert patch_digest("fixed-block") in message


@pytest.mark.parametrize("args", [["--patch", "no-such-patch=" + "0" * 64], ["--patch", "fixed-block"],
                                  ["--patch-poison", "fixed-block"],
                                  [*patch_args("fixed-block"), *patch_args("split-k")]])
def test_bad_patch_arguments_refuse_to_start(args: list[str]) -> None:
    """Checked by the code both workers share (invar.workers.common.load_patches); the vLLM worker runs it before it
    imports vLLM, so it answers fastest."""
    done = start("vllm", args)
    assert done.returncode == 2
    assert done.stdout == b""
    assert done.stderr.decode().count("\n") == 1, "one line saying what is wrong"

