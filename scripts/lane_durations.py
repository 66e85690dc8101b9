"""Per-file durations of a `scripts/test_lanes.py --durations=0` run, and each lane's sum by `FIRST_LANE`.

    python scripts/test_lanes.py -q --durations=0 > suite.txt 2>&1
    python scripts/lane_durations.py suite.txt [--top 40] [--markdown]

pytest prints one line per phase of each test (`12.34s call     tests/x/test_y.py::test_z[p]`); this sums the
setup, call and teardown lines by file and prints the files, slowest first, with the lane `FIRST_LANE` puts each
in, then each lane's sum. A session fixture's set-up is charged to the first test that asked for it, so a file's
sum includes the engine starts and model builds its folder's fixtures made for it. The sums are wall time inside
pytest: the lanes run side by side on 2 cores, so a file's sum is larger than it would be alone by the other
lane's load at that time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lanes import FIRST_LANE

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(tests/\S+?\.py)::")


def per_file(text: str) -> dict[str, float]:
    """Seconds per test file: the sum of its tests' setup, call and teardown lines (each counted once)."""
    seen: set[str] = set()
    sums: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = LINE.match(line)
        if match and line not in seen:
            seen.add(line)
            sums[match.group(3)] += float(match.group(1))
    return dict(sums)


def lane_of(path: str) -> int:
    """1 for a file `FIRST_LANE` names (itself or a folder above it), else 2."""
    rel = path.removeprefix("tests/")
    return 1 if any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in FIRST_LANE) else 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the saved output of scripts/test_lanes.py --durations=0")
    parser.add_argument("--top", type=int, default=40, help="how many files to list (default 40)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    if not args.output.is_file():
        print(f"lane_durations: {args.output} is not a file: give the saved output of a --durations=0 run",
              file=sys.stderr)
        return 2
    sums = per_file(args.output.read_text(encoding="utf-8", errors="replace"))
    if not sums:
        print(f"lane_durations: {args.output} holds no durations: run scripts/test_lanes.py with --durations=0",
              file=sys.stderr)
        return 2
    ranked = sorted(sums.items(), key=lambda kv: -kv[1])
    if args.markdown:
        print("| file | lane | s |\n|---|---|---:|")
    for path, seconds in ranked[:args.top]:
        print(f"| `{path}` | {lane_of(path)} | {seconds:,.0f} |" if args.markdown
              else f"{seconds:8.1f}  lane {lane_of(path)}  {path}")
    lanes = {n: sum(s for p, s in sums.items() if lane_of(p) == n) for n in (1, 2)}
    print(f"\n{len(sums)} files; lane 1 {lanes[1]:,.0f} s, lane 2 {lanes[2]:,.0f} s by their tests' durations")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
