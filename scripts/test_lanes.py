"""Run the whole test suite as two pytest sessions side by side, the way `make test` does.

    python scripts/test_lanes.py [PYTEST ARGS...]

The first lane holds the folders of `FIRST_LANE`: the tests that compute in their own process alone (statistics,
fuzzing, contracts, records, the protocol's frames, the loop's arithmetic) and the engine workers' own tests, the
real model's and the patches'; the second lane holds the rest (the runners, the command line, comparisons,
benchmarks). The two take about as long. A test that starts an engine spends much of its wall time on one core (a
worker's imports, its start-up, the model load, Python between calls), so the other lane uses the other core
instead of waiting. Session fixtures are defined per folder (tests/workers/conftest.py, tests/models/conftest.py,
...), and a folder is in one lane, so every engine start or model build a session fixture makes is made once, as
in a single session.

The second lane prints as it goes; the first lane's output follows it, whole. The exit status is the first non-zero
of the two (pytest's own codes), so a failure in either fails the suite. Extra arguments go to both sessions.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_LANE = ("contract", "fuzz", "loop", "protocol", "records", "stats", "tasks", "typing",
              "anymodel", "models", "patches", "workers")
"""Folders of tests/ run in the first lane, chosen from `--durations` so that both lanes take about as long."""


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    first = [f"tests/{name}" for name in FIRST_LANE]
    # Both sessions collect tests/ and leave out the other's part, so each collects in the order one session would
    # (the test folders' conftest modules share a name, and `from conftest import` finds the one collected first).
    second = [f"tests/{p.name}" for p in sorted((ROOT / "tests").iterdir()) if p.name not in FIRST_LANE
              and (p.name.startswith("test_") or (p.is_dir() and p.name not in ("support", "__pycache__")))]
    with tempfile.TemporaryDirectory(prefix="invar-first-lane-") as scratch:
        log = Path(scratch) / "first.log"
        started = time.monotonic()
        with log.open("wb") as out:
            # Its own base temp folder and no cache: the two sessions share nothing on disk.
            first_proc = subprocess.Popen([*pytest, "-p", "no:cacheprovider", f"--basetemp={scratch}/tmp",
                                           *(f"--ignore={p}" for p in second), *argv],
                                          cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            print(f"test lanes: the first lane ({', '.join(first)}) runs beside this one; its output follows",
                  flush=True)
            second_code = subprocess.call([*pytest, *(f"--ignore={p}" for p in first), *argv], cwd=ROOT)
            second_s = time.monotonic() - started
            first_code = first_proc.wait()
        finally:
            if first_proc.poll() is None:
                first_proc.kill()
                first_proc.wait()
        total_s = time.monotonic() - started
        sys.stdout.write(f"\n===== the first lane ({', '.join(first)}) =====\n")
        sys.stdout.write(log.read_text(encoding="utf-8", errors="replace"))
    print(f"test lanes: second lane exit {second_code} after {second_s:.0f} s, first lane exit {first_code} after "
          f"{total_s:.0f} s in all", flush=True)
    return next((code for code in (second_code, first_code) if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
