"""What `compare` prints that the core returns (one spelling each): the numerical comparison of two packages'
records, the comparison of two training runs, and a use run's `max_kl` requirement as admission checked it.

`invar.compare.numerical` builds the numerical comparison (`NumericalComparison.output()`, the streamed one's too)
and `invar.compare.histories` the histories'; `compare numerical --json` and `compare histories --json` print them as
they are, and a plan /3 decision prints the numerical one's aggregates as its measurements.
"""

from __future__ import annotations

from typing import Any, Literal

from invar.evidence import RangeTaskLossOutput, TaskLossOutput
from invar.printed import Closed
from invar.stats.rows import BoundOutput


class KlRequirementOutput(Closed):
    max_kl: str
    holds: bool
    violated: bool
    captures: int
    worst: str | None


# --- compare numerical ---------------------------------------------------------------------------------------------


class DistributionOutput(Closed):
    """A sample of values summarised as llama.cpp summarises its KLD and Δp values."""

    n: int
    """How many values."""
    mean: float
    """Their mean."""
    stderr: float
    """The mean's standard error (0 for 10 values or fewer, or no positive variance, as llama.cpp)."""
    min: float
    """The smallest value."""
    max: float
    """The largest value."""
    percentiles: dict[str, float]
    """Percent (`1`, `5`, `10`, `50`, `90`, `95`, `99`, `99.9`) → the value there, by linear interpolation."""


class KlDistributionOutput(DistributionOutput):
    """The KL divergences at every capture, with their numerical error bounds."""

    mean_bound: float
    """The mean of the captures' numerical error bounds (from the captures' precision)."""
    max_bound: float
    """The largest capture's numerical error bound."""
    mean_indistinguishable_from_0: bool
    """|mean| is within `mean_bound` of 0: the captures' precision cannot tell the mean from 0."""


class PositionsOutput(Closed):
    """How many units first part at each token position."""

    none: int
    """Units that never part (their token sequences are equal)."""
    positions: dict[str, int]
    """Position (ascending) → how many units first part there."""


class GenerationSummary(Closed):
    """The two sampled responses of every unit, compared."""

    units: int
    """Units compared."""
    identical: int
    """Units bit-identical: tokens, log-probability bits and finish reason."""
    fraction_identical: float
    """`identical` / `units` (0 for no units)."""
    tokens_identical: int
    """Units whose token sequences are equal."""
    logprobs_identical_over_shared_prefix: int
    """Units whose responses share a prefix of at least one token and whose log-probabilities over it have the same
    float32 bits (a unit whose responses part at the first token compares nothing and is not counted)."""
    with_shared_prefix: int | None = None
    """Units whose responses share a prefix of at least one token: what the count above is out of (None only in
    output written before this field existed)."""
    first_divergence: PositionsOutput
    """Where the token sequences first part, counted per position."""
    max_ulp: DistributionOutput | None
    """Per unit sharing a prefix, the largest ULP distance of its log-probabilities over that prefix; None where no
    unit's responses share even their first token."""
    max_abs_delta: DistributionOutput | None
    """The same units' largest |Δ log-probability| (nats); None where no unit shares a prefix."""
    sum_delta: DistributionOutput | None
    """The same units' sum of Δ log-probability over the shared prefix (nats); None where no unit shares a prefix."""


class TaskSummary(Closed):
    """The 0/1 task losses of the units both sides were scored on."""

    units: int
    """Units scored on both sides."""
    reference_loss: int
    """The reference's summed loss."""
    candidate_loss: int
    """The candidate's summed loss."""
    worse: int
    """Units the candidate loses and the reference does not."""
    better: int
    """Units the reference loses and the candidate does not."""


class StepDeltas(Closed):
    """The teacher-forced differences at one step, over the units whose reference response reaches it."""

    step: int
    """The step of the reference's response."""
    n: int
    """Units whose reference response has this step."""
    mean: float
    """Mean candidate − reference log-probability (nats)."""
    mean_abs: float
    """Mean |Δ| (nats)."""
    max_abs: float
    """Largest |Δ| (nats)."""


class TeacherForcingSummary(Closed):
    """The candidate's log-probabilities of the reference's tokens against the reference's own, over the units
    scored."""

    units: int
    """Units the candidate scored."""
    identical: int
    """Units with the same log-probability bits at every step."""
    large_step: float
    """|Δ| (nats) above which a step counts as large (`--large-step`)."""
    delta: DistributionOutput | None
    """Every step's candidate − reference log-probability (nats); None where no step was scored."""
    abs_delta: DistributionOutput | None
    """The same steps' |Δ| (nats)."""
    first_large_step: PositionsOutput
    """Where each unit's first large step is, counted per position (`none`: no large step)."""
    per_step: list[StepDeltas]
    """Per step of the reference's responses, the differences there."""


