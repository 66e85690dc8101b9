"""The planner's figures on a grid of (assumption, ε, δ, power, method), as JSON: the fixture that holds `use plan`'s
numbers fixed while its search is made faster (tests/stats/test_plan_figures.py compares against it).

    PYTHONPATH=OLD/src .venv/bin/python scripts/plan_figures.py --out tests/stats/fixtures/plan_figures.json

Each row: the inputs, the planned n and the power as `repr` of the float (every bit), from `plan_row` with the
default search (n_max 10^7, 2000 betting runs, seed 0). `--check FILE` recomputes every row with the `invar` this
Python imports and exits 1 naming the first row that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from invar.stats.planning import Assumed, plan_row

METHODS = ("hoeffding", "maurer-pontil", "betting", "paired-binary-exact", "paired-binary-score")
# (p_worse, p_better) or ("variance", variance, mean); each with the ε it is planned at
ASSUMPTIONS: list[tuple[tuple[float, ...], float]] = [
    ((0.01, 0.01), 0.02), ((0.002, 0.002), 0.005), ((0.02, 0.02), 0.01), ((0.05, 0.05), 0.02),
    ((0.003, 0.001), 0.005), ((0.0, 0.01), 0.005), ((0.1, 0.05), 0.1),
]
SETTINGS = [(0.05, 0.8), (0.01, 0.9), (0.1, 0.5)]


def grid() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for values, epsilon in ASSUMPTIONS:
        for delta, power in SETTINGS:
            for method in METHODS:
                rows.append({"p_worse": values[0], "p_better": values[1], "epsilon": epsilon, "delta": delta,
                             "power": power, "method": method})
    for delta, power in SETTINGS:  # a variance assumption: Hoeffding and Maurer-Pontil only
        for method in METHODS[:2]:
            rows.append({"variance": 0.02, "mean": 0.0, "epsilon": 0.01, "delta": delta, "power": power,
                         "method": method})
    return rows


def figure(row: dict[str, object]) -> dict[str, object]:
    if "variance" in row:
        assumed = Assumed(variance=float(row["variance"]), mean=float(row["mean"]))  # type: ignore[arg-type]
    else:
        assumed = Assumed(float(row["p_worse"]), float(row["p_better"]))  # type: ignore[arg-type]
    got = plan_row(str(row["method"]), assumed, float(row["epsilon"]), float(row["delta"]),  # type: ignore[arg-type]
                   float(row["power"]))  # type: ignore[arg-type]
    return {**row, "n": got.n, "achieved": repr(got.power), "basis": got.basis}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--check", type=Path)
    args = parser.parse_args()
    if args.check is not None:
        for expected in json.loads(args.check.read_text())["rows"]:
            inputs = {k: v for k, v in expected.items() if k not in ("n", "achieved", "basis")}
            got = figure(inputs)
            if got != expected:
                print(f"differs: {inputs}: {got['n']}, {got['achieved']} (fixture {expected['n']}, "
                      f"{expected['achieved']})")
                return 1
        print("every figure is the fixture's")
        return 0
    rows = []
    for row in grid():
        rows.append(figure(row))
        print(json.dumps(rows[-1]), flush=True)
    doc = {"command": "PYTHONPATH=OLD/src .venv/bin/python scripts/plan_figures.py --out " + str(args.out),
           "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
