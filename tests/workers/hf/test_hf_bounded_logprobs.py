"""The HF learner's memory-bounded scoring (`Engine._bounded_logprobs`) against the model's own forward.

Past `LOGITS_BUDGET` bytes of float32 logits for a batch, the learner recomputes each decoder layer's activations in
backward (keeping only the layer's input) and projects only the response positions onto the vocabulary, in chunks
recomputed in backward, instead of keeping every activation and the whole [rows, width, vocabulary] the model's
forward returns. On the shipped model (18-token vocabulary) no batch reaches the budget, so the tests force the
bounded path with small budgets and compare it with the full forward in the same process, on the FP32 and the NF4
base: chunks of at most 16 positions (3 chunks, 15, 15 and 16, the shorter ones padded to `HEAD_ROWS` rows), of 23
(2 chunks) and one chunk for all 46 positions. The log-probabilities and the gradients of every LoRA parameter (B set
to seeded nonzero values so A's gradient is not zero either) are bit-identical, as measured here, and the forward
saves a fraction of the bytes for backward. Without the padding a chunk of 1-5 rows is not: on an Intel Xeon with
AVX-512 the CPU matrix product rounds some rows of a product of fewer than 6 rows differently (7.6e-6 nats on this
model; on an AMD EPYC, below 4 rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hf_calls import load_params, prompt_ids

from invar.protocol import Role
from invar.protocol.payloads import LoadModelParams, LoraParams
from invar.tasks import Problem
from invar.workers.hf_worker import LOADED, LOGITS_BUDGET, Engine

pytestmark = pytest.mark.engine


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The worker's numerics: one intra-op thread (its default), restored afterwards for the rest of the session."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _learner(model_dir: Path, model_digest: str, quantization: str = "none") -> Engine:
    """A learner engine on the shipped model with a fresh seeded adapter whose B is nonzero."""
    engine = Engine(Role.LEARNER, "cpu")
    engine.load_model(LoadModelParams.from_wire(load_params(model_dir, model_digest, quantization)))
    engine._fresh(LoraParams(8, 16.0, ["q_proj", "v_proj"]), 0)
    assert engine.trainer is not None
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for b in engine.trainer.params[1::2]:
            b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return engine


def _rows(problems: list[Problem], vocab_size: int) -> list[tuple[list[int], Any]]:
    """Six prompts of different lengths, with responses of 6 to 10 seeded tokens: 46 response positions."""
    rng = np.random.default_rng(0)
    return [(prompt_ids(p.prompt), rng.integers(0, vocab_size, 6 + i % 5)) for i, p in enumerate(problems[:6])]


def _scored(engine: Engine, rows: list[tuple[list[int], Any]], budget: int) -> tuple[Any, list[Any], int, int]:
    """Log-probabilities at T = 0.7, the LoRA gradients of a fixed weighted sum of them, how many times the
    bounded path ran, and the bytes of the tensors the forward saved for backward."""
    calls, saved = 0, 0

    def pack(x: Any) -> Any:
        nonlocal saved
        saved += x.numel() * x.element_size()
        return x

    bounded = engine._bounded_logprobs

    def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return bounded(*args)

    engine._bounded_logprobs = counted  # type: ignore[method-assign,assignment]  # counts calls, runs the real one
    try:
        with engine.active(LOADED), torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            lps = engine._teacher_forced(rows, 0.7, budget)
    finally:
        del engine._bounded_logprobs
    values = torch.cat(lps)
    w = torch.as_tensor(np.random.default_rng(5).standard_normal(values.numel()), dtype=torch.float32)
    assert engine.trainer is not None
    grads = torch.autograd.grad((values * w).sum(), engine.trainer.params)
    return values.detach(), list(grads), calls, saved


def _bits(a: Any, b: Any) -> bool:
    return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32)))


@pytest.mark.parametrize("quantization", ["none", "nf4"])
def test_bounded_log_probabilities_and_gradients_equal_the_full_forward(
        one_thread: None, model_dir: Path, model_digest: str, problems: list[Problem], quantization: str) -> None:
    engine = _learner(model_dir, model_digest, quantization)
    assert engine.m is not None
    v = engine.m.vocab_size
    rows = _rows(problems, v)
    full, full_grads, calls, full_saved = _scored(engine, rows, LOGITS_BUDGET)
    assert calls == 0  # the shipped model stays on the model's own forward at the default budget
    assert full.numel() == 46
    assert bool(torch.all(full < 0))
    assert any(float(g.abs().max()) > 0 for g in full_grads[0::2])  # A's gradients too, not only B's
    for positions in (4, 23, 46):  # chunks of 15, 15 and 16 (HEAD_ROWS), of 23, of 46
        values, grads, calls, saved = _scored(engine, rows, 4 * v * positions)
        assert calls == 1, positions
        # the decoder layers keep only their inputs for backward (measured here: 1/20 of the full forward's bytes
        # on FP32, 1/13 on NF4)
        assert saved * 5 < full_saved, (positions, saved, full_saved)
        print(f"measured ({quantization}): chunks of {positions} positions: saved for backward {saved} vs "
              f"{full_saved} bytes")
        assert _bits(values, full), (positions, float((values - full).abs().max()))
        for g, f in zip(grads, full_grads, strict=True):
            assert _bits(g, f), (positions, float((g - f).abs().max()))
    assert engine.m.plain_head is True


def test_a_model_whose_logits_are_more_than_its_projection_keeps_the_full_forward(
        one_thread: None, model_dir: Path, model_digest: str, problems: list[Problem]) -> None:
    """A forward that changes the projection's output (as soft-capping or a logit scale does) is found by the
    probe, and the learner keeps the model's own forward whatever the budget, so its numbers stay the model's."""
    engine = _learner(model_dir, model_digest)
    assert engine.m is not None
    engine.m.model.register_forward_hook(lambda _module, _args, out: setattr(out, "logits", out.logits * 0.5))
    rows = _rows(problems, engine.m.vocab_size)
    full, full_grads, _, _ = _scored(engine, rows, LOGITS_BUDGET)
    values, grads, calls, _ = _scored(engine, rows, 0)
    assert engine.m.plain_head is False
    assert calls == 0
    assert _bits(values, full)
    assert all(_bits(g, f) for g, f in zip(grads, full_grads, strict=True))
