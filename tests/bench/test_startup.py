"""bench/startup.py: the CPU time read from a live worker's /proc entry at its handshake is the CPU time it has
used so far, the same count its resource usage gives once it has been waited for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))  # last: bench/workers.py must not shadow the workers package

import startup  # noqa: E402

BURN = """
import sys, time
end = time.process_time() + 0.4
while time.process_time() < end:
    pass
print("ready", flush=True)
sys.stdin.read()  # waits, using no CPU, as a worker does after its handshake
"""


def test_a_live_process_cpu_time_is_what_it_has_used_so_far() -> None:
    before = startup.children_cpu()
    proc = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdin is not None
    assert proc.stdout.readline() == "ready\n"
    at_ready = startup.process_cpu(proc.pid)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    whole = startup.children_cpu() - before
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # The burn alone, in clock ticks: /proc's user and system times each round down to a tick (seen: 0.39).
    assert at_ready >= 0.4 - 2 * tick
    assert whole >= at_ready - 2 * tick  # the whole counts everything up to the exit
    assert whole - at_ready < 0.2  # after "ready" it only waited and exited
