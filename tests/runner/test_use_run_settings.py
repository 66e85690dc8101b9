"""A package setting that no worker of its engine reports is refused when the contract is read, before any worker
starts (issue 51: the worker started, loaded its engine, and only its handshake identity was refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract.contract_runs import make_workspace
from support.fake_worker import ENGINE_VERSION, FakeTransport

from invar.errors import ContractError
from invar.runner.use_run import use_run


def test_an_unknown_package_setting_starts_no_worker(tmp_path: Path) -> None:
    transport = FakeTransport()

    def prepare_and_run() -> None:  # the refusal may come at either step: no worker may start before it
        ws = make_workspace(tmp_path, units=16, reference={"engine_version": ENGINE_VERSION},
                            candidate={"engine_version": ENGINE_VERSION, "patches": None,
                                       "settings": {"device": "cpu", "threds": 1}},
                            execution={"requests_per_call": 8})
        use_run(ws.contract_path, tmp_path / "run", transport=transport)

    with pytest.raises(ContractError, match=r"candidate\.settings: 'threds' is not a setting of the hf worker: "
                                            r"neither a launch option nor one its identity reports"):
        prepare_and_run()
    assert transport.started == []
    assert not (tmp_path / "run").exists()