class SameTopOutput(Closed):
    """Captures whose two distributions have the same most probable token."""

    count: int
    """How many."""
    fraction: float
    """Out of every capture."""
    stderr: float
    """The fraction's standard error (llama.cpp's "Same top p")."""


class RmsOutput(Closed):
    """The root mean square of Δp (llama.cpp's "RMS Δp")."""

    value: float
    """sqrt(E[Δp²])."""
    stderr: float
    """Its standard error."""


class CaptureStep(Closed):
    """The captures at one step."""

    step: int
    """The step of the response."""
    n: int
    """Captures at this step."""
    mean_kl_ref_cand: float
    """Their mean KL(reference ‖ candidate), nats."""
    max_kl_ref_cand: float
    """Their largest KL(reference ‖ candidate), nats."""
    mean_bound_ref_cand: float
    """The mean numerical error bound of that KL."""
    indistinguishable_from_0: int
    """Captures whose two KLs are both within their error bound of 0."""
    same_top: int
    """Captures with the same most probable token."""


class CaptureSummary(Closed):
    """The whole-vocabulary captures of both sides, compared."""

    units: int
    """Units with captures."""
    captures: int
    """Captures compared."""
    context: str
    """Where they were taken: `reference` (both along the reference's response) or `own` (each along its own, only
    steps within the shared prefix compared)."""
    identical: int
    """Captures whose two distributions have the same bits."""
    indistinguishable_from_0: int
    """Captures whose two KLs are both within their numerical error bound of 0."""
    kl_ref_cand: KlDistributionOutput
    """KL(reference ‖ candidate) per capture, nats (llama.cpp's KLD)."""
    kl_cand_ref: KlDistributionOutput
    """KL(candidate ‖ reference) per capture, nats."""
    delta_p: DistributionOutput
    """p_candidate − p_reference of the reference response's token, per capture."""
    rms_delta_p: RmsOutput
    """The root mean square of those Δp."""
    same_top: SameTopOutput
    """Captures with the same most probable token."""
    by_step: list[CaptureStep]
    """Per step, the captures there."""


class SelfConsistency(Closed):
    """The reference's own teacher-forced scores against the log-probabilities it sampled with."""

    units: int
    """Units the reference scored."""
    identical: int
    """Units whose scores have the sampled log-probabilities' bits."""


class UnitTeacherForcing(Closed):
    """One unit's teacher forcing: the candidate's log-probabilities of the reference's tokens against the
    reference's own."""

    identical: bool
    """Every step's two log-probabilities have the same bits."""
    first_large_step: int | None
    """The first step with |Δ| above the large step; None when there is none."""
    max_abs_delta: float
    """Largest |Δ| (nats; 0 for an empty response)."""
    sum_delta: float
    """Σ Δ (nats)."""
    deltas: list[float]
    """Candidate − reference log-probability per step (nats)."""


class CaptureComparisonOutput(Closed):
    """The two full next-token distributions at one step of one unit, compared."""

    step: int
    """The step of the response."""
    kl_ref_cand: float
    """KL(reference ‖ candidate), nats (llama.cpp's KLD, reference as base)."""
    kl_cand_ref: float
    """KL(candidate ‖ reference), nats."""
    bound_ref_cand: float
    """Numerical error bound of `kl_ref_cand` from the captures' precision."""
    bound_cand_ref: float
    """Numerical error bound of `kl_cand_ref`."""
    indistinguishable_from_0: bool
    """Both KLs are within their numerical error bound of 0."""
    same_top: bool
    """The most probable token is the same (first index wins ties)."""
    delta_p: float
    """p_candidate(next token) − p_reference(next token): the token the reference's response holds at this step."""
    identical: bool
    """The two captures have the same bits."""


