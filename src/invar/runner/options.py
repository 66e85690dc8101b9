"""Request options, checked before any worker starts.

A value a worker cannot honour exactly is refused here, never reinterpreted: a temperature of NaN that an engine
would quietly treat as 1 would leave records saying T = NaN for samples drawn at T = 1. Every check names the option
and the range it accepts, so a user can fix it from the message alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from invar.errors import InvarError
from invar.regular_files import read_model_file

SEED_MAX = (1 << 63) - 1
"""Per-request seeds are 63-bit, as every engine's generator takes them (and as plan seeds are derived)."""
TEMPERATURE_MAX = 10.0
COUNT_MAX = (1 << 31) - 1
"""The most tokens a response, or requests a batch, may ask for: a 32-bit count (a record holds 64-bit integers)."""
CALL_TIMEOUT_MAX = 7 * 24 * 3600.0
"""A week: a longer wait for one worker call is a mistake (1e30 s would overflow the timers that wait)."""


def check_sampling(*, temperature: float, top_p: float, max_tokens: int, seeds: tuple[int, ...] = (),
                   batch_size: int | None = None, call_timeout: float | None = None) -> None:
    """Refuse, with one line naming the option, anything an engine could not honour exactly."""
    if not math.isfinite(temperature) or not 0.0 <= temperature <= TEMPERATURE_MAX:
        raise InvarError(f"--temperature {temperature}: must be a finite number in [0, {TEMPERATURE_MAX:g}] "
                         "(0 is greedy)")
    if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
        raise InvarError(f"--top-p {top_p}: must be in (0, 1]")
    if max_tokens < 1:
        raise InvarError(f"--max-tokens {max_tokens}: must be at least 1")
    if max_tokens > COUNT_MAX:
        raise InvarError(f"--max-tokens {max_tokens}: must be at most 2^31 − 1")
    for seed in seeds:
        if not 0 <= seed <= SEED_MAX:
            raise InvarError(f"--seed {seed}: request seeds must be in [0, 2^63 − 1]; choose a smaller seed")
    if batch_size is not None and batch_size < 1:
        raise InvarError(f"--batch-size {batch_size}: must be at least 1")
    if batch_size is not None and batch_size > COUNT_MAX:
        raise InvarError(f"--batch-size {batch_size}: must be at most 2^31 − 1")
    if call_timeout is not None and (not math.isfinite(call_timeout) or not 0 < call_timeout <= CALL_TIMEOUT_MAX):
        raise InvarError(f"--call-timeout {call_timeout}: must be a positive number of seconds, at most "
                         f"{CALL_TIMEOUT_MAX:g} (a week)")


def model_context(model_dir: Path) -> int | None:
    """The model's context length (`max_position_embeddings` in config.json), or None where it is not stated.
    A config.json that is not a regular file or is past its bound is refused (`ContractError`), never waited on."""
    path = model_dir / "config.json"
    if not path.exists():
        return None
    try:
        config = json.loads(read_model_file(path).decode("utf-8"))
    except ValueError:  # not JSON, not UTF-8: the engine says what it makes of it
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def check_context(prompt_tokens: int, max_tokens: int, context: int | None, where: str) -> None:
    """A prompt and its longest response must fit the model's context."""
    if context is not None and prompt_tokens + max_tokens > context:
        raise InvarError(f"{where}: {prompt_tokens} prompt tokens + --max-tokens {max_tokens} exceed the model's "
                         f"context of {context} tokens; lower --max-tokens or shorten the prompt")
