"""Cost of the invocation protocol: a real worker subprocess against the same function called in-process.

    .venv/bin/python bench/protocol.py [--json OUT.json]

Measures the round trip of a small call (median over many) and the throughput of a call carrying a 64 MB float32
array (one way: the worker returns a checksum; and echoed back), side by side with calling the worker's functions
directly in this process. Targets: small round trip under 200 µs; array transfer at least 500 MB/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]

from invar import canonical  # noqa: E402
from invar.transport import WorkerClient  # noqa: E402
from invar.workers import echo  # noqa: E402


def timed(fn, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--small-calls", type=int, default=5000)
    parser.add_argument("--array-mb", type=int, default=64)
    parser.add_argument("--array-repeats", type=int, default=5)
    args = parser.parse_args()

    arr = np.random.default_rng(0).standard_normal(args.array_mb * (1 << 20) // 4).astype(np.float32)
    mb = arr.nbytes / 1e6
    small = {"prompt": "37+58=", "seed": 3}

    rows = []
    with WorkerClient([sys.executable, "-m", "invar.workers.echo"], name="echo") as w:
        for _ in range(200):
            w.call("echo", small)
        sub_small = statistics.median(timed(lambda: w.call("echo", small), args.small_calls))
        w.call("checksum", {"array": arr})
        sub_one = statistics.median(timed(lambda: w.call("checksum", {"array": arr}), args.array_repeats))
        sub_echo = statistics.median(timed(lambda: w.call("echo", {"array": arr}), args.array_repeats))
        pipelined = timed(lambda: [p.result() for p in [w.submit("echo", small) for _ in range(1000)]], 3)
    # In-process: the same functions, with the same canonical encoding of params and results, minus the pipe.
    inp_small = statistics.median(timed(lambda: echo.echo(canonical.decode(canonical.encode(small))),
                                        args.small_calls))
    inp_one = statistics.median(timed(lambda: echo.checksum({"array": arr}), args.array_repeats))

    rows.append({"measure": "small call round trip (µs)", "subprocess": sub_small * 1e6, "in_process": inp_small * 1e6,
                 "ratio": sub_small / inp_small, "target": "< 200 µs"})
    rows.append({"measure": "pipelined small calls (µs/call)", "subprocess": min(pipelined) / 1000 * 1e6,
                 "in_process": inp_small * 1e6, "ratio": min(pipelined) / 1000 / inp_small, "target": ""})
    rows.append({"measure": f"{mb:.0f} MB float32 array to worker (MB/s)", "subprocess": mb / sub_one,
                 "in_process": mb / inp_one, "ratio": inp_one / sub_one, "target": "≥ 500 MB/s"})
    rows.append({"measure": f"{mb:.0f} MB float32 array echoed (MB/s, both ways)", "subprocess": 2 * mb / sub_echo,
                 "in_process": float("nan"), "ratio": float("nan"), "target": ""})

    print(f"{'measure':48} {'subprocess':>12} {'in-process':>12} {'ratio':>8}  target")
    for r in rows:
        print(f"{r['measure']:48} {r['subprocess']:12.1f} {r['in_process']:12.1f} {r['ratio']:8.2f}  {r['target']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
