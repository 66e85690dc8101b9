"""The MLX worker with one sabotage, chosen by the environment variable INVAR_SABOTAGE, so the training loop's
refusals can be tested on real engine numbers:

- `wrong-loss`: the learner reports its loss 1e-3 too high;
- `other-digest`: the inference engine names another checkpoint than the one it sampled from (from cycle 1 on);
- `corrupt-adapter`: the learner flips one byte of a tensor in its saved adapter and reports the folder's new
  digest, as a learner whose file was damaged after it checked it would;
- `slow-load`: the inference worker answers `load_model` `SLOW_LOAD_S` seconds late (a slow model load);
- `learner-dies`: the learner process exits (code 3) two seconds after its imports, before its handshake.

    python -m tests.runner.sabotaged_mlx --role inference|learner
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from invar import canonical
from invar.formats.checkpoint import PEFT_WEIGHTS
from invar.protocol import Role
from invar.protocol.payloads import (
    GenerateParams,
    GenerateResult,
    LearnerStepParams,
    LearnerStepResult,
    LoadModelParams,
    LoadModelResult,
)
from invar.workers import mlx_worker

MODE = os.environ.get("INVAR_SABOTAGE", "")
SLOW_LOAD_S = 4.0

_learner_step = mlx_worker.Engine.learner_step
_load_model = mlx_worker.Engine.load_model
_generate = mlx_worker.Engine.generate


def learner_step(self: mlx_worker.Engine, params: LearnerStepParams) -> LearnerStepResult:
    result = _learner_step(self, params)
    if MODE == "wrong-loss":
        result = replace(result, loss=result.loss + 1e-3)
    if MODE == "corrupt-adapter":
        weights = Path(result.adapter_dir) / PEFT_WEIGHTS
        raw = bytearray(weights.read_bytes())
        raw[-3] ^= 0x01
        weights.write_bytes(bytes(raw))
        result = replace(result, adapter_digest=canonical.tree_digest(result.adapter_dir))
    return result


def generate(self: mlx_worker.Engine, params: GenerateParams) -> GenerateResult:
    result = _generate(self, params)
    if MODE == "other-digest" and result.adapter_digest is not None:
        result = replace(result, adapter_digest="0" * 64)
    return result


def load_model(self: mlx_worker.Engine, params: LoadModelParams) -> LoadModelResult:
    if MODE == "slow-load" and self.role is Role.INFERENCE:
        time.sleep(SLOW_LOAD_S)
    return _load_model(self, params)


mlx_worker.Engine.load_model = load_model  # type: ignore[method-assign]
mlx_worker.Engine.learner_step = learner_step  # type: ignore[method-assign]
mlx_worker.Engine.generate = generate  # type: ignore[method-assign]

if __name__ == "__main__":
    if MODE == "learner-dies" and Role.LEARNER.value in sys.argv:
        time.sleep(2.0)
        os._exit(3)
    sys.exit(mlx_worker.main())
