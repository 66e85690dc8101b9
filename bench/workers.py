"""How `invar use run` scales with worker processes per package: one contract, `--workers 1..N`, side by side.

    .venv/bin/python bench/workers.py [--workers 1,2,3] [--units 1000] [--reps 2] [--json OUT]

The contract (written and prepared here, identities probed from the installed worker): the shipped model on Hugging
Face, FP32 reference against NF4 candidate, `--units` seeded prompts at T = 1, pairing layout of batches of 16,
16 requests per call (so `--units` / 16 calls per package, ample to spread), no invariance layouts. Each repetition
runs every worker count once, in rotating order, into a fresh run directory; reported: the wall time of the whole
`use run` (worker start-up included, as a user sees it), its median per worker count, the speed-up over one worker,
and a check that every run's decision figures are identical (they must be: the records are those of one worker).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO / "src", REPO):  # run from a checkout without installing the package
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
from declarations import hf_package, write_declaration  # noqa: E402
from report import write_json  # noqa: E402

from invar import canonical  # noqa: E402
from invar.contract.admit import admit  # noqa: E402


def declaration(folder: Path, units: int) -> Path:
    return write_declaration(folder, "bench-workers", units=units, per_call=16, epsilon="0.05", seed=7,
                             reference=hf_package(), candidate=hf_package(quantization="nf4"))


def invar(*args: str | Path) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "invar.cli", *map(str, args)], capture_output=True, text=True,
                         cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(f"bench/workers.py: invar {' '.join(map(str, args))} failed: {out.stderr.strip()}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,3")
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",")]
    walls: dict[int, list[float]] = {n: [] for n in counts}
    figures: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="invar-workers-") as tmp:
        folder = Path(tmp)
        invar("use", "prepare", declaration(folder, args.units))
        contract = folder / "bench-workers.contract.json"
        for rep in range(args.reps):
            order = counts[rep % len(counts):] + counts[: rep % len(counts)]
            for n in order:
                run = folder / f"run-{rep}-{n}"
                t0 = time.perf_counter()
                invar("use", "run", contract, "--run", run, "--workers", str(n))
                walls[n].append(time.perf_counter() - t0)
                d = admit(contract, run).output().model_dump(mode="json", exclude_unset=True)
                figures.add(canonical.digest({k: d[k] for k in ("answer", "task_loss", "bound")}))
                print(f"rep {rep + 1}/{args.reps}: --workers {n}: {walls[n][-1]:.1f} s", flush=True)
    if len(figures) != 1:
        raise SystemExit("bench/workers.py: runs with different worker counts decided differently")
    base = float(np.median(walls[counts[0]]))
    result = {"units": args.units, "calls_per_package": -(-args.units // 16), "reps": args.reps,
              "identical_decisions": True,
              "workers": {str(n): {"median_s": float(np.median(w)), "runs_s": w,
                                   "speedup": base / float(np.median(w))} for n, w in walls.items()}}
    print(f"{'workers':>8} {'median s':>9} {'speed-up':>9}")
    for n in counts:
        row = result["workers"][str(n)]
        print(f"{n:8d} {row['median_s']:9.1f} {row['speedup']:9.2f}")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
