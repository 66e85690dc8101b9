"""A worker forked from a fork server (`invar.transport.forkserver`) computes what a fresh worker of its engine does:
the same `invar evaluate` run through each gives the same tokens and bit-identical log-probabilities, from the
same worker code, on the real HF, MLX and vLLM engines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from invar import engines
from invar.records import RunStore
from invar.transport import forkserver

pytestmark = pytest.mark.engine


def _evaluate(run: Path, engine: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "invar.cli", "evaluate", "--engine", engine, "--count", "24",
                           "--seed", "5", "--run", str(run), "--json", "--quiet"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("engine", ["hf", "mlx", "vllm"])
def test_a_forked_worker_evaluates_bit_for_bit_as_a_fresh_one(engine: str, tmp_path: Path) -> None:
    module, folder = engines.ENGINES[engine], tmp_path / "fs"
    with (tmp_path / "fs.log").open("wb") as log:
        server = forkserver.start(folder, module, engines.worker_env(None, engine), log)
    try:
        deadline = time.monotonic() + 300
        while not forkserver.socket_path(folder, module).exists():
            assert server.poll() is None, (tmp_path / "fs.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        fresh_env = {k: v for k, v in os.environ.items() if k != forkserver.ENV}
        fresh = _evaluate(tmp_path / "fresh", engine, fresh_env)
        forked = _evaluate(tmp_path / "forked", engine, {**fresh_env, forkserver.ENV: str(folder)})
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert "1 workers forked, 0 refused" in (tmp_path / "fs.log").read_text()

    same = {k for k in fresh if k not in ("run", "chain_head", "wall_s", "generate_s")}
    assert {k: forked[k] for k in same} == {k: fresh[k] for k in same}
    identities = []
    for run in ("fresh", "forked"):
        with RunStore.open(tmp_path / run) as store:
            (ident,) = store.workers().values()
            identities.append(ident)
    assert identities[0].worker == identities[1].worker
    assert identities[0].worker is not None
    assert identities[0].worker["digest"] == engines.worker_digest(engine)
    assert identities[0].pid != identities[1].pid

    done = subprocess.run([sys.executable, "-m", "invar.cli", "compare", "numerical", str(tmp_path / "fresh"),
                           str(tmp_path / "forked"), "--json", "--quiet"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    generation = json.loads(done.stdout)["generation"]
    assert generation["units"] == 24
    assert generation["tokens_identical"] == 24
    assert generation["logprobs_identical_over_shared_prefix"] == 24
    assert generation["max_ulp"]["max"] == 0.0
