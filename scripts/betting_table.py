"""The betting plans `use plan` reads instead of simulating them: src/invar/stats/betting_plans.json.

    .venv/bin/python scripts/betting_table.py              # simulate every listed plan, write the table
    .venv/bin/python scripts/betting_table.py --check      # simulate every plan in the table again, compare

A betting plan is a seeded simulation (seven of them: the search, the checks and the reported estimate), so it is a
pure function of its inputs: the table holds, per inputs (`planning.betting_key`), the n, the power and the runs
`planning._betting_plan` found, with the sha256 of the plans (`planning.table_digest`, checked when the table is
read) and of the simulation's source (`planning.simulation_digest`, held equal to the code's by
tests/stats/test_betting_table.py). The listed inputs: every betting row of tests/stats/fixtures/plan_figures.json,
the grid of docs/statistics.md, and the cases bench/plan_speed.py times. `--check` exits 1 naming the first plan
that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from invar.stats import planning
from invar.stats.planning import Search

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "stats" / "fixtures" / "plan_figures.json"
# (p_worse, p_better, ε, δ, power) beyond the fixture's: docs/statistics.md's grid and bench/plan_speed.py's cases
LISTED: list[tuple[float, float, float, float, float]] = [
    (0.01, 0.01, 0.005, 0.05, 0.8), (0.002, 0.002, 0.005, 0.05, 0.8), (0.005, 0.005, 0.005, 0.05, 0.8),
    (0.02, 0.02, 0.01, 0.05, 0.8), (0.02, 0.01, 0.02, 0.05, 0.8), (0.05, 0.05, 0.02, 0.05, 0.8),
    (0.1, 0.1, 0.05, 0.05, 0.8), (0.05, 0.0, 0.1, 0.05, 0.8),
    (0.01, 0.01, 0.05, 0.05, 0.8), (0.01, 0.01, 0.01, 0.05, 0.8), (0.01, 0.01, 0.002, 0.05, 0.8),
    (0.01, 0.01, 0.005, 0.01, 0.9),
]


def inputs() -> list[tuple[float, float, float, float, float]]:
    """Every listed plan's inputs, the fixture's betting rows first, each once."""
    rows = json.loads(FIXTURE.read_text())["rows"]
    fixture = [(float(r["p_worse"]), float(r["p_better"]), float(r["epsilon"]), float(r["delta"]), float(r["power"]))
               for r in rows if r["method"] == "betting"]
    return list(dict.fromkeys([*fixture, *LISTED]))


def simulated(p_worse: float, p_better: float, epsilon: float, delta: float, power: float) -> tuple[str, list[object]]:
    """(key, [n, power, runs]) of one plan, simulated (the default search: n_max 10^7, 2,000 runs, seed 0)."""
    search = Search()
    assumption = planning._assumption(p_worse, p_better, None, 0.0, -1.0, 1.0)
    plan = planning._betting_plan(assumption, epsilon, delta, power, 1, search.n_max, search.reps, search.seed)
    key = planning.betting_key(p_worse, p_better, epsilon, delta, power, search.n_max, search.reps, search.seed)
    return key, [plan.n, plan.power, plan.runs]


def parse_key(key: str) -> tuple[float, float, float, float, float]:
    """The (p_worse, p_better, ε, δ, power) of a key written with the default search."""
    words = key.split()
    search = Search()
    if words[5:] != [str(search.n_max), str(search.reps), str(search.seed)]:
        raise SystemExit(f"{key}: not the default search; this script writes and checks only that")
    p_worse, p_better, epsilon, delta, power = (float(w) for w in words[:5])
    return p_worse, p_better, epsilon, delta, power


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="simulate the table's plans again and compare")
    args = parser.parse_args()
    if args.check:
        doc = json.loads(planning.BETTING_TABLE.read_text())
        if doc["digest"] != planning.table_digest(doc["plans"]):
            print("the table's digest does not match its plans")
            return 1
        if doc["simulation"] != planning.simulation_digest():
            print("the table was simulated by other code: write it again")
            return 1
        for key, expected in doc["plans"].items():
            got = simulated(*parse_key(key))[1]
            if got != expected:
                print(f"differs: {key}: {got} (table {expected})")
                return 1
            print(f"{key}: {got}", flush=True)
        print("every plan is the table's")
        return 0
    plans: dict[str, list[object]] = {}
    for case in inputs():
        key, value = simulated(*case)
        plans[key] = value
        print(f"{key}: {value}", flush=True)
    doc = {"command": "scripts/betting_table.py", "simulation": planning.simulation_digest(),
           "digest": planning.table_digest(plans), "plans": plans}
    planning.BETTING_TABLE.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
