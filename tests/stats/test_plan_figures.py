"""`use plan`'s figures stay exactly what they were: the planner's n and power (every bit) on a grid of assumptions,
ε, δ, power and methods, against a fixture computed with the code of cfd6d2f (`scripts/plan_figures.py`, whose
`--check` recomputes all 111 rows; here the rows that plan small n, in seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from invar.stats.planning import Assumed, plan_row

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "plan_figures.json").read_text())["rows"]
QUICK = [row for row in FIXTURE if row["n"] <= 600 or row["method"] in ("hoeffding", "maurer-pontil")]


def _key(row: dict[str, Any]) -> str:
    what = f"var{row['variance']}" if "variance" in row else f"{row['p_worse']}/{row['p_better']}"
    return f"{row['method']}-{what}-eps{row['epsilon']}-delta{row['delta']}-power{row['power']}"


@pytest.mark.parametrize("row", QUICK, ids=_key)
def test_plan_gives_the_fixture_figures(row: dict[str, Any]) -> None:
    if "variance" in row:
        assumed = Assumed(variance=row["variance"], mean=row["mean"])
    else:
        assumed = Assumed(row["p_worse"], row["p_better"])
    got = plan_row(row["method"], assumed, row["epsilon"], row["delta"], row["power"])
    assert (got.n, repr(got.power), got.basis) == (row["n"], row["achieved"], row["basis"])


def test_the_fixture_covers_every_method_and_setting() -> None:
    assert {row["method"] for row in QUICK} == {"hoeffding", "maurer-pontil", "betting", "paired-binary-exact",
                                                "paired-binary-score"}
    assert {(row["delta"], row["power"]) for row in QUICK} == {(0.05, 0.8), (0.01, 0.9), (0.1, 0.5)}
    assert any("variance" in row for row in QUICK)
