"""One training cycle, as the core computes it: pure functions from records to numbers (no engine, no I/O).

A cycle (docs/training.md, `../shared/DESIGN.md` flow 2) is: the core picks the cycle's prompts; the engine
samples G responses to each at temperature T from the published policy; the core scores them, computes rewards and
group advantages; the learner scores the engine's tokens itself (proximal), takes one step and saves a checkpoint;
the core recomputes the objective from the recorded per-token numbers and compares; the checkpoint is checked and
published. The runner (`invar.runner.train`) makes the calls; this module decides what they must say.

Decisions:
- **Seeds are derived, never drawn.** A cycle's prompts and every request's sampling seed are pure functions of
  (run seed, cycle, problem id, sample index) through sha256, so a resumed cycle asks for exactly what the lost one
  asked for, and the choice does not depend on numpy's generator across versions.
- **A report is refused, not repaired.** A rollout that names another checkpoint than the one published last, an
  output out of order, a learner that started from another adapter or reports other token counts: each is an
  `EvidenceError` naming the cycle and what differs.
- **The objective's tolerance is stated.** The learner and the core evaluate the same float32 per-token formula
  on the same bits; they may differ by the last place of `exp` (torch's, MLX's and numpy's may round
  differently), so each term may differ by a few float32 ulps of its per-token magnitude (`TOLERANCE`).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from invar.errors import EvidenceError
from invar.loop.objective import LossTerms, ObjectiveSettings, handle_importance
from invar.protocol.payloads import (
    GenerateOutput,
    GenerateParams,
    GenerateRequest,
    GenerateResult,
    LearnerObjective,
    LearnerOptimizer,
    LearnerSample,
    LearnerStepParams,
    LearnerStepResult,
    LoraParams,
    Schedule,
)
from invar.tasks import ModelTokenizer
from invar.tasks.population import Unit
from invar.tasks.scorers import ScoredUnit, Scorer

TOLERANCE = 1e-6
"""Relative tolerance of each objective term, against its per-token scale (`compare_objective`): about eight
float32 ulps, where the measured differences are of order 1e-9 (HF) and 0 (MLX)."""


class ObjectiveMismatch(EvidenceError):
    """The learner's reported objective differs from the core's recomputation beyond the stated tolerance."""


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from the parts (run seed, purpose, cycle, ...): the first 8 bytes of sha256, shifted."""
    text = "invar-train/" + "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


_U = TypeVar("_U", bound=_Identified)


def cycle_prompts(units: Sequence[_U], per_cycle: int, seed: int, cycle: int) -> list[_U]:
    """The cycle's prompts: the `per_cycle` units of smallest sha256 key over (seed, cycle, unit id).

    A uniform sample without replacement within the cycle (units may recur across cycles), in key order.
    """
    if not 1 <= per_cycle <= len(units):
        raise ValueError(f"per_cycle {per_cycle}: the prompts file holds {len(units)} units")
    # The key is sha256 of the UTF-8 text "invar-train/{seed}/prompts/{cycle}/{id}"; it runs every cycle over the
    # whole population, so the loop is kept to one hash call per unit, and a partial selection (ties by file order,
    # as a stable sort's) replaces sorting all of them.
    prefix = f"invar-train/{seed}/prompts/{cycle}/".encode()
    sha256 = hashlib.sha256
    keys = [sha256(prefix + p.id.encode()).digest() for p in units]
    return [units[i] for i in heapq.nsmallest(per_cycle, range(len(keys)), key=keys.__getitem__)]


def select_units(units: Sequence[Unit], kinds: Sequence[str] | None) -> list[Unit]:
    """The units a run trains on: those of the chosen kinds (every unit when `kinds` is None), in file order."""
    return list(units) if kinds is None else [u for u in units if u.kind in kinds]


def request_id(cycle: int, unit: _Identified, sample: int) -> str:
    return f"c{cycle}/{unit.id}/{sample}"


