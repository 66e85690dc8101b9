"""Evaluating a fixed policy on a population, scored by the core.

Decisions:
- **The core tokenizes and scores.** Each unit's prompt (or its chat messages, rendered by the model's template) is
  tokenized by the core and sent as ids; the engine returns token ids only; the core decodes them with its own
  tokenizer (`ModelTokenizer`) and scores them with the declared scorer (`invar.tasks.scorers`; 0/1 losses). The
  accuracy is recomputable from the run's records alone.
- **Seeds are per problem.** Request i for problem `id` is drawn with `request_seed(seed, id)`, a pure function of
  the two, so a problem gets the same seed in any sample, batch size or engine: two engines evaluated with the same
  seed are paired problem by problem.
- **A seeded sample** of `count` problems (`sample_indices`, without replacement, in population order), or the
  whole population.
- **Clopper–Pearson interval** (exact binomial, two-sided; `invar.stats.intervals`): it never undercovers, which
  suits a number people compare across engines; it is a little wider than Wilson's.
- **Losses in a declared range.** A scorer declared with `binary = false` and `loss_range = [a, b]` has no
  accuracy to report: the evaluation reports the mean loss instead, with the betting interval of
  `invar.stats.bounds` (each side a one-sided bound at (1 − confidence)/2, so the two together cover at the
  confidence; the units run in the sample's order, fixed before any response exists). Its sum is exact.
- One `generate` call per batch (one batch per call), so progress moves per call.
- **One worker, on the command's `invar.runner.pool.WorkerPool`**: at a signal no call starts, the call under way
  gets the pool's grace to answer and be recorded, and a worker still loading its model is stopped at once.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from invar.errors import ContractError, EvidenceError
from invar.owner_files import declared_sha256
from invar.protocol.methods import GENERATE
from invar.protocol.payloads import GenerateParams, GenerateRequest
from invar.records import RunStore
from invar.runner.engine import EngineSpec, Lease, engine_session, read_generate
from invar.runner.options import check_context, model_context
from invar.runner.pool import WorkerPool
from invar.stats.bounds import betting
from invar.stats.intervals import clopper_pearson
from invar.tasks import ModelTokenizer, Problem
from invar.tasks.population import Unit, thaw
from invar.tasks.scorers import Scorer

INTERVAL_METHOD = "clopper-pearson"
RANGE_INTERVAL_METHOD = "betting"
"""The interval of a mean loss in a declared range: the betting bounds, valid for any bounded loss."""


def request_seed(seed: int, problem_id: str) -> int:
    """The sampling seed of one problem: the first 63 bits of sha256 over (seed, problem id)."""
    digest = hashlib.sha256(f"invar-evaluate/{seed}/{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sample_indices(size: int, count: int | None, seed: int) -> list[int]:
    """Indices of a seeded sample of `count` of `size` problems, without replacement, in population order.

    `count` None (or equal to `size`) is the whole population.
    """
    if count is None or count == size:
        return list(range(size))
    if not 1 <= count <= size:
        raise ContractError(f"--count {count}: the population has {size} problems; ask for 1 to {size}")
    chosen = np.random.default_rng(seed).choice(size, size=count, replace=False)
    return sorted(int(i) for i in chosen)


def population_digest(population: Path, declared: str | None) -> str:
    """The declared sha256 of the population file, or the one in its `.sha256` sibling."""
    if declared is None and population.is_dir():  # `--population ''` is the working directory: no sibling to read
        raise ContractError(f"--population {population}: is a folder; name the population's JSON-lines file")
    return declared_sha256(population, declared, "pass --population-sha256 with the digest you expect")


@dataclass(frozen=True)
class EvaluationSettings:
    """How a policy is evaluated: the sampling of each request and how requests are batched."""

    seed: int
    temperature: float
    top_p: float
    max_tokens: int
    batch_size: int
    confidence: float


def evaluate_policy(
    spec: EngineSpec,
    problems: Sequence[Unit],
    settings: EvaluationSettings,
    store: RunStore,
    scorer: Scorer,
    *,
    call_timeout: float | None = None,
    advance: Callable[[int], None] = lambda done: None,
    phase: Callable[[str], object] = lambda text: None,
    responses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run every unit through the engine (one call per batch), score each response with `scorer`, and summarise.

    `responses`, when given, receives one row per unit in order (`response_row`): what the model read and answered,
    the answer the scorer expected and the loss it gave, so a population that scores badly can be read.

    Each unit's prompt (or its messages, through the model's chat template) is tokenized by the core before any
    worker starts, so a prompt the model cannot read or one too long for its context costs no model load.
    `phase` is told what is under way (starting the worker, loading the model, generating); `advance`, the units
    each call answered."""
    vocab = ModelTokenizer.from_model_dir(spec.model)
    context = model_context(spec.model)
    prompts = [vocab.unit_prompt(p) for p in problems]  # bench/cross_engine.py sends the same
    for p, (_, ids) in zip(problems, prompts, strict=True):
        check_context(len(ids), settings.max_tokens, context, f"unit {p.id}")
    losses: list[float] = []
    pool = WorkerPool(1)

    def generate(lease: Lease) -> float:
        phase("generating")
        generating = time.perf_counter()
        for start in range(0, len(problems), settings.batch_size):
            batch = problems[start : start + settings.batch_size]
            scored = _run_batch(pool, lease, vocab, batch, prompts[start : start + settings.batch_size], settings,
                                scorer, responses)
            if scored is None:  # halted: no call after a signal
                break
            losses.extend(scored)
            advance(len(batch))
        return time.perf_counter() - generating

    generate_s = pool.one(lambda ready: engine_session(spec, store, call_timeout=call_timeout, ready=ready,
                                                       phase=phase, watch=pool.starting),
                          generate, f"the {spec.engine.value} worker", lambda how: f"stopped at {how}", "evaluate")
    if scorer.binary:
        result = summarize(problems, [int(x) for x in losses], settings.confidence)
    else:
        result = summarize_range(problems, losses, settings.confidence, scorer.loss_range)
    result["generate_s"] = round(generate_s, 3)
    return result


