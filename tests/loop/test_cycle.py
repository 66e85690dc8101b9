"""One cycle's core computations without an engine: derived seeds and prompts, the checks of a rollout and of a
learner's report, the objective with importance-weight handling, the gap and importance statistics."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import numpy as np
import pytest

from invar.engines import DEFAULT_MODEL
from invar.errors import EvidenceError
from invar.loop import cycle as cyc
from invar.loop.objective import ObjectiveSettings, loss_terms
from invar.protocol.payloads import GenerateRequest, GenerateResult
from invar.tasks import ModelTokenizer
from invar.tasks.population import Unit

TOKENIZER = ModelTokenizer.from_model_dir(DEFAULT_MODEL)
PROBLEMS = [Unit(f"p{i}", f"{i}+1=", None, str(i + 1), "add2") for i in range(200)]
MODEL = "a" * 64
POLICY = "b" * 64


def test_derived_seeds_are_63_bit_and_differ_by_every_part() -> None:
    seeds = {cyc.derive_seed(0, "sample", c, p, j) for c in range(3) for p in ("p1", "p2") for j in range(4)}
    assert len(seeds) == 24
    assert all(0 <= s < 2**63 for s in seeds)
    assert cyc.derive_seed(7, "x") == cyc.derive_seed(7, "x") != cyc.derive_seed(8, "x")


def test_cycle_prompts_are_a_seeded_sample_without_replacement() -> None:
    first = cyc.cycle_prompts(PROBLEMS, 16, seed=0, cycle=0)
    assert first == cyc.cycle_prompts(PROBLEMS, 16, seed=0, cycle=0)
    assert len({p.id for p in first}) == 16
    assert first != cyc.cycle_prompts(PROBLEMS, 16, seed=0, cycle=1)
    assert first != cyc.cycle_prompts(PROBLEMS, 16, seed=1, cycle=0)
    # Over many cycles every problem is drawn about equally often.
    counts = np.zeros(len(PROBLEMS))
    for c in range(250):
        for p in cyc.cycle_prompts(PROBLEMS, 16, seed=0, cycle=c):
            counts[int(p.id[1:])] += 1
    assert counts.min() > 5  # the mean is 20
    assert counts.max() < 40


def test_cycle_prompts_keep_the_sorted_sha256_choice() -> None:
    # The choice as first defined: every unit's sha256 key sorted with its index, the smallest `per_cycle` kept.
    units = [*PROBLEMS, Unit("é-1", "x", None, "1", "add2"), Unit("p0x", "y", None, "2", "add2")]
    for seed, cycle, k in ((0, 0, 1), (0, 3, 16), (5, 11, 64), (2, 1, len(units))):
        keys = sorted((hashlib.sha256(f"invar-train/{seed}/prompts/{cycle}/{p.id}".encode()).digest(), i)
                      for i, p in enumerate(units))
        assert cyc.cycle_prompts(units, k, seed, cycle) == [units[i] for _, i in keys[:k]]


def test_requests_put_a_prompts_group_together_and_layout_cuts_batches() -> None:
    reqs = cyc.rollout_requests(PROBLEMS[:3], 4, seed=5, cycle=2, temperature=0.7, max_tokens=5,
                                tokenizer=TOKENIZER)
    assert [r.request_id for r in reqs[:5]] == ["c2/p0/0", "c2/p0/1", "c2/p0/2", "c2/p0/3", "c2/p1/0"]
    assert len({r.seed for r in reqs}) == 12
    assert all(r.prompt_ids == TOKENIZER.prompt_ids(prompt=r.prompt) for r in reqs)
    recorded = [r.to_wire() for r in reqs]
    cyc.check_prompt_ids(recorded, TOKENIZER, "cycle 2:")
    recorded[5]["prompt_ids"] = recorded[5]["prompt_ids"][1:]
    with pytest.raises(EvidenceError, match=r"cycle 2: request c2/p1/1: its prompt_ids are not the tokenizer's ids"):
        cyc.check_prompt_ids(recorded, TOKENIZER, "cycle 2:")
    params = cyc.generate_params(reqs, 5, "policy", "base")
    assert params["layout"] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert cyc.generate_params(reqs, None, None, None)["layout"] == [list(range(12))]


def _output(req: GenerateRequest, n: int = 3, reference: bool = False) -> dict[str, Any]:
    out = {"request_id": req.request_id, "prompt_tokens": np.array(req.prompt_ids, np.int32),
           "tokens": np.array([5, 6, 2][:n], np.int32),
           "logprobs": np.array([-0.5, -0.25, -0.125][:n], np.float32), "finish_reason": "stop"}
    if reference:
        out["reference_logprobs"] = np.array([-0.5, -0.5, -0.5][:n], np.float32)
    return out


def _report(reqs: list[GenerateRequest], **change: Any) -> dict[str, Any]:
    return {"outputs": [_output(r) for r in reqs], "model_digest": MODEL, "adapter_digest": POLICY, **change}


def test_a_rollout_is_read_when_it_names_the_published_policy() -> None:
    reqs = cyc.rollout_requests(PROBLEMS[:2], 2, 0, 1, 1.0, 5, TOKENIZER)
    samples = cyc.read_rollout(_report(reqs), reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY,
                               reference=False, vocab_size=18)
    assert [s.prompt for s in samples] == ["0+1=", "0+1=", "1+1=", "1+1="]
    report = _report(reqs)
    report["outputs"][2]["prompt_tokens"] = report["outputs"][2]["prompt_tokens"][1:]
    with pytest.raises(EvidenceError, match="the engine ran other prompt tokens than the request asked for"):
        cyc.read_rollout(report, reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY, reference=False,
                         vocab_size=18)


@pytest.mark.parametrize(("change", "message"), [
    ({"adapter_digest": "c" * 64}, "cycle 1: generate reports policy checkpoint cccccccccccccccc…, but the published "
                                   "policy is checkpoint bbbbbbbbbbbbbbbb…: rollouts of any other policy are refused"),
    ({"adapter_digest": None}, "cycle 1: generate reports policy the base model (no checkpoint), but the published "
                               "policy is checkpoint bbbbbbbbbbbbbbbb…"),
    ({"model_digest": "d" * 64}, "the engine ran another base model"),
])
def test_a_rollout_of_another_policy_or_model_is_refused(change: dict[str, Any], message: str) -> None:
    reqs = cyc.rollout_requests(PROBLEMS[:2], 2, 0, 1, 1.0, 5, TOKENIZER)
    with pytest.raises(EvidenceError) as err:
        cyc.read_rollout(_report(reqs, **change), reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY,
                         reference=False, vocab_size=18)
    assert message in str(err.value)


def test_outputs_out_of_order_or_malformed_are_refused() -> None:
    reqs = cyc.rollout_requests(PROBLEMS[:2], 2, 0, 0, 1.0, 5, TOKENIZER)
    report = _report(reqs, adapter_digest=None)
    report["outputs"] = report["outputs"][::-1]
    with pytest.raises(EvidenceError, match="outputs must come back in request order"):
        cyc.read_rollout(report, reqs, cycle=0, model_digest=MODEL, policy_digest=None, reference=False,
                         vocab_size=18)
    report = _report(reqs, adapter_digest=None)
    report["outputs"][1]["logprobs"] = np.array([0.5, -1, -1], np.float32)
    with pytest.raises(EvidenceError, match=r"logprobs: log-probabilities must be finite and ≤ 0"):
        cyc.read_rollout(report, reqs, cycle=0, model_digest=MODEL, policy_digest=None, reference=False,
                         vocab_size=18)
    with pytest.raises(EvidenceError, match="reference_logprobs: expected float32"):
        cyc.read_rollout(_report(reqs, adapter_digest=None), reqs, cycle=0, model_digest=MODEL, policy_digest=None,
                         reference=True, vocab_size=18)


def _read_one_by_one(report: dict[str, Any], reqs: list[GenerateRequest], reference: bool,
                     monkeypatch: pytest.MonkeyPatch) -> Any:
    """`read_rollout` with every output checked on its own (the joint check of the outputs' arrays declines), or the
    message of the first refused output."""
    with monkeypatch.context() as m:
        m.setattr(cyc, "_rollout_samples", lambda *a, **k: None)
        try:
            return cyc.read_rollout(report, reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY,
                                    reference=reference, vocab_size=18)
        except EvidenceError as exc:
            return str(exc)


@pytest.mark.parametrize(("faults", "reference"), [
    ({}, False),
    ({}, True),
    ({3: {"tokens": np.array([5, 18, 2], np.int32)}}, False),
    ({2: {"tokens": np.array([-1, 5, 2], np.int32)}, 5: {"logprobs": np.array([-1, np.nan, -1], np.float32)}}, False),
    ({5: {"tokens": np.zeros(0, np.int32), "logprobs": np.zeros(0, np.float32),
          "reference_logprobs": np.zeros(0, np.float32)},
      2: {"logprobs": np.array([-1, 0.5, -1], np.float32)}}, False),
    ({4: {"prompt_tokens": np.array([1, 2], np.int32)}}, False),
    ({4: {"prompt_tokens": np.array([99, 99, 99, 99, 99, 99], np.int32)}}, False),
    ({1: {"reference_logprobs": np.array([-1, np.inf, -1], np.float32)}}, True),
    ({6: {"reference_logprobs": None}}, True),
    ({0: {"prompt_tokens": None}}, False),  # int64 prompt ids below: read one by one, to the same samples
])
def test_a_rollout_checked_at_once_reads_as_output_by_output(faults: dict[int, dict[str, Any]], reference: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = cyc.rollout_requests(PROBLEMS[:4], 2, 0, 1, 1.0, 5, TOKENIZER)
    report = _report(reqs)
    for out in report["outputs"]:
        out["reference_logprobs"] = np.array([-0.5, -0.5, -0.5], np.float32)
    for i, change in faults.items():
        if change.get("prompt_tokens", 0) is None:
            change = {"prompt_tokens": np.array(reqs[i].prompt_ids, np.int64)}
        report["outputs"][i] = {k: v for k, v in {**report["outputs"][i], **change}.items() if v is not None}
    expected = _read_one_by_one(report, reqs, reference, monkeypatch)
    try:
        got: Any = cyc.read_rollout(report, reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY,
                                    reference=reference, vocab_size=18)
    except EvidenceError as exc:
        got = str(exc)
    if isinstance(expected, str):
        assert got == expected
        assert re.search(f"c1/p{min(faults) // 2}/{min(faults) % 2}[:.]", got)  # the first refused output
    else:
        assert len(got) == len(expected) == 8
        # a well-formed rollout of int32 prompt ids is read by the joint check, not the fallback
        joint = cyc._rollout_samples(reqs, GenerateResult.from_wire(report).outputs, reference=reference,
                                     vocab_size=18)
        assert (joint is None) == (0 in faults)
        for a, b in zip(got, expected, strict=True):
            assert (a.prompt, a.prompt_ids) == (b.prompt, b.prompt_ids)
            assert all(x is y for x, y in ((a.tokens, b.tokens), (a.behavior, b.behavior), (a.reference, b.reference)))


def _samples(n: int = 4) -> list[cyc.Sample]:
    rng = np.random.default_rng(0)
    return [cyc.Sample("1+1=", TOKENIZER.prompt_ids(prompt="1+1="), np.array([3, 4, 2], np.int32),
                       -rng.random(3).astype(np.float32), -rng.random(3).astype(np.float32)) for _ in range(n)]


def _learner(samples: list[cyc.Sample], proximal: list[np.ndarray], adv: np.ndarray, settings: ObjectiveSettings,
             **change: Any) -> dict[str, Any]:
    t = loss_terms(proximal, [s.behavior for s in samples], adv, settings,
                   reference=[s.reference for s in samples if s.reference is not None])
    return {"model_digest": MODEL, "start_adapter_digest": POLICY, "proximal_logprobs": proximal,
            "tokens": t.tokens, "optimizer_steps": 3, "adapter_dir": "/x", "adapter_digest": "e" * 64,
            "adapter_tensors": {}, "loss": t.loss, "policy": t.policy, "kl": t.kl,
            "importance_weight_mean": t.importance_weight_mean, "grad_norm": 0.5, **change}


def test_a_learner_report_is_read_and_its_objective_matches_the_core() -> None:
    samples = _samples()
    settings = ObjectiveSettings(0.2, 0.28, 0.1, "truncate", 2.0)
    proximal = [s.behavior + np.float32(0.01) for s in samples]
    adv = np.array([1, -1, 0.5, -0.5], np.float32)
    report = cyc.read_learner(_learner(samples, proximal, adv, settings), samples, cycle=2, model_digest=MODEL,
                              start_digest=POLICY, optimizer_steps=3, save_dir="/x")
    core = loss_terms(report.proximal, [s.behavior for s in samples], adv, settings,
                      reference=[s.reference for s in samples if s.reference is not None])
    diffs = cyc.compare_objective(core, report.terms, proximal=report.proximal, samples=samples, advantages=adv,
                                  settings=settings, cycle=2)
    assert diffs == {"policy": 0.0, "kl": 0.0, "importance_weight_mean": 0.0, "loss": 0.0}


def test_a_wrong_loss_stops_the_run_naming_the_cycle_and_the_term() -> None:
    samples = _samples()
    settings = ObjectiveSettings()
    proximal = [s.behavior for s in samples]
    adv = np.array([1, -1, 0.5, -0.5], np.float32)
    good = _learner(samples, proximal, adv, settings)
    report = cyc.read_learner({**good, "loss": good["loss"] + 1e-4}, samples, cycle=4, model_digest=MODEL,
                              start_digest=POLICY, optimizer_steps=3, save_dir="/x")
    core = loss_terms(proximal, [s.behavior for s in samples], adv, settings)
    with pytest.raises(cyc.ObjectiveMismatch, match=r"^cycle 4: objective term loss: the learner reports .*, the core "
                                                    r"recomputes .* \(\|Δ\| 0.0001 > tolerance 1e-06\)"):
        cyc.compare_objective(core, report.terms, proximal=proximal, samples=samples, advantages=adv,
                              settings=settings, cycle=4)


@pytest.mark.parametrize(("change", "message"), [
    ({"start_adapter_digest": None}, "cycle 2: learner_step started from the base model (no checkpoint), not the "
                                     "published checkpoint bbbbbbbbbbbbbbbb…"),
    ({"tokens": 11}, "reports 11 tokens, the batch has 12"),
    ({"optimizer_steps": 1}, "reports optimizer step 1, this is update 3"),
    ({"adapter_dir": "/elsewhere"}, "saved to '/elsewhere', not the folder the core named"),
    ({"loss": float("nan")}, "loss must be a finite number"),
    ({"adapter_tensors": None}, "cycle 2: learner_step.adapter_tensors: expected dict, got NoneType"),
    ({"proximal_logprobs": [np.zeros(3)] * 4}, "cycle 2: learner_step.proximal_logprobs[0]: expected a float32 vector"),
    # Checked as one batch; the first sample at fault is the one named, whatever follows it.
    ({"proximal_logprobs": [np.full(3, -1, np.float32), np.full(3, -1, np.float32), np.array([-1, 0.5, -1], np.float32),
                            np.array([np.nan, -1, -1], np.float32)]},
     "cycle 2: learner_step.proximal_logprobs[2]: log-probabilities must be finite and ≤ 0"),
    ({"proximal_logprobs": [np.full(3, -1, np.float32), np.full(2, -1, np.float32), np.full(3, np.inf, np.float32),
                            np.full(3, -1, np.float32)]},
     "cycle 2: learner_step.proximal_logprobs[1]: expected float32 log-probabilities, one per token (3)"),
])
def test_a_learner_report_for_another_update_is_refused(change: dict[str, Any], message: str) -> None:
    samples = _samples()
    settings = ObjectiveSettings()
    report = _learner(samples, [s.behavior for s in samples], np.zeros(4, np.float32), settings, **change)
    with pytest.raises(EvidenceError) as err:
        cyc.read_learner(report, samples, cycle=2, model_digest=MODEL, start_digest=POLICY, optimizer_steps=3,
                         save_dir="/x")
    assert message in str(err.value)


def test_importance_weights_are_exactly_one_where_equal_then_truncated_or_masked() -> None:
    behavior = [np.array([-1.0, -2.0, -3.0], np.float32)]
    proximal = [np.array([-1.0, -1.0, -3.5], np.float32)]  # w = 1, e, e^-0.5
    adv = np.array([1.0], np.float32)
    for handling, cap, w1 in (("none", None, np.e), ("truncate", 2.0, 2.0), ("mask", 2.0, 0.0)):
        settings = ObjectiveSettings(importance=handling, importance_cap=cap)
        t = loss_terms(proximal, behavior, adv, settings)
        assert t.importance_weight_mean == pytest.approx((1 + w1 + np.exp(-0.5)) / 3, rel=1e-6)
        stats = cyc.importance(proximal, behavior, settings)
        assert stats.exactly_one == 1
        assert stats.handled == (0 if handling == "none" else 1)
        assert stats.max == pytest.approx(np.e, rel=1e-6)


def test_gap_statistics() -> None:
    behavior = [np.array([-1.0, -2.0], np.float32), np.array([-0.5, -0.25, -4.0], np.float32)]
    proximal = [np.array([-1.0, -2.5], np.float32), np.array([-0.5, -0.25, -3.0], np.float32)]
    g = cyc.gap(proximal, behavior)
    assert (g.tokens, g.equal, g.max) == (5, 3, 1.0)
    assert g.p50 == 0.0
    assert g.k3_max == pytest.approx(np.e - 2)
    assert g.k3_mean == pytest.approx((np.exp(-0.5) - 0.5 + np.e - 2) / 5)


def _as_columns(report: dict[str, Any]) -> dict[str, Any]:
    """A generate report as a worker answers a training cycle's call: its outputs as columns."""
    return dataclasses.replace(GenerateResult.from_wire(report), packed=True).to_wire()


def test_a_rollout_as_columns_reads_as_the_list_of_outputs() -> None:
    reqs = cyc.rollout_requests(PROBLEMS[:3], 2, 0, 1, 1.0, 5, TOKENIZER)
    report = _report(reqs)
    read = {k: cyc.read_rollout(r, reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY, reference=False,
                                vocab_size=18) for k, r in (("list", report), ("columns", _as_columns(report)))}
    assert "outputs_batch" in _as_columns(report)
    for a, b in zip(read["list"], read["columns"], strict=True):
        assert (a.prompt, a.prompt_ids, a.tokens.tolist(), a.behavior.tobytes()) == (
            b.prompt, b.prompt_ids, b.tokens.tolist(), b.behavior.tobytes())
    # Outputs out of order, or too few, are refused with the same message either way.
    for change in (lambda outs: outs[::-1], lambda outs: outs[:-1]):
        messages = []
        for form in (lambda r: r, _as_columns):
            bad = {**report, "outputs": change(report["outputs"])}
            with pytest.raises(EvidenceError) as err:
                cyc.read_rollout(form(bad), reqs, cycle=1, model_digest=MODEL, policy_digest=POLICY,
                                 reference=False, vocab_size=18)
            messages.append(str(err.value))
        assert messages[0] == messages[1]