def rollout_requests(prompts: Sequence[Unit], group_size: int, seed: int, cycle: int, temperature: float,
                     max_tokens: int, tokenizer: ModelTokenizer) -> list[GenerateRequest]:
    """The cycle's generate requests: G per unit, contiguous, each with its derived seed and the token ids the
    core's tokenizer gives the unit (a plain prompt, or chat messages through the model's template; the text
    beside them is a label)."""
    out = []
    for p in prompts:
        text, ids = tokenizer.unit_prompt(p)
        out += [GenerateRequest(request_id(cycle, p, j), ids, derive_seed(seed, "sample", cycle, p.id, j), temperature,
                                max_tokens, top_p=1.0, prompt=text) for j in range(group_size)]
    return out


def check_prompt_ids(requests: Sequence[Mapping[str, Any]], tokenizer: ModelTokenizer, where: str) -> None:
    """Every request asked for the ids the core's tokenizer gives its plain prompt text; `EvidenceError`
    otherwise. For a run that keeps no population (the arithmetic task's: its answers follow from the prompts)."""
    for req in requests:
        ids = req.get("prompt_ids")
        text = req.get("prompt")
        if not isinstance(text, str) or ids != tokenizer.prompt_ids(prompt=text):
            raise EvidenceError(f"{where} request {req.get('request_id')}: its prompt_ids are not the tokenizer's "
                                "ids of its prompt")


def check_requests(recorded: Sequence[Any], expected: Sequence[GenerateRequest], where: str) -> None:
    """The recorded requests are exactly the ones the core derives from the run's population and configuration
    (same order, ids, prompt ids, seeds and sampling); `EvidenceError` naming the first that differs."""
    if len(recorded) != len(expected):
        raise EvidenceError(f"{where} holds {len(recorded)} requests; the configuration asks for {len(expected)}")
    for got, wanted in zip(recorded, expected, strict=True):
        want = wanted.to_wire()
        if not isinstance(got, Mapping):
            raise EvidenceError(f"{where}: a request is not a map")
        for key, value in want.items():
            found = got.get(key)
            if (list(found) if isinstance(found, tuple) else found) != value:
                raise EvidenceError(f"{where} request {got.get('request_id')}: its {key} is not the one the run's "
                                    f"population and configuration give ({want['request_id']})")


