"""Scale of the fuzz tests: how many frames and examples each runs, and the seed.

The fast tests run on every `make quick`; the slow ones (`-m slow`, run by CI) are the ones at scale. Both can be
raised for a long local soak, e.g. `INVAR_FUZZ_SCALE=10 pytest tests/fuzz -m slow`; the seed varies the frames.
"""

from __future__ import annotations

import os

SCALE = float(os.environ.get("INVAR_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("INVAR_FUZZ_SEED", "20240601"))


def scaled(n: int) -> int:
    """`n` examples at scale 1, more (or fewer) as INVAR_FUZZ_SCALE says."""
    return max(1, round(n * SCALE))
