"""The betting plans `use plan` reads from the generated module `invar.stats.betting_plans` are the simulation's: the
table was written by this code (its simulation digest), it is read only where its digest matches, its entries are what
the simulation plans again (the cheapest here, a sample across its sizes under `slow`, every one by
`scripts/betting_table.py --check`), and inputs outside it are simulated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from invar.stats import betting_plans, planning
from invar.stats.planning import Assumed, Search, plan_row

PLANS = betting_plans.PLANS
BY_N = sorted(PLANS, key=lambda key: PLANS[key][0])
CHEAPEST = BY_N[:4]
SPREAD = BY_N[4::6]  # a sample across the table's sizes (scripts/betting_table.py --check simulates every entry)


@pytest.fixture
def fresh_table() -> Iterator[None]:
    planning._betting_table.cache_clear()
    yield
    planning._betting_table.cache_clear()


def _inputs(key: str) -> tuple[float, float, float, float, float, int, int, int]:
    words = key.split()
    return (float(words[0]), float(words[1]), float(words[2]), float(words[3]), float(words[4]), int(words[5]),
            int(words[6]), int(words[7]))


def _simulated(key: str) -> planning._BettingPlan:
    pw, pb, eps, dlt, power, n_max, reps, seed = _inputs(key)
    assumption = planning._assumption(pw, pb, None, 0.0, -1.0, 1.0)
    return planning._betting_plan(assumption, eps, dlt, power, 1, n_max, reps, seed)


def test_the_table_is_read_and_its_digest_matches(fresh_table: None) -> None:
    assert planning.table_digest(PLANS) == betting_plans.DIGEST
    # The digest is that of the plans as JSON: the same whether they are tuples or lists.
    assert planning.table_digest({key: list(plan) for key, plan in PLANS.items()}) == betting_plans.DIGEST
    table = planning._betting_table()
    assert len(table) == len(PLANS) >= 30
    assert all(table[key] == (n, power, runs) for key, (n, power, runs) in PLANS.items())
    assert all(type(n) is int and type(power) is float and type(runs) is int for n, power, runs in table.values())


def test_the_table_was_simulated_by_this_code() -> None:
    assert planning.simulation_digest() == betting_plans.SIMULATION, (
        "the betting simulation changed since the table was written: run scripts/betting_table.py")


def test_the_table_holds_every_fixture_betting_row() -> None:
    fixture = json.loads((Path(__file__).parent / "fixtures" / "plan_figures.json").read_text())["rows"]
    search = Search()
    for row in fixture:
        if row["method"] != "betting":
            continue
        key = planning.betting_key(row["p_worse"], row["p_better"], row["epsilon"], row["delta"], row["power"],
                                   search.n_max, search.reps, search.seed)
        assert PLANS[key][:2] == (row["n"], float(row["achieved"]))


def _check(key: str) -> None:
    simulated = _simulated(key)
    assert PLANS[key] == (simulated.n, simulated.power, simulated.runs)
    pw, pb, eps, dlt, power, *_ = _inputs(key)
    read = planning._betting_planned(planning._assumption(pw, pb, None, 0.0, -1.0, 1.0), eps, dlt, power,
                                     Search().n_max, Search().reps, Search().seed)
    assert read == simulated  # the standard error too, to the bit


@pytest.mark.parametrize("key", CHEAPEST)
def test_a_table_entry_is_the_simulation(key: str) -> None:
    _check(key)


@pytest.mark.slow
@pytest.mark.parametrize("key", SPREAD)
def test_table_entries_across_its_sizes_are_the_simulation(key: str) -> None:
    _check(key)


def test_inputs_outside_the_table_are_simulated() -> None:
    assumed, search = Assumed(0.05, 0.05), Search(reps=300)
    row = plan_row("betting", assumed, 0.1, 0.05, 0.8, search=search)
    key = planning.betting_key(0.05, 0.05, 0.1, 0.05, 0.8, search.n_max, search.reps, search.seed)
    assert key not in PLANS
    simulated = _simulated(key)
    assert (row.n, row.power) == (simulated.n, simulated.power)


def test_a_table_whose_digest_does_not_match_is_not_read(monkeypatch: pytest.MonkeyPatch,
                                                          fresh_table: None) -> None:
    key = CHEAPEST[0]
    n, power_found, runs = PLANS[key]
    monkeypatch.setattr(betting_plans, "PLANS", {**PLANS, key: (n + 1, power_found, runs)})  # edited by hand
    assert planning._betting_table() == {}
    pw, pb, eps, dlt, power, *_ = _inputs(key)
    row = plan_row("betting", Assumed(pw, pb), eps, dlt, power)
    assert row.n == n  # simulated: the true figure, not the altered one
    planning._betting_table.cache_clear()
    monkeypatch.setattr(betting_plans, "PLANS", PLANS)
    monkeypatch.setattr(betting_plans, "DIGEST", "0" * 64)  # the plans as written, another digest
    assert planning._betting_table() == {}