def _run_batch(pool: WorkerPool, lease: Lease, vocab: ModelTokenizer, batch: Sequence[Unit],
               prompts: Sequence[tuple[str, list[int]]], s: EvaluationSettings, scorer: Scorer,
               responses: list[dict[str, Any]] | None) -> list[float] | None:
    """One generate call for `batch` (one batch, in order); returns each unit's task loss, scored by the core (0 or
    1 for a binary scorer, within the declared range for any other), and appends each unit's row to `responses`;
    None when the pool halted before the call was issued."""
    session = lease.session
    assert session is not None
    params = GenerateParams([GenerateRequest(p.id, ids, request_seed(s.seed, p.id), s.temperature, s.max_tokens,
                                             s.top_p, prompt=text)
                             for p, (text, ids) in zip(batch, prompts, strict=True)],
                            [list(range(len(batch)))], session.adapter, None)
    if (answer := pool.ask(lease, GENERATE, params)) is None:
        return None
    report = GENERATE.received(answer.result)
    received = read_generate(report, params, session.model_digest)
    losses: list[float] = []
    for p, req, out in zip(batch, params.requests, received.outputs, strict=True):
        text = vocab.decode(out.tokens)
        loss = scorer.loss(p, text)
        if scorer.binary:
            if loss not in (0, 1):
                raise EvidenceError(f"unit {p.id}: the scorer gave loss {loss!r}, not 0 or 1")
            losses.append(int(loss))
        else:
            low, high = scorer.loss_range
            if not (math.isfinite(loss) and low <= loss <= high):  # scorers refuse this already
                raise EvidenceError(f"unit {p.id}: the scorer gave loss {loss!r}, outside its declared loss_range "
                                    f"[{low:g}, {high:g}]")
            losses.append(float(loss))
        if responses is not None:
            responses.append(response_row(p, req, [int(t) for t in out.tokens], text, out.finish_reason,
                                          losses[-1]))
    return losses


def response_row(unit: Unit, request: GenerateRequest, tokens: list[int], text: str, finish_reason: str | None,
                 loss: float) -> dict[str, Any]:
    """One unit's response as `evaluate --responses` lists it: the prompt as rendered and its ids, the response's
    tokens and the core's decoding of them, the unit's expected answer (as its line declares it) and the loss."""
    return {"unit_id": unit.id, "kind": unit.kind, "prompt": request.prompt,
            "prompt_ids": [int(t) for t in request.prompt_ids], "answer": thaw(unit.answer), "response": text,
            "tokens": tokens, "finish_reason": finish_reason, "loss": loss}


def summarize(problems: Sequence[Problem | Unit], losses: Sequence[int], confidence: float) -> dict[str, Any]:
    """Accuracy (1 − mean task loss), its Clopper–Pearson interval, and the count per problem kind."""
    n = len(problems)
    correct = n - sum(losses)
    kinds: Counter[str] = Counter(p.kind for p in problems)
    right: Counter[str] = Counter(p.kind for p, loss in zip(problems, losses, strict=True) if loss == 0)
    lo, hi = clopper_pearson(correct, n, confidence)
    return {"problems": n, "correct": correct, "accuracy": correct / n, "interval": [lo, hi],
            "confidence": confidence, "interval_method": INTERVAL_METHOD,
            "by_kind": {k: {"problems": kinds[k], "correct": right[k]} for k in sorted(kinds)}}


def summarize_range(problems: Sequence[Problem | Unit], losses: Sequence[float], confidence: float,
                    loss_range: tuple[float, float]) -> dict[str, Any]:
    """The mean loss (losses in `loss_range`, not 0/1), its betting interval at `confidence`, and the mean per
    problem kind. The sum is exact (a fraction), so the mean is correctly rounded."""
    n = len(problems)
    low, high = loss_range
    total = sum((Fraction(x) for x in losses), Fraction(0))
    # Two one-sided bounds at (1 − confidence)/2 each: together they miss the mean with probability ≤ 1 − confidence.
    interval = betting(np.asarray(losses, dtype=np.float64), low, high, (1.0 - confidence) / 2.0, order="plan")
    kinds: Counter[str] = Counter(p.kind for p in problems)
    sums: dict[str, Fraction] = {}
    for p, loss in zip(problems, losses, strict=True):
        sums[p.kind] = sums.get(p.kind, Fraction(0)) + Fraction(loss)
    return {"problems": n, "mean_loss": float(total / n), "loss_sum": str(total), "loss_range": [low, high],
            "interval": [interval.lower, interval.upper], "confidence": confidence,
            "interval_method": RANGE_INTERVAL_METHOD, "interval_version": interval.version,
            "by_kind": {k: {"problems": kinds[k], "mean_loss": float(sums[k] / kinds[k])} for k in sorted(kinds)}}
