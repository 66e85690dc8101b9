"""Where the whole machine's CPU goes while the test suite runs, per test file and per test.

`/usr/bin/time` around the suite counts only the processes it waits for: Ray's node processes (raylets, agents, the
workers its relays start) are daemons nobody waits for. This charges every CPU sample of the machine to the test its
lane was running at that moment, the lane found through the sampled process's ancestry (perf's own fork events) or,
for a worker forked by a lane's fork server, through the server's log line naming the test that asked for it.

    mkdir -p OUT/timeline OUT/forklogs
    perf record -a -F 25 -o OUT/perf.data &                     # the whole machine, 25 samples a second per core
    SUITE_CPU_TIMELINE=OUT/timeline PYTHONPATH=scripts \\
        python scripts/test_lanes.py -q --durations=0 -p suite_cpu --keep-forkserver-logs OUT/forklogs
    kill -INT %1
    perf script -i OUT/perf.data --show-task-events -F comm,pid,tid,time,period > OUT/perf.txt
    python scripts/suite_cpu.py OUT/perf.txt OUT/timeline OUT/forklogs --json OUT/cpu.json

As a pytest plugin (`-p suite_cpu`, with scripts/ on PYTHONPATH) it writes when each test starts, on the wall
clock, to a file per pytest process in `SUITE_CPU_TIMELINE` (a test runs until the next one starts). perf's sample
times are on the monotonic clock; they are put on the wall clock with this machine's offset between the two, read
when the report is made (the machine must not have been suspended in between).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from test_lanes import forked_for  # scripts/, on the path as this file's folder or PYTHONPATH

TIMELINE_ENV = "SUITE_CPU_TIMELINE"
_out: IO[str] | None = None


def _timeline() -> IO[str] | None:
    global _out
    folder = os.environ.get(TIMELINE_ENV)
    if folder and _out is None:
        _out = open(Path(folder) / f"{os.getpid()}.log", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    return _out


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if (out := _timeline()) is not None:
        out.write(f"{time.time():.3f} {nodeid}\n")


@dataclass
class Lane:
    starts: list[float]
    tests: list[str]

    def at(self, t: float) -> str:
        """The test running at `t` (the last one started: a gap between tests is charged to the one before)."""
        i = bisect.bisect_right(self.starts, t) - 1
        return self.tests[i] if i >= 0 else "(collection)"


def read_lanes(folder: Path) -> dict[int, Lane]:
    lanes = {}
    for log in sorted(folder.glob("*.log")):
        spans = sorted((float(t), node) for t, node in
                       (line.split(" ", 1) for line in log.read_text(encoding="utf-8").splitlines()))
        lanes[int(log.stem)] = Lane([t for t, _ in spans], [node for _, node in spans])
    return lanes


def read_forked(folder: Path) -> dict[int, str]:
    """Forked worker pid → the test that asked for it, from the fork servers' logs."""
    return {pid: test for log in folder.glob("*.log")
            for pid, test in forked_for(log.read_text(encoding="utf-8", errors="replace").splitlines()).items()}


_FORK = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")


def charge(perf_txt: Path, lanes: dict[int, Lane], forked: dict[int, str], offset: float) -> dict[str, object]:
    node_lane = {node: pid for pid, lane in lanes.items() for node in lane.tests}
    parent: dict[int, int] = {}
    cache: dict[int, int | None] = {}

    def lane_of(pid: int) -> int | None:
        if pid not in cache:
            found, q = None, pid
            for _ in range(64):
                if q in lanes:
                    found = q
                    break
                if q in forked:
                    found = node_lane.get(forked[q])
                    break
                if q not in parent:
                    break
                q = parent[q]
            cache[pid] = found
        return cache[pid]

    per_test: defaultdict[str, float] = defaultdict(float)
    outside: defaultdict[str, float] = defaultdict(float)
    idle = busy = 0.0
    with perf_txt.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if "PERF_RECORD" in line:
                m = _FORK.search(line)
                if m and m.group(1) == m.group(2) and m.group(1) != m.group(3):  # a process, not a thread
                    parent[int(m.group(1))] = int(m.group(3))
                continue
            words = line.split()
            try:  # comm... pid/tid time: period
                pid, t = int(words[-3].split("/")[0]), float(words[-2].rstrip(":"))
                period = int(words[-1]) / 1e9
            except (ValueError, IndexError):
                continue
            if pid == 0:
                idle += period
                continue
            busy += period
            lane = lane_of(pid)
            if lane is None:
                outside[" ".join(words[:-3])] += period
            else:
                per_test[lanes[lane].at(t + offset)] += period
    per_file: defaultdict[str, float] = defaultdict(float)
    for node, s in per_test.items():
        per_file[node.split("::")[0]] += s

    def ranked(table: dict[str, float], n: int | None = None) -> dict[str, float]:
        return {k: round(v, 1) for k, v in sorted(table.items(), key=lambda kv: -kv[1])[:n]}

    return {"busy_cpu_s": round(busy, 1), "idle_cpu_s": round(idle, 1),
            "outside_lanes_cpu_s": round(sum(outside.values()), 1), "outside_lanes": ranked(outside, 20),
            "per_file": ranked(per_file), "per_test": ranked(per_test)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("perf_txt", type=Path, help="perf script --show-task-events -F comm,pid,tid,time,period")
    parser.add_argument("timeline", type=Path, help="the folder SUITE_CPU_TIMELINE named")
    parser.add_argument("forklogs", type=Path, help="the fork servers' logs (test_lanes.py --keep-forkserver-logs)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    offset = time.time() - time.monotonic()
    report = charge(args.perf_txt, read_lanes(args.timeline), read_forked(args.forklogs), offset)
    print(f"busy {report['busy_cpu_s']} CPU-s, idle {report['idle_cpu_s']}, outside the lanes "
          f"{report['outside_lanes_cpu_s']}")
    for title in ("per_file", "per_test"):
        table = report[title]
        assert isinstance(table, dict)
        print(f"\n{title.replace('_', ' ')}:")
        for name, s in list(table.items())[:args.top]:
            print(f"{s:8.1f}  {name}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