def shards(requests: int, group_size: int, workers: int) -> list[range]:
    """The request ranges of each inference worker: whole prompt groups, contiguous, as even as they split, in
    worker order (an empty range where there are fewer groups than workers)."""
    groups = requests // group_size
    out, start = [], 0
    for w in range(workers):
        size = (groups // workers + (1 if w < groups % workers else 0)) * group_size
        out.append(range(start, start + size))
        start += size
    return out


def generate_params(requests: Sequence[GenerateRequest], batch_size: int | None, policy: str | None,
                    reference: str | None) -> dict[str, Any]:
    """The cycle's one generate call: batches of `batch_size` in order, from `policy`, scored under `reference`,
    its outputs answered as columns (`GenerateParams.packed`)."""
    n = len(requests)
    size = n if batch_size is None else batch_size
    return GenerateParams(requests, [list(range(i, min(i + size, n))) for i in range(0, n, size)], policy,
                          reference, packed=True).to_wire()


@dataclass(frozen=True)
class Sample:
    """One sampled response, as the engine reported it."""

    prompt: str
    prompt_ids: list[int]
    """The prompt [P] as the engine ran it (the request's ids)."""
    tokens: np.ndarray
    """int32 [T]: the response, with EOS when it stopped."""
    behavior: np.ndarray
    """float32 [T]: the engine's log-probabilities of `tokens` at T."""
    reference: np.ndarray | None
    """float32 [T]: under the reference policy, scored by the engine in the same rollout (when β > 0)."""


def _policy(digest: object) -> str:
    """How messages name a policy: its checkpoint's digest, or the base model (a fresh adapter)."""
    return f"checkpoint {str(digest)[:16]}…" if digest else "the base model (no checkpoint)"


def _logprobs(value: Any, length: int, where: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.shape != (length,):
        raise EvidenceError(f"{where}: expected float32 log-probabilities, one per token ({length})")
    if not np.all(np.isfinite(value)) or np.any(value > 0):
        raise EvidenceError(f"{where}: log-probabilities must be finite and ≤ 0")
    return value


def _all_logprobs(values: Sequence[Any], lengths: Sequence[int], where: Callable[[int], str]) -> list[np.ndarray]:
    """`_logprobs` of every entry, checked as one concatenated array (one pass instead of one per sample); at the
    first entry that fails, the per-entry check names it, as it would have alone."""
    f32 = np.dtype(np.float32)
    if all(type(v) is np.ndarray and v.dtype == f32 and v.shape == (n,) for v, n in zip(values, lengths, strict=True)):
        joined = np.concatenate(values) if values else np.zeros(0, np.float32)
        if bool(np.isfinite(joined).all()) and not bool((joined > 0).any()):
            return list(values)
    return [_logprobs(v, n, where(i)) for i, (v, n) in enumerate(zip(values, lengths, strict=True))]


def _check_order(outputs: Any, requests: Sequence[GenerateRequest], where: str) -> None:
    """One output per request, each labelled with its request's id, in request order."""
    if not isinstance(outputs, list) or len(outputs) != len(requests):
        raise EvidenceError(f"{where} returned {len(outputs) if isinstance(outputs, list) else 'no'} outputs for "
                            f"{len(requests)} requests")
    for req, out in zip(requests, outputs, strict=True):
        if not isinstance(out, dict) or out.get("request_id") != req.request_id:
            raise EvidenceError(f"{where} output {req.request_id}: labelled "
                                f"{out.get('request_id') if isinstance(out, dict) else out!r}; outputs must come back "
                                "in request order")


_INT32 = np.dtype(np.int32)


def _rollout_samples(requests: Sequence[GenerateRequest], outputs: Sequence[GenerateOutput], *, reference: bool,
                     vocab_size: int) -> list[Sample] | None:
    """The samples `read_rollout` reads, when every output passes its checks, made as one pass over concatenated
    arrays (a rollout holds hundreds of outputs, and four numpy reductions per output were most of the core's reading
    of it); None when any output fails one, so that the per-output loop names the first, as it always did."""
    tokens = [o.tokens for o in outputs]  # int32 vectors, and logprobs as long as each (`GenerateOutput.from_wire`)
    prompts = [o.prompt_tokens for o in outputs]
    refs = [o.reference_logprobs for o in outputs] if reference else []
    if not tokens or any(t.size == 0 for t in tokens) or any(r is None for r in refs) \
            or any(p.dtype != _INT32 for p in prompts):
        return None  # (int32, as every worker sends them: concatenating int64 with uint64 would make floats)
    joined = np.concatenate(tokens)
    if int(joined.min()) < 0 or int(joined.max()) >= vocab_size:
        return None
    asked = [r.prompt_ids for r in requests]
    if any(p.size != len(a) for p, a in zip(prompts, asked, strict=True)):
        return None
    try:
        ids = np.fromiter(itertools.chain.from_iterable(asked), np.int64)
    except (OverflowError, TypeError, ValueError):  # an id past int64: the per-output check compares it
        return None
    if not np.array_equal(np.concatenate(prompts), ids):
        return None
    values = np.concatenate([o.logprobs for o in outputs] + cast(list[np.ndarray], refs))
    if not bool(np.isfinite(values).all()) or bool((values > 0).any()):
        return None
    return [Sample(str(req.prompt), list(req.prompt_ids), out.tokens, out.logprobs,
                   out.reference_logprobs if reference else None)
            for req, out in zip(requests, outputs, strict=True)]


def read_rollout(result: Mapping[str, Any], requests: Sequence[GenerateRequest], *, cycle: int, model_digest: str,
                 policy_digest: str | None, reference: bool, vocab_size: int) -> list[Sample]:
    """The samples of a generate report, after checking it is the rollout the core asked for.

    `policy_digest`: the checkpoint published last (None at cycle 0: the base model); the report must name it.
    """
    where = f"cycle {cycle}: generate"
    if result.get("model_digest") != model_digest:
        raise EvidenceError(f"{where} reports model {str(result.get('model_digest'))[:16]}…, not "
                            f"{model_digest[:16]}…: the engine ran another base model")
    if result.get("adapter_digest") != policy_digest:
        raise EvidenceError(f"{where} reports policy {_policy(result.get('adapter_digest'))}, but the published "
                            f"policy is {_policy(policy_digest)}: rollouts of any other policy are refused")
    packed = "outputs_batch" in result  # (as columns, the outputs are counted and labelled once read)
    if not packed:
        _check_order(result.get("outputs"), requests, where)
    received = GenerateResult.received(result, where)
    if packed:
        _check_order([{"request_id": o.request_id} for o in received.outputs], requests, where)
    samples = _rollout_samples(requests, received.outputs, reference=reference, vocab_size=vocab_size)
    if samples is not None:
        return samples
    samples = []
    for req, out in zip(requests, received.outputs, strict=True):
        at = f"{where} output {req.request_id}"
        tokens = out.tokens
        if tokens.size == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
            raise EvidenceError(f"{at}: tokens must be a non-empty int32 array of ids below {vocab_size}")
        if not np.array_equal(out.prompt_tokens, req.prompt_ids):
            raise EvidenceError(f"{at}: the engine ran other prompt tokens than the request asked for")
        behavior = _logprobs(out.logprobs, tokens.size, f"{at}.logprobs")
        ref = _logprobs(out.reference_logprobs, tokens.size, f"{at}.reference_logprobs") if reference \
            else None
        samples.append(Sample(str(req.prompt), list(req.prompt_ids), tokens, behavior, ref))
    return samples


def rewards(samples: Sequence[Sample], units: Sequence[ScoredUnit], scorer: Scorer,
            vocab: ModelTokenizer) -> np.ndarray:
    """float64 [B]: each response's reward, (b − ℓ) / (b − a) for its task loss ℓ in the scorer's range [a, b]
    (1 − ℓ for a 0/1 loss); the response decoded by the core and scored against the unit it answers."""
    low, high = scorer.loss_range
    return np.array([(high - scorer.loss(u, vocab.decode(s.tokens))) / (high - low)
                     for s, u in zip(samples, units, strict=True)], dtype=np.float64)


def learner_params(samples: Sequence[Sample], advantages: np.ndarray, *, temperature: float,
                   objective: ObjectiveSettings, optimizer: LearnerOptimizer, lora: LoraParams, seed: int,
                   save_dir: str, schedule: Schedule | None = None) -> LearnerStepParams:
    """The cycle's `learner_step` params (docs/objective.md): the engine's tokens and log-probabilities, the core's
    advantages, the objective and optimizer settings, and the folder for the checkpoint."""
    out = [LearnerSample(s.prompt_ids, s.tokens, s.behavior, float(a), s.reference, prompt=s.prompt)
           for s, a in zip(samples, advantages, strict=True)]
    o = objective
    return LearnerStepParams(out, temperature, LearnerObjective(o.clip_low, o.clip_high, o.kl_coef, o.importance,
                                                                o.importance_cap),
                             optimizer, lora, seed, save_dir, schedule, packed=True)


@dataclass(frozen=True)
class LearnerReport:
    """What the learner reported for one update."""

    proximal: list[np.ndarray]
    """float32 [T_i] per sample: the learner's log-probabilities of the engine's tokens at T, at the start weights."""
    terms: LossTerms
    grad_norm: float
    adapter_dir: str
    adapter_digest: str
    adapter_tensors: Mapping[str, Any]
    optimizer_steps: int


def read_learner(result: Mapping[str, Any], samples: Sequence[Sample], *, cycle: int, model_digest: str,
                 start_digest: str | None, optimizer_steps: int, save_dir: str) -> LearnerReport:
    """The learner's report, after checking it answers this update: the start checkpoint, the model, one
    proximal reading per sampled token, the token count, the folder it saved to, the optimizer's step count."""
    where = f"cycle {cycle}: learner_step"
    r = LearnerStepResult.received(result, where)
    if r.model_digest != model_digest:
        raise EvidenceError(f"{where} reports model {r.model_digest[:16]}…, not the run's")
    if r.start_adapter_digest != start_digest:
        raise EvidenceError(f"{where} started from {_policy(r.start_adapter_digest)}, not the "
                            f"published {_policy(start_digest)}: the update must start from the checkpoint "
                            "published last")
    if len(r.proximal_logprobs) != len(samples):
        raise EvidenceError(f"{where}: proximal_logprobs must hold one array per sample ({len(samples)})")
    arrays = _all_logprobs(r.proximal_logprobs, [s.tokens.size for s in samples],
                           lambda i: f"{where}.proximal_logprobs[{i}]")
    n = sum(int(s.tokens.size) for s in samples)
    if r.tokens != n:
        raise EvidenceError(f"{where}: reports {r.tokens!r} tokens, the batch has {n}: the token mean's N is fixed "
                            "by the core before the learner splits the batch")
    if r.optimizer_steps != optimizer_steps:
        raise EvidenceError(f"{where}: reports optimizer step {r.optimizer_steps!r}, this is update "
                            f"{optimizer_steps}: the learner's optimizer state is not the one published with the "
                            "last checkpoint")
    if r.adapter_dir != save_dir:
        raise EvidenceError(f"{where}: saved to {r.adapter_dir!r}, not the folder the core named")
    terms = LossTerms(loss=float(r.loss), policy=float(r.policy), kl=float(r.kl),
                      importance_weight_mean=float(r.importance_weight_mean), tokens=n)
    return LearnerReport(arrays, terms, float(r.grad_norm), save_dir, r.adapter_digest, r.adapter_tensors,
                         optimizer_steps)


def compare_objective(core: LossTerms, learner: LossTerms, *, proximal: Sequence[np.ndarray],
                      samples: Sequence[Sample], advantages: np.ndarray, settings: ObjectiveSettings,
                      cycle: int) -> dict[str, float]:
    """|learner − core| per term; `ObjectiveMismatch` naming the cycle and the first term beyond its tolerance.

    Tolerances (`TOLERANCE` = 1e-6, relative): policy and importance_weight_mean against max|A|·max(1, max w) and
    max(1, max w); kl against max(1, max exp(ref − current)); loss against policy's + kl_coef · kl's; tokens
    exactly. A masked token whose weight lies within one ulp of the cap may be kept on one side and dropped on
    the other; the tolerance does not cover that case and the run stops naming it (never seen in the tests).
    """
    # The largest weight and ratio over the batch's tokens, in one pass over the concatenated readings (the same
    # float32 values as sample by sample; a max does not depend on the order).
    if len(proximal) != len(samples):
        raise ValueError("proximal and samples must have one entry per sample")
    w_max = 1.0
    ratio_max = 1.0
    if samples:
        p32 = [np.asarray(p, np.float32) for p in proximal]
        p_all = np.concatenate(p32)
        w = handle_importance(np.exp(p_all - np.concatenate([s.behavior for s in samples])), settings)
        if w.size:
            w_max = max(w_max, float(np.max(w)))
        with_ref = [(s.reference, p) for s, p in zip(samples, p32, strict=True) if s.reference is not None] \
            if settings.kl_coef else []
        if with_ref:
            ratio = np.exp(np.concatenate([r for r, _ in with_ref]) - np.concatenate([p for _, p in with_ref]))
            if ratio.size:
                ratio_max = max(ratio_max, float(np.max(ratio)))
    a_max = float(np.max(np.abs(advantages))) if len(advantages) else 0.0
    tol = {"policy": TOLERANCE * max(a_max, 1e-30) * w_max, "kl": TOLERANCE * ratio_max,
           "importance_weight_mean": TOLERANCE * w_max}
    tol["loss"] = tol["policy"] + settings.kl_coef * tol["kl"]
    diffs = {name: abs(getattr(learner, name) - getattr(core, name)) for name in tol}
    if learner.tokens != core.tokens:
        raise ObjectiveMismatch(f"cycle {cycle}: objective term tokens: the learner counts {learner.tokens}, the core "
                                f"{core.tokens}")
    for name in ("loss", "policy", "kl", "importance_weight_mean"):
        if not diffs[name] <= tol[name]:
            raise ObjectiveMismatch(
                f"cycle {cycle}: objective term {name}: the learner reports {getattr(learner, name)!r}, the core "
                f"recomputes {getattr(core, name)!r} from the recorded numbers (|Δ| {diffs[name]:.3g} > tolerance "
                f"{tol[name]:.3g}); the learner's arithmetic is not the objective's")
    return diffs


# -- per-cycle measurements (the history's columns) ----------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    """The learner–engine gap over a cycle's sampled tokens: g_t = proximal_t − behavior_t, in nats."""

    tokens: int
    equal: int
    """Tokens where the learner's float32 log-probability equals the engine's bit for bit."""
    p50: float
    """Median |g|."""
    p99: float
    """99th percentile of |g| (numpy's linear interpolation)."""
    max: float
    """Largest |g|."""
    k3_mean: float
    """Mean of exp(g) − g − 1: the k3 estimate of KL(engine ‖ learner) per token (prime-rl's mismatch KL)."""
    k3_max: float


def gap(proximal: Sequence[np.ndarray], behavior: Sequence[np.ndarray]) -> Gap:
    """The gap between the learner's and the engine's readings of the same tokens (float64 arithmetic on the
    float32 values)."""
    p = np.concatenate([np.asarray(x, np.float32) for x in proximal])
    b = np.concatenate([np.asarray(x, np.float32) for x in behavior])
    g = p.astype(np.float64) - b.astype(np.float64)
    a = np.abs(g)
    k3 = np.expm1(g) - g
    return Gap(int(g.size), int(np.sum(p == b)), float(np.percentile(a, 50)), float(np.percentile(a, 99)),
               float(a.max()), float(k3.mean()), float(k3.max()))


@dataclass(frozen=True)
class Importance:
    """The importance weights w_t = exp(proximal_t − behavior_t) of a cycle (float32, as the objective has them)."""

    min: float
    mean: float
    max: float
    """Before truncation or masking."""
    exactly_one: int
    """Tokens with w exactly 1.0 (proximal equal to behavior bit for bit)."""
    handled: int
    """Tokens truncated or masked at the cap (0 with `none`)."""
    ess: float
    """Effective sample size of the weights the objective uses, as a fraction of the tokens: (Σw)² / (N·Σw²)."""


def importance(proximal: Sequence[np.ndarray], behavior: Sequence[np.ndarray],
               settings: ObjectiveSettings) -> Importance:
    w = np.concatenate([np.exp(np.asarray(p, np.float32) - np.asarray(b, np.float32))
                        for p, b in zip(proximal, behavior, strict=True)])
    used = handle_importance(w, settings).astype(np.float64)
    handled = int(np.sum(used != w))
    square = float(np.sum(used * used))
    ess = float(np.sum(used)) ** 2 / (w.size * square) if square > 0 else 0.0
    return Importance(float(w.min()), float(np.mean(w, dtype=np.float64)), float(w.max()), int(np.sum(w == 1.0)),
                      handled, ess)
