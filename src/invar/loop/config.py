"""A training run's configuration: what `invar train CONFIG.toml` reads, and every value the loop depends on.

Decisions:
- **One file fixes the run.** Everything a cycle's numbers depend on is here (the prompts, the scorer, the
  sampling, the LoRA shape, the optimizer, the objective, the advantages, the backend, the seed), so the run's
  records hold the configuration once and a resumed run is refused unless it is given the same one.
- **Paths are relative to the configuration file**, as a declaration's are, so a config folder can move with the
  files it names.
- **The evaluation population is never trained on.** On the arithmetic task the prompts file must hold only
  prompts of the task's `train` split (`invar.tasks.arithmetic.split_of`), so `data/arith-eval.jsonl` is refused;
  another task's population is the owner's to keep apart from their evaluation set.
- **Any task.** The prompts are a population file in the one format (`invar.tasks.population`: plain prompts or
  chat messages, rendered by the model's template) and the rewards come from any scorer a use contract takes;
  the arithmetic task and its scorer are the defaults, and a default `scorer` section is left out of the
  recorded configuration, so configurations written before it existed keep their digests.
- **Refused, never reinterpreted.** Unknown fields, values of the wrong kind (`true` or `"20"` for a number, 8.0 for
  an integer), `nan` and `inf`, out-of-range values (every range is stated in docs/training.md and `--help`:
  `field_ranges`) and combinations that cannot run (an importance cap with no importance handling, NF4 on an
  engine without it) are one line naming the field (`ConfigError`), before any worker starts.
"""

from __future__ import annotations

import functools
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from invar import canonical
from invar.docstrings import describe
from invar.engines import LAUNCH_SETTINGS
from invar.errors import InvarError
from invar.owner_files import Name, PathText, check_launch_settings, field_error, read_owner_file
from invar.tasks import KINDS, SCORER_NAME

CONFIG_SCHEMA = "invar.train/1"
"""Names the layout of the recorded configuration; a run recorded under another schema is not resumed."""

Backend = Literal["mlx", "hf", "vllm+hf"]
BACKEND_ENGINES: dict[str, tuple[str, str]] = {"mlx": ("mlx", "mlx"), "hf": ("hf", "hf"), "vllm+hf": ("vllm", "hf")}
"""Each backend's (inference engine, learner engine)."""
Target = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_TARGETS: tuple[Target, ...] = ("q_proj", "v_proj")


class ConfigError(InvarError):
    """A training configuration that cannot run; the message names the field and what to change."""


_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
"""Strict, as a use declaration is (`invar.owner_files`): nothing written is coerced; an integer where a float is
expected is the number it is."""


def _pair(value: object) -> object:
    # TOML (and the recorded JSON) has arrays, not tuples: a list of two is the pair, its items still strict.
    return tuple(value) if isinstance(value, list) else value


Pair = Annotated[tuple[float, float], BeforeValidator(_pair)]


class _Model(BaseModel):
    model_config = _CONFIG


