"""The execution plan: a pure function of the contract, with seeds fixed and identical for both packages."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
from pathlib import Path

import pytest
from contract_runs import Workspace, make_workspace
from hypothesis import given
from hypothesis import strategies as st

from invar import canonical
from invar.contract.model import Layout
from invar.contract.plan import (
    PromptEncoder,
    Role,
    Unit,
    cut_batches,
    derive_plan,
    layout_batches,
    select_units,
    unit_seed,
)
from invar.contract.prepare import load_for_planning, prompt_encoders
from invar.errors import ContractError
from invar.tasks.population import load_units


def test_unit_seed_is_fixed_and_63_bits() -> None:
    # Pinned: a change here changes every plan, and must come with a new PLAN_VERSION.
    assert unit_seed(20240601, "u-000000") == unit_seed(20240601, "u-000000")
    assert unit_seed(1, "a") != unit_seed(2, "a") != unit_seed(1, "b")
    seeds = [unit_seed(7, f"u{i}") for i in range(1000)]
    assert all(0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == 1000


def test_unit_seed_is_the_documented_formula() -> None:
    raw = hashlib.sha256(b'["invar.unit-seed/1",0,"u-000000"]').digest()
    assert unit_seed(0, "u-000000") == int.from_bytes(raw[:8], "big") >> 1 == 4433750968898572504
    assert unit_seed(5, "é") == int.from_bytes(
        hashlib.sha256('["invar.unit-seed/1",5,"é"]'.encode()).digest()[:8], "big") >> 1


def test_sample_is_seeded_ordered_and_independent_of_file_order() -> None:
    units = [Unit(f"u{i:04d}", f"{i}+1=") for i in range(500)]
    a = select_units(units, 50, contract_seed=3)
    assert len(a) == 50
    assert [u.unit_id for u in a] == sorted(u.unit_id for u in a)  # kept in population order
    assert {u.unit_id for u in select_units(list(reversed(units)), 50, 3)} == {u.unit_id for u in a}
    assert {u.unit_id for u in select_units(units, 50, 4)} != {u.unit_id for u in a}
    assert select_units(units, None, 3) == tuple(units)
    with pytest.raises(ContractError, match=r"population\.sample: 501 exceeds the 500 units"):
        select_units(units, 501, 3)
    with pytest.raises(ContractError, match="unit ids repeat"):
        select_units([*units, units[0]], None, 3)


@given(
    n=st.integers(min_value=1, max_value=300),
    batch=st.integers(min_value=1, max_value=64),
    order=st.sampled_from(["forward", "reverse", "shuffled"]),
    seed=st.integers(min_value=0, max_value=2**63 - 1),
)
def test_layout_batches_partition_the_requests(n: int, batch: int, order: str, seed: int) -> None:
    batches = layout_batches(n, "x", Layout(batch_size=batch, order=order), seed)  # type: ignore[arg-type]
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))
    assert all(len(b) == batch for b in batches[:-1])
    assert 1 <= len(batches[-1]) <= batch
    assert batches == layout_batches(n, "x", Layout(batch_size=batch, order=order), seed)  # type: ignore[arg-type]


def test_plan_pairs_reference_and_candidate(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30, population={"sample": 12},
                        layouts={"solo": {"batch_size": 1}, "b4r": {"batch_size": 4, "order": "reverse"},
                                 "b5s": {"batch_size": 5, "order": "shuffled"}},
                        invariance={"layouts": ["b4r", "b5s"]})
    plan = ws.plan
    assert plan.version == "invar.plan/2"
    assert [c.key for c in plan.calls] == ["reference/solo#0", "candidate/solo#0", "candidate/b4r#0",
                                           "candidate/b5s#0"]
    assert [c.purposes for c in plan.calls] == [("pairing",), ("pairing",), ("invariance",), ("invariance",)]
    assert len(plan.units) == 12
    for c in plan.calls:
        reqs = c.params.to_wire()["requests"]
        assert [r["request_id"] for r in reqs] == [plan.units[i].unit_id for i in c.units]
        assert sorted(c.units) == list(range(12))
        assert [r["seed"] for r in reqs] == [plan.seeds[i] for i in c.units]
        assert all(r["temperature"] == 1.0 and r["max_tokens"] == 5 and r["top_p"] == 1.0 for r in reqs)
        assert set(c.params.to_wire()) == {"requests", "layout", "adapter", "reference_adapter"}
    assert plan.calls[0].params.to_wire()["requests"] == plan.calls[1].params.to_wire()["requests"]
    assert plan.calls[0].params_digest == plan.calls[1].params_digest  # same layout, same requests
    # A call lists its requests in batch order: the reverse layout's batches are units 11..8, 7..4, 3..0.
    assert plan.calls[2].units == (11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
    assert plan.calls[2].batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert list(plan.seeds) == [unit_seed(20240601, u.unit_id) for u in plan.units]
    assert plan.load_params["candidate"]["quantization"] == "nf4"


def test_plan_version_1_contracts_keep_one_call_per_layout(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=12, layouts={"solo": {"batch_size": 1},
                                                     "b4r": {"batch_size": 4, "order": "reverse"}})
    old = ws.contract.model_copy(update={"execution": None})
    plan = derive_plan(old, ws.sha256, [u.scored() for u in ws.plan.units], _encoders(ws))
    assert plan.version == "invar.plan/1"
    assert [c.key for c in plan.calls] == ["reference/solo", "candidate/solo", "candidate/b4r"]
    assert plan.calls[2].batches == [[11, 10, 9, 8], [7, 6, 5, 4], [3, 2, 1, 0]]
    assert plan.calls[2].units == tuple(range(12))


@given(
    n=st.integers(min_value=1, max_value=120),
    batch=st.integers(min_value=1, max_value=40),
    per_call=st.integers(min_value=1, max_value=70),
)
def test_calls_cut_whole_batches_and_keep_the_layout(n: int, batch: int, per_call: int) -> None:
    batches = layout_batches(n, "x", Layout(batch_size=batch, order="shuffled"), 7)
    groups = cut_batches(batches, per_call)
    assert [b for g in groups for b in g] == batches  # every batch once, in order, whole
    for g in groups:
        assert len(g) == 1 or sum(len(b) for b in g) <= per_call


def test_small_calls_cover_each_layout_once(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=12, layouts={"solo": {"batch_size": 1},
                                                     "b4r": {"batch_size": 4, "order": "reverse"}},
                        execution={"requests_per_call": 5})
    plan = ws.plan
    solo = plan.layout_calls("candidate", "solo")
    b4r = plan.layout_calls("candidate", "b4r")
    assert [len(c.units) for c in solo] == [5, 5, 2]
    assert [len(c.units) for c in b4r] == [4, 4, 4]  # 4 + 4 > 5: one batch per call
    assert [i for c in b4r for i in c.units] == list(range(11, -1, -1))
    assert [c.key for c in b4r] == ["candidate/b4r#0", "candidate/b4r#1", "candidate/b4r#2"]


def test_plan_is_a_pure_function_of_the_contract(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=30)
    units = [u.scored() for u in ws.plan.units]
    again = derive_plan(ws.contract, ws.sha256, units, _encoders(ws))
    assert again == ws.plan
    assert [c.params_digest for c in again.calls] == [c.params_digest for c in ws.plan.calls]
    with pytest.raises(ContractError, match="the contract fixes 30 units but 29 were given"):
        derive_plan(ws.contract, ws.sha256, units[:29], _encoders(ws))


def test_every_request_carries_its_packages_prompt_ids(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, units=12)
    for call in ws.plan.calls:
        for req in call.params.to_wire()["requests"]:
            assert req["prompt_ids"] == ws.vocab.prompt_ids(prompt=req["prompt"])
    # Each package's requests carry its own tokenizer's ids: the encoders are per package.
    shifted = {"reference": lambda u: (u.prompt, [1, *ws.vocab.prompt_ids(prompt=u.prompt)]),
               "candidate": lambda u: (u.prompt, ws.vocab.prompt_ids(prompt=u.prompt))}
    plan = derive_plan(ws.contract, ws.sha256, [u.scored() for u in ws.plan.units], shifted)
    ref = plan.call("reference", ws.contract.pairing.layout).params.to_wire()["requests"][0]
    cand = plan.call("candidate", ws.contract.pairing.layout).params.to_wire()["requests"][0]
    assert ref["prompt_ids"] == [1, *cand["prompt_ids"]]


def test_each_call_s_digest_is_the_canonical_digest_of_its_params(tmp_path: Path) -> None:
    # The plan packs each call's params in their canonical form directly; the digest must be canonical.digest's, for
    # any text and ids an encoder gives, and what canonical refuses is refused as before.
    ws = make_workspace(tmp_path, units=12)
    units = [u.scored() for u in ws.plan.units]
    odd: dict[Role, PromptEncoder] = {"reference": lambda u: (f"{u.prompt} é ✓ \x00", [2**64 - 1, 0, 2**31]),
                                      "candidate": lambda u: (str(u.prompt), [])}
    plan = derive_plan(ws.contract, ws.sha256, units, odd)
    for call in plan.calls:
        assert call.params_digest == canonical.digest(call.params.to_wire())
    for text, ids in (("\ud800", [1]), ("x", [2**64])):
        def refused(u: object, t: str = text, i: list[int] = ids) -> tuple[str, list[int]]:
            return t, i

        wrong: dict[Role, PromptEncoder] = {"reference": refused, "candidate": lambda u: (str(u.prompt), [1])}
        with pytest.raises(canonical.CanonicalError):
            derive_plan(ws.contract, ws.sha256, units, wrong)


def _encoders(ws: Workspace) -> dict[Role, PromptEncoder]:
    return prompt_encoders({"reference": ws.vocab, "candidate": ws.vocab})


def test_layouts_that_coincide_on_the_units_are_refused(tmp_path: Path) -> None:
    # With 3 units, batches of 4 and of 8 are both one forward batch: nothing different would be tested.
    with pytest.raises(ContractError, match=r"layouts\.b8: gives the same batches as layouts\.b4 on these 3 units"):
        make_workspace(tmp_path, units=3,
                       layouts={"solo": {"batch_size": 1}, "b4": {"batch_size": 4}, "b8": {"batch_size": 8}},
                       invariance={"layouts": ["solo", "b4", "b8"]})


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"population": {"sample": 17}},
        {"requirement": {"epsilon": 0.2, "method": "paired-binary-sequence", "sequential": True, "max_n": 30},
         "layouts": {"solo": {"batch_size": 3, "order": "shuffled"}},
         "invariance": {"required": False, "layouts": None}, "execution": {"requests_per_call": 7}},
        {"population": {"sample": 25},
         "requirement": {"epsilon": 0.2, "method": "paired-binary-sequence", "sequential": True, "max_n": 25},
         "layouts": {"solo": {"batch_size": 4, "order": "reverse"}},
         "invariance": {"required": False, "layouts": None}, "execution": {"requests_per_call": 9}},
    ],
)
def test_planning_reads_the_plans_unit_count_and_looks_without_the_population(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    ws = make_workspace(tmp_path, units=30, **changes)
    (tmp_path / "population.jsonl").unlink()  # `use plan` does not need it; `load_contract` would refuse now
    contract, units, looks = load_for_planning(ws.contract_path)
    assert contract == ws.contract
    assert units == len(ws.plan.units)
    assert looks == (None if ws.plan.sequential is None else ws.plan.sequential.boundaries)
    if ws.plan.sequential is not None:
        assert len(looks or ()) > 2


def test_a_plan_keeps_no_request_and_derives_each_call_s_params_from_its_digest(tmp_path: Path) -> None:
    # A plan of many units holds per unit a few small objects, not its requests (prompt, token ids, seed of every
    # call): admission's memory must not grow with the run by the plan's requests (issue 28). Before, a plan held
    # every request of every call, about 1.5 KB per unit here.
    n = 2000
    ws = make_workspace(tmp_path, units=n, execution={"requests_per_call": 64})
    units = load_units(ws.contract_path.parent / ws.contract.population.path, ws.contract.population.sha256)
    encoders = prompt_encoders({"reference": ws.vocab, "candidate": ws.vocab})
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        plan = derive_plan(ws.contract, ws.sha256, units, encoders)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / n < 400, f"the plan holds {held / n:.0f} bytes per unit"
    assert plan == ws.plan
    for call in plan.calls:
        params = call.params.to_wire()
        assert canonical.digest(params) == call.params_digest
        assert [r["request_id"] for r in params["requests"]] == [plan.units[i].unit_id for i in call.units]
        assert [r["prompt_ids"] for r in params["requests"]] == \
            [ws.vocab.unit_prompt(plan.units[i].scored())[1] for i in call.units]
