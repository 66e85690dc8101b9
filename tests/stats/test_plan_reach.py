"""A plan whose n lies far beyond what the search may reach is refused at once, in one line naming the n it would
need, instead of searching for minutes and failing; and that refusal never stands where a method plans."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from invar.stats import planning
from invar.stats.bounds import METHODS, StatisticsError
from invar.stats.planning import Assumed, plan_row

FIXTURE = Path(__file__).parent / "fixtures" / "plan_figures.json"


@pytest.mark.parametrize("method", METHODS)
def test_an_increase_next_to_epsilon_is_refused_at_once_naming_the_n_it_needs(method: str) -> None:
    started = time.process_time()
    with pytest.raises(StatisticsError) as refused:
        plan_row(method, Assumed(0.01495, 0.01), 0.005, 0.05, 0.8)
    assert time.process_time() - started < 1.0  # the search at n_max took minutes, or hours for the exact methods
    message = str(refused.value)
    assert "\n" not in message
    assert "61,641,325 units" in message  # the z-test's n: 0.02495 · ((z_0.95 + z_0.8) / 5e-5)^2
    assert "10,000,000" in message


def test_every_recorded_plan_lies_well_within_the_refusal() -> None:
    # each method's planned n against the z-test's: the refusal stands only past REACH_FACTOR times n_max, far
    # beyond any ratio a method has (the smallest here is paired-binary-score's, 0.93)
    for row in json.loads(FIXTURE.read_text())["rows"]:
        if "variance" in row:
            assumed = planning._assumption(None, None, row["variance"], row["mean"], -1.0, 1.0)
        else:
            assumed = planning._assumption(row["p_worse"], row["p_better"], None, 0.0, -1.0, 1.0)
        guess = planning._normal_guess(assumed, row["epsilon"], row["delta"], row["power"])
        assert row["n"] >= guess / planning.REACH_FACTOR, row