class Prompts(_Model):
    """The training prompts: a population file of the task's `train` split, and how many each cycle draws."""

    path: PathText = "../data/arith-train.jsonl"
    """The prompts: a population file (JSON lines `{id, prompt or messages, answer, kind?, meta?}`), relative to the
    configuration file. On the arithmetic task every prompt must belong to the `train` split: the evaluation
    population is never trained on."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """sha256 of the prompts file; omitted: the digest in the `.sha256` file beside it."""
    per_cycle: int = Field(default=16, ge=1, le=4096)
    """Prompts drawn for each cycle (without replacement within a cycle; seeded by the run seed and the cycle)."""
    kinds: list[Name] | None = None
    """Train only on units of these kinds (their `kind` labels, e.g. `["mul", "muladd"]`); omitted: every unit in
    the file."""

    @model_validator(mode="after")
    def _kinds(self) -> Prompts:
        if self.kinds is not None and not self.kinds:
            raise ValueError("prompts.kinds: empty; name at least one kind, or remove the field for every kind")
        return self


class Scorer(_Model):
    """The rule that turns a response into its reward: any scorer a use contract takes (docs/your-model.md). The
    reward of a response with task loss ℓ in the scorer's range [a, b] is (b − ℓ) / (b − a): 1 − ℓ for a 0/1 loss."""

    name: str = Field(default=SCORER_NAME, min_length=1, max_length=4096)
    """A built-in scorer (`exact-match`, `numeric`, `regex`, `choice`, `contains`, `arithmetic-exact`), or
    `path.py:function`, a function in a file relative to the configuration file."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """The scorer's settings (each scorer's are listed in docs/your-model.md)."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """A user scorer's file sha256; omitted: the file's digest when the run starts, which the run records and a
    resumed run must still match."""


class Rollout(_Model):
    """How the inference engine samples each cycle's responses."""

    group_size: int = Field(default=8, ge=2, le=256)
    """G: samples per prompt. Advantages are relative to a prompt's group, so G must be at least 2."""
    temperature: float = Field(default=1.0, gt=0.0, le=10.0)
    """T: the rollout temperature. The engine samples at T and reports log-probabilities at T; the learner scores
    the same tokens at T. Greedy (0) is refused: it has no sampling distribution to correct for."""
    max_tokens: int = Field(default=5, ge=1, le=65536)
    """The most response tokens per sample, end-of-sequence included (5 fits every arithmetic answer)."""
    batch_size: int | None = Field(default=None, ge=1, le=1 << 16)
    """Requests per engine batch within each generate call; omitted: each call's requests in one batch. A schedule
    knob: every request carries its own seed, and the engines are batch-invariant on CPU (MLX, vLLM; HF is not:
    on hf, the rollouts depend on the batch layout)."""
    staleness: int = Field(default=0, ge=0, le=16)
    """K, the declared staleness: cycle c samples the policy published by cycle c − K − 1 (version max(0, c − K)),
    so with K ≥ 1 the engines generate the next cycles' rollouts while the learner updates (asynchronous mode);
    the learner still starts from the checkpoint published last, and the importance weight corrects for the lag.
    Rollouts of any other policy are refused. 0: synchronous. Changes the policies (a run of K = 1 is not a
    reschedule of a run of K = 0)."""
    workers: int = Field(default=1, ge=1, le=8)
    """Inference workers generating each cycle's rollouts: the cycle's prompt groups are split into this many
    contiguous shards, one generate call per worker (one after the other; the records are written by one
    process). A schedule knob."""
    layout: Literal["split", "shared"] = "split"
    """Where the inference engine and the learner run: `split`, a worker process for each; `shared`, one worker
    process serving both roles (mlx and hf), each on its own protocol channel under its own identity, their calls
    answered in turn. A schedule knob: every call and report is the one a split run records, and the published
    policies are the same (`invar compare histories` checks it); the run's metadata says where the roles ran."""


class Lora(_Model):
    """The LoRA adapter the learner trains (a fresh one at cycle 0: A random from the seed, B zero)."""

    r: int = Field(default=8, ge=1, le=256)
    """The adapter's rank (at most 8 when vLLM serves it: its `--max-lora-rank`)."""
    alpha: float = Field(default=16.0, gt=0.0, le=1e6)
    """lora_alpha; the update is scaled by alpha / r."""
    targets: list[Target] = Field(default_factory=lambda: list(DEFAULT_TARGETS), min_length=1, max_length=7)
    """The projections adapted in every decoder layer."""