class UnitComparison(Closed):
    """One unit compared: its two responses, its teacher forcing and captures."""

    unit_id: str
    """The unit's id."""
    prompt: str
    """The unit's prompt as the report shows it."""
    expected: str | None = None
    """The unit's expected answer as its scorer reads it (None when not known: a prompt that is not arithmetic)."""
    reference_text: str | None
    """The reference's response, decoded (None when not known)."""
    candidate_text: str | None
    """The candidate's response, decoded (None when not known)."""
    first_divergence: int | None
    """Index of the first differing token; None when the token sequences are equal."""
    shared: int
    """Tokens both responses hold at the same positions before they part."""
    tokens_identical: bool
    """The token sequences are equal."""
    logprobs_identical: bool
    """There is a shared prefix and every log-probability over it has the same float32 bits."""
    identical: bool
    """Tokens, log-probability bits and finish reason all equal."""
    max_ulp: int
    """Largest ULP distance between the two log-probabilities of one token over the shared prefix (0 if empty)."""
    max_abs_delta: float
    """Largest |candidate − reference| log-probability over the shared prefix, nats."""
    sum_delta: float
    """Σ (candidate − reference) log-probability over the shared prefix, nats."""
    reference_loss: int | None
    """The reference's 0/1 loss on the unit (None when not scored)."""
    candidate_loss: int | None
    """The candidate's 0/1 loss on the unit (None when not scored)."""
    teacher_forcing: UnitTeacherForcing | None
    """The candidate's reading of the reference's response; None when it did not score it."""
    captures: list[CaptureComparisonOutput]
    """The unit's captures, compared step by step."""
    reference_self_identical: bool | None
    """The reference's own teacher-forced scores have the bits it sampled with (None: it did not score them)."""


class ComparisonBody(Closed):
    """A numerical comparison's aggregates: what both `compare numerical` and a plan /3 decision print."""

    sources: dict[str, Any]
    """Which runs (or which use run and contract) were compared: open, as each mode names its own sources."""
    generation: GenerationSummary
    """The sampled responses."""
    task: TaskSummary | None
    """The 0/1 task losses; None where no unit was scored on both sides."""
    teacher_forcing: TeacherForcingSummary | None
    """The candidate's teacher forcing; None where it scored no reference response."""
    captures: CaptureSummary | None
    """The whole-vocabulary captures; None where there are none."""
    reference_self_consistency: SelfConsistency | None
    """The reference's scores of its own responses; None where it scored none."""
    worst: list[UnitComparison]
    """The ten units that part most (largest KL at a capture, then teacher-forced |Δ|, earliest divergence, |Δ|)."""


class CompareDecision(Closed):
    """A use run's decision under its contract, as `use admit` computes it: the headline of the comparison."""

    answer: str | None
    """Admitted, Violated or Unknown; None when admission refuses the run (the reason says why)."""
    reason: str
    """The decision's reason, or why there is none."""
    standard: str | None = None
    """The contract's standard (absent when admission refused the run)."""
    epsilon: str | None = None
    """ε as the contract writes it (absent when admission refused the run)."""
    delta: str | None = None
    """δ as the contract writes it (absent when admission refused the run; None for the finite-domain standard)."""
    bound: BoundOutput | None
    """The bound that decided; None for the finite-domain standard or a refused run."""
    task_loss: TaskLossOutput | RangeTaskLossOutput | None = None
    """`use admit --json`'s task_loss (absent when admission refused the run)."""


class CompareNumericalOutput(ComparisonBody):
    """`invar compare numerical --json`."""

    units: list[UnitComparison]
    """Every unit, in the comparison's order."""
    decision: CompareDecision | None = None
    """A use run's decision (None for REF_RUN CAND_RUN)."""


class TensorDiffOutput(Closed):
    """Where two checkpoints' tensors part: the first differing tensor and the totals over all of them."""

    file: str
    tensor: str
    elements: int
    size: int
    max_abs_delta: float
    tensors_differing: int
    elements_differing: int


class CycleHistoriesRow(Closed):
    cycle: int
    identical: bool
    checkpoint_a: str
    checkpoint_b: str
    checkpoints_identical: bool
    consumed_same: bool
    responses_same: bool
    diff: TensorDiffOutput | None


class HistoriesRun(Closed):
    run: str
    closed: bool
    chain_head: str
    cycles: int


class CompareHistoriesOutput(Closed):
    """`invar compare histories --json` (exit 0 identical, 10 differ)."""

    verdict: Literal["identical", "differ"]
    runs: list[HistoriesRun]
    schedule_knobs_differing: dict[str, list[Any]]
    """Knob → [run A's value, run B's value], for the schedule knobs that differ."""
    cycles_compared: int
    first_differing_cycle: int | None
    cycles: list[CycleHistoriesRow]


__all__ = [
    "CaptureComparisonOutput",
    "CaptureStep",
    "CaptureSummary",
    "CompareDecision",
    "CompareHistoriesOutput",
    "CompareNumericalOutput",
    "ComparisonBody",
    "CycleHistoriesRow",
    "DistributionOutput",
    "GenerationSummary",
    "HistoriesRun",
    "KlDistributionOutput",
    "KlRequirementOutput",
    "PositionsOutput",
    "RmsOutput",
    "SameTopOutput",
    "SelfConsistency",
    "StepDeltas",
    "TaskSummary",
    "TeacherForcingSummary",
    "TensorDiffOutput",
    "UnitComparison",
    "UnitTeacherForcing",
]
