"""A process's memory and CPU time as Linux's /proc reports them, for the benchmarks that watch a worker."""

from __future__ import annotations

import os
from pathlib import Path


def status_kib(pid: int, field: str) -> int:
    """A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`: the peak resident set)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def cpu_s(pid: int) -> float:
    """The process's own CPU seconds, user + system (`/proc/PID/stat` fields 14 and 15)."""
    # The command name may hold spaces or parentheses: the fields are counted after its closing one.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