class Optimizer(_Model):
    """The learner's optimizer, one step per cycle; its state is saved with every checkpoint."""

    name: Literal["adamw"] = "adamw"
    """AdamW with bias correction (torch's; mlx's with `bias_correction=True`)."""
    lr: float = Field(default=1e-3, gt=0.0, le=1.0)
    """Learning rate."""
    betas: Pair = (0.9, 0.999)
    """AdamW's β1, β2, each in [0, 1)."""
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    """AdamW's ε."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    max_grad_norm: float | None = Field(default=1.0, gt=0.0)
    """Clip the gradient to this global L2 norm; null: no clipping."""

    @model_validator(mode="after")
    def _betas(self) -> Optimizer:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer.betas: each must be in [0, 1); got {list(self.betas)}")
        return self


class Objective(_Model):
    """The objective one update minimises (`invar.loop.objective`; formulas in docs/objective.md)."""

    clip_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    """PPO clip below: the ratio is clipped at 1 − clip_low."""
    clip_high: float = Field(default=0.28, ge=0.0, le=10.0)
    """PPO clip above: the ratio is clipped at 1 + clip_high (DAPO's clip-higher when above clip_low)."""
    importance: Literal["none", "truncate", "mask"] = "truncate"
    """What is done with the importance weight w = exp(proximal − behavior) above `importance_cap`: `truncate`
    uses min(w, cap) (truncated importance sampling), `mask` drops the token's policy term (w = 0), `none` uses w
    as it is."""
    importance_cap: float | None = Field(default=2.0, gt=1.0, le=1e6)
    """The cap C of `truncate` and `mask`; must be null with `none`."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=100.0)
    """β: weight of the k3 estimator of KL(current ‖ reference); 0 disables it (and the reference scoring)."""
    reference: Literal["base"] = "base"
    """The reference policy of the KL term: `base`, the model without an adapter (the policy cycle 0 starts
    from). The engine scores the sampled tokens under it in the same rollout."""
    loss_aggregation: Literal["token-mean"] = "token-mean"
    """How per-token terms become the loss: the mean over every response token of the cycle's batch. N counts the
    whole batch before any micro-batching (the learners divide every sample's sum by it; the core checks the
    count), so the step does not depend on how a learner splits the batch."""

    @model_validator(mode="after")
    def _cap(self) -> Objective:
        if self.importance == "none" and self.importance_cap is not None:
            raise ValueError("objective.importance_cap: importance = \"none\" uses no cap; remove it or choose "
                             "\"truncate\" or \"mask\"")
        if self.importance != "none" and self.importance_cap is None:
            raise ValueError(f"objective.importance_cap: importance = \"{self.importance}\" needs a cap above 1, "
                             "e.g. 2.0")
        return self


class Advantage(_Model):
    """How rewards become advantages within each prompt's group of G samples (`invar.loop.advantages`)."""

    normalization: Literal["mean-std", "mean"] = "mean-std"
    """`mean-std` (GRPO): (r − group mean) / (group std + eps), std with Bessel's correction; `mean` (Dr. GRPO):
    r − group mean, no division. A group whose rewards are all equal gets A = 0 either way, and is counted."""
    eps: float = Field(default=1e-6, gt=0.0, le=1.0)
    """ε added to the group std (`mean-std` only)."""


Reduction = Literal["float64-sequence", "float32-microbatch"]


class Learner(_Model):
    """How the learner schedules one update's work. Schedule knobs: with the default reduction they change how the
    work is split, never the published policy (`invar compare histories` checks it)."""

    micro_batch: int | None = Field(default=None, ge=1, le=1 << 16)
    """Sequences per micro-batch (gradient accumulation); omitted: the whole batch in one. The token mean's N is
    fixed before the batch is split, so the loss is the same for any split."""
    reduction: Reduction | None = None
    """How per-sequence gradients become the step's gradient. `float64-sequence` (the MLX learner's default): each
    sequence's gradient is computed on its own and summed in float64 in sequence order, then rounded once to
    float32, so any micro-batch size gives the same bits. `float32-microbatch` is a negative control, not for
    training: one float32 gradient per micro-batch, summed in float32 in micro-batch order, so the policy depends
    on the micro-batch size. Omitted: `float64-sequence` on mlx, and on hf and vllm+hf when `micro_batch` is
    given; with neither field, the HF learner scores the whole batch in one padded forward and takes one backward
    (its rows then depend on the batch's padding: HF is not batch-invariant), so give a reduction to compare
    schedules on hf."""


class TrainConfig(_Model):
    """A training run: `invar train CONFIG.toml`."""

    name: Name
    """The run's name (runs go to runs/train-<name>-<time> unless --run is given)."""
    backend: Backend
    """`mlx`: MLX generates and learns. `hf`: Hugging Face generates and learns. `vllm+hf`: vLLM generates,
    Hugging Face learns (through peft)."""
    model: PathText = "../models/tiny-arith"
    """The base model folder, relative to the configuration file (named in the records by its tree digest)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The dtype both engines load the base model in."""
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Launch settings of the backend's engine workers, by engine: e.g. `[engines.mlx]` `blas = "openblas"`,
    `[engines.hf]` `threads = 2`, `[engines.vllm]` `max_num_seqs = 64` (the launch options `invar use package
    ENGINE` lists). Every worker of that engine, in either role, starts with them and reports them in its identity.
    They are part of the configuration's digest, so a run resumes only with the settings it was made with.
    Omitted (or an empty table): each worker's defaults."""
    seed: int = Field(default=0, ge=0, lt=1 << 63)
    """The run seed: each cycle's prompts, every request's sampling seed and the fresh adapter's init derive from
    it."""
    cycles: int = Field(default=20, ge=1, le=100_000)
    """Cycles to run: each samples, updates once and publishes one checkpoint."""
    prompts: Prompts = Field(default_factory=Prompts)
    """The training prompts."""
    rollout: Rollout = Field(default_factory=Rollout)
    """The sampling of each cycle."""
    lora: Lora = Field(default_factory=Lora)
    """The adapter trained."""
    optimizer: Optimizer = Field(default_factory=Optimizer)
    """The optimizer."""
    objective: Objective = Field(default_factory=Objective)
    """The objective."""
    advantage: Advantage = Field(default_factory=Advantage)
    """The advantages."""
    learner: Learner = Field(default_factory=Learner)
    """The learner's schedule."""
    scorer: Scorer = Field(default_factory=Scorer)
    """The rewards' scorer."""

    @model_validator(mode="after")
    def _arithmetic_kinds(self) -> TrainConfig:
        # The arithmetic task's kinds are known before its file is read; any other population's are checked
        # against the file when the run is planned.
        if self.scorer.name == SCORER_NAME:
            unknown = sorted(set(self.prompts.kinds or ()) - set(KINDS))
            if unknown:
                raise ValueError(f"prompts.kinds: {unknown} are not problem kinds; choose from {list(KINDS)}")
        return self

    @field_validator("engines", mode="after")
    @classmethod
    def _no_empty_tables(cls, engines: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        # An empty `[engines.mlx]` starts the workers as no table does: one configuration, one digest.
        return {engine: settings for engine, settings in engines.items() if settings}

    @model_validator(mode="after")
    def _engine_settings(self) -> TrainConfig:
        used = list(dict.fromkeys(BACKEND_ENGINES[self.backend]))
        for engine, settings in self.engines.items():
            if engine not in used:
                raise ValueError(f"engines.{engine}: the {self.backend} backend runs {' and '.join(used)}; give "
                                 f"settings for {' or '.join(f'engines.{e}' for e in used)}")
            declared = LAUNCH_SETTINGS.get(engine, {})
            for name in settings:
                if name not in declared:
                    raise ValueError(f"engines.{engine}.{name}: not a launch setting of the {engine} worker; it "
                                     f"takes {', '.join(declared) or 'none'}")
            try:
                check_launch_settings(engine, settings)
            except ValueError as exc:
                raise ValueError(f"engines.{engine}: {exc}") from None
        return self

    @model_validator(mode="after")
    def _fits_backend(self) -> TrainConfig:
        rank = self.engines.get("vllm", {}).get("max_lora_rank") or LAUNCH_SETTINGS["vllm"]["max_lora_rank"].default
        if self.backend == "vllm+hf" and self.lora.r > rank:
            raise ValueError(f"lora.r: vLLM serves adapters of rank at most {rank} (its max_lora_rank); got "
                             f"{self.lora.r}: lower r, raise engines.vllm.max_lora_rank, or train on the mlx or hf "
                             "backend")
        if self.rollout.layout == "shared" and self.backend == "vllm+hf":
            raise ValueError("rollout.layout: \"shared\" runs both roles in one worker process, which needs one engine "
                             "for both; vllm+hf generates with vLLM and learns with Hugging Face: set layout = "
                             "\"split\", or train on the mlx or hf backend")
        if self.rollout.layout == "shared" and self.rollout.workers > 1:
            raise ValueError(f"rollout.layout: \"shared\" runs the one inference worker in the learner's process; "
                             f"rollout.workers = {self.rollout.workers} needs layout = \"split\" (or workers = 1)")
        return self

    def schedule(self) -> dict[str, Any]:
        """The learner's schedule as `learner_step` takes it; `reduction` None: the HF learner's one padded
        forward and backward over the whole batch."""
        reduction = self.learner.reduction
        if reduction is None and (self.backend == "mlx" or self.learner.micro_batch is not None):
            reduction = "float64-sequence"
        return {"micro_batch": self.learner.micro_batch, "reduction": reduction}

    def canonical(self) -> dict[str, Any]:
        """The configuration as recorded: every field, defaults included (but a default `learner` section), in
        JSON kinds."""
        out = {"schema": CONFIG_SCHEMA, **self.model_dump(mode="json")}
        # The default schedule keeps the digest configurations had before these fields existed.
        if self.learner == Learner():
            del out["learner"]
        if self.scorer == Scorer():
            del out["scorer"]
        if not self.engines:
            del out["engines"]
        for key, default in (("workers", 1), ("staleness", 0), ("layout", "split")):
            if out["rollout"][key] == default:
                del out["rollout"][key]
        return out

    def digest(self) -> str:
        """sha256 of the canonical encoding of `canonical()`: what a resumed run must match."""
        return canonical.digest(self.canonical())


def parse_config(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Validate a configuration's data (as read from TOML); `ConfigError` naming the field at fault."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "finite_number":  # TOML's nan and inf: said as what they are, not as a range missed
            given = first.get("input")
            what = "nan, not a number" if given != given else f"{given}, not a finite number"
            field = ".".join(str(part) for part in first["loc"])
            raise ConfigError(f"{source}: {field}: is {what}; write a finite number such as 1.0") from None
        raise ConfigError(str(field_error(exc, source))) from None


def read_config(path: str | os.PathLike[str]) -> TrainConfig:
    """Read and validate a TOML training configuration."""
    p = Path(path)
    try:
        text = read_owner_file(p, "configuration")
        data = tomllib.loads(text)
    except InvarError as exc:
        raise ConfigError(str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc}); fix the syntax") from None
    except (RecursionError, ValueError):
        raise ConfigError(f"{p}: not valid TOML (nested too deeply, or a number too long to read)") from None
    return parse_config(data, str(p))


def resolve(config_path: Path, relative: str) -> Path:
    """A path of the configuration, relative to the configuration file's folder."""
    p = Path(relative)
    return p if p.is_absolute() else config_path.parent / p


def _fields() -> list[tuple[str, FieldInfo]]:
    """(dotted name, field) for every leaf field, in declaration order."""
    rows: list[tuple[str, FieldInfo]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            sub = info.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                walk(sub, f"{prefix}{name}.")
            else:
                rows.append((f"{prefix}{name}", info))

    walk(TrainConfig, "")
    return rows


def _number(value: object) -> str:
    if value == 1 << 63:
        return "2^63"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e7:
        return str(int(value))
    return str(value)


def field_ranges() -> dict[str, str]:
    """The range of every field the configuration bounds, as docs/training.md states it: `[1, 4096]`, `(0, 10]`,
    `≥ 0`, `1 to 7 entries`."""
    out: dict[str, str] = {}
    for name, info in _fields():
        bounds: dict[str, object] = {}
        for item in info.metadata:
            for key in ("gt", "ge", "lt", "le", "min_length", "max_length"):
                if getattr(item, key, None) is not None:
                    bounds[key] = getattr(item, key)
        lo = ("(", bounds["gt"]) if "gt" in bounds else ("[", bounds["ge"]) if "ge" in bounds else None
        hi = (")", bounds["lt"]) if "lt" in bounds else ("]", bounds["le"]) if "le" in bounds else None
        if lo and hi:
            out[name] = f"{lo[0]}{_number(lo[1])}, {_number(hi[1])}{hi[0]}"
        elif lo:
            out[name] = f"{'>' if lo[0] == '(' else '≥'} {_number(lo[1])}"
        elif hi:
            out[name] = f"{'<' if hi[0] == ')' else '≤'} {_number(hi[1])}"
        if "max_length" in bounds:
            unit = "characters" if info.annotation is str else "entries"
            out[name] = f"{bounds.get('min_length', 0)} to {bounds['max_length']} {unit}"
    return out


@functools.cache
def _describe() -> None:
    """The fields' docstrings as their descriptions, read from this file when help is asked for (`invar.docstrings`)."""
    describe(__name__, rebuild=False)


def field_help() -> list[tuple[str, str, str]]:
    """(dotted name, default, docstring with the field's range) for every field, for `invar train --help` and
    docs/training.md."""
    _describe()
    ranges = field_ranges()
    rows: list[tuple[str, str, str]] = []
    for name, info in _fields():
        doc = " ".join((info.description or "").split())
        if name in ranges:
            doc = f"{doc} Range: {ranges[name]}."
        default = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
        rows.append((name, default, doc))
    return rows
