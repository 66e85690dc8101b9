"""`invar use plan`: a warning when the contract's own n is underpowered for the stated assumption, and `--plot`,
power against n per method with the contract's n and the target power."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from contract_runs import Workspace, make_workspace
from support.cli_batch import InvarSession, Ran

from invar.stats.planning import Assumed, power_at

UNITS = 200
"""The contract's n; it decides with maurer-pontil at ε = 0.05, δ = 0.05 (contract_runs' declaration)."""


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("plan"), units=UNITS)


@pytest.fixture(scope="module")
def cli() -> Iterator[InvarSession]:
    """The module's command lines run one after another in one process, each as `python -m invar.cli` runs it
    (tests/support/cli_batch.py): the CLI's start-up once."""
    with InvarSession(bound_s=300) as session:
        yield session


def _plan(cli: InvarSession, ws: Workspace, *args: str | Path) -> Ran:
    return cli.run("use", "plan", ws.contract_path, "--method", "maurer-pontil", *args)


def _json(cli: InvarSession, ws: Workspace, *args: str | Path) -> dict[str, Any]:
    out = _plan(cli, ws, *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_a_contract_whose_own_n_is_underpowered_is_warned_of(cli: InvarSession, ws: Workspace) -> None:
    assert (ws.contract.requirement.method, len(ws.plan.units)) == ("maurer-pontil", UNITS)
    doc = _json(cli, ws, "--assume", "worse=0.02 better=0.02")
    expected = power_at("maurer-pontil", UNITS, Assumed(0.02, 0.02), 0.05, 0.05)
    assert doc["rows"][0]["n"] > UNITS
    assert (doc["contract_units"], doc["contract_power"], doc["underpowered"]) == (UNITS, expected, True)
    out = _plan(cli, ws, "--assume", "worse=0.02 better=0.02")
    assert out.returncode == 0, out.stderr
    assert (f"warning: the contract's n is underpowered for this assumption: at {UNITS} units maurer-pontil admits "
            f"with probability {expected:.4f}, below the target 0.8; it needs {doc['rows'][0]['n']:,} units"
            ) in out.stdout.splitlines()


def test_a_contract_with_enough_units_is_not_warned_of(cli: InvarSession, tmp_path: Path) -> None:
    big = make_workspace(tmp_path, units=600)
    doc = _json(cli, big, "--assume", "worse=0.001 better=0.001")
    expected = power_at("maurer-pontil", 600, Assumed(0.001, 0.001), 0.05, 0.05)
    assert doc["rows"][0]["n"] <= 600
    assert (doc["contract_power"], doc["underpowered"]) == (expected, False)
    assert expected >= 0.8
    out = _plan(cli, big, "--assume", "worse=0.001 better=0.001").stdout
    assert "warning" not in out
    assert f"at its 600 units maurer-pontil admits with probability {expected:.4f} under this assumption" in out


def test_plot_draws_power_against_n(cli: InvarSession, ws: Workspace, tmp_path: Path) -> None:
    import matplotlib.image

    png = tmp_path / "power.png"
    out = _plan(cli, ws, "--assume", "worse=0.02 better=0.02", "--plot", png)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"power curves: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] > 300
    assert pixels.shape[1] > 600
    assert float(np.std(pixels[..., :3])) > 0.05  # drawn on, not blank
    assert _json(cli, ws, "--assume", "worse=0.02 better=0.02", "--plot", png)["plot"] == str(png)


def test_the_contracts_power_beside_the_table_is_the_power_after_it(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several methods `use plan` computes the contract's own power beside the methods' plans (in their pool,
    forked); the plan is the one computed after the table, as before."""
    from invar.contract import sample_size
    from invar.parallel import forked

    stated = {"p_worse": 0.03, "p_better": 0.03}  # the z-test's n is 148: the contract's 200 is below twice it
    methods = ["hoeffding", "maurer-pontil", "paired-binary-exact"]
    asked: list[bool] = []
    beside = sample_size._contract_power_beside

    def counted(*args: Any) -> Any:
        call = beside(*args)
        asked.append(call is not None)
        return call

    monkeypatch.setattr(sample_size, "_contract_power_beside", counted)
    with forked():
        planned = sample_size.plan_sample_size(ws.contract_path, stated, 0.8, methods, sequential_max=None, plot=None)
    assert asked == [True]
    monkeypatch.setattr(sample_size, "_contract_power_beside", lambda *args: None)
    with forked():
        after = sample_size.plan_sample_size(ws.contract_path, stated, 0.8, methods, sequential_max=None, plot=None)
    assert planned.output == after.output
    assert planned.output.contract_power == power_at("maurer-pontil", UNITS, Assumed(0.03, 0.03), 0.05, 0.05)
    # one method: beside an exact method's plan, not beside Hoeffding's (`CLOSED_FORMS`: the power follows it)
    monkeypatch.setattr(sample_size, "_contract_power_beside", counted)
    for one, wanted in (["paired-binary-exact"], True), (["hoeffding"], False):
        asked.clear()
        with forked():
            alone = sample_size.plan_sample_size(ws.contract_path, stated, 0.8, one, sequential_max=None, plot=None)
        assert asked == [wanted]
        assert alone.output.contract_power == planned.output.contract_power
