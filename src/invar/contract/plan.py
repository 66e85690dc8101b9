"""A contract's finite execution plan: every generate call the run must make, derived before any data exists.

The plan is a pure function of the contract and its population file (whose digest the contract fixes), so the
units, their seeds and the batch structure of every call are settled by the contract's sha256 alone; a run can
only execute the plan, and admission can recompute it and demand that the run did exactly that.

Decisions:
- One unit is one prompt; its request id is the unit id, identical in every call.
- Per-unit seeds are sha256 of the compact JSON `["invar.unit-seed/1", contract seed, unit id]`, its first 8
  bytes big-endian shifted right by one (63 bits), identical for reference and candidate:
  this pairs the comparison, though it does not couple sampling across two engines.
- A sample of n units is the n units with the smallest sha256(`["invar.sample/1", seed, unit id]`) keys, kept
  in population order; it is a pure function of the seed and the ids, independent of file order.
- Every call lists the requests in the same (planned) order; a layout only changes how they are batched, so
  outputs (returned in request order) line up across layouts without any reindexing.
- The reference runs the pairing layout; the candidate runs the pairing layout and every invariance layout
  (one call serving both when the pairing layout is among them). With invariance relative to the reference
  (`invariance.relative_to`), the reference runs every invariance layout as well, its calls after the candidate's,
  so a contract without it keeps its plan call for call.
- Determinism (`determinism`): the candidate's calls of the determinism layout are issued again, once per later
  run, after every other generate call (and with `relative_to`, the reference's too). A run's calls have the first
  run's params exactly, so a record binds the first call of that digest not yet answered, in plan order; a later
  run's record must come from another worker than its first run's (`use run` starts a fresh one), so nothing a
  process kept from the first run can answer the second.
- Measurements (plan /3) are `score` calls whose structure the plan fixes and whose tokens are the recorded
  responses: for each measured batch of the pairing layout, one call per package holding exactly that batch's
  units in order, so a package whose numbers depend on the batch scores its own samples in the batch it sampled
  them in. With teacher forcing both packages score the reference's responses; without, each scores its own.
- A plan keeps per call its units, batches and the digest of its params, not the params: a call's requests (each
  unit's text, token ids and seed) are derived from the units when asked, and dropped after. A record whose params
  have the planned digest carries the planned params, so admission reads a record's requests from the record; the
  plan's memory is a few small objects per unit, not its prompts. Deriving the plan encodes every unit (once per
  call it is in, to take that call's digest), so a unit its tokenizer refuses is refused there.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, overload

import msgpack
import numpy as np

from invar import canonical, parallel
from invar.compare.steps import resolve_steps
from invar.contract.model import Contract, Layout, Measurements
from invar.errors import ContractError
from invar.protocol.payloads import GenerateParams, GenerateRequest, ScoreItem, ScoreParams
from invar.tasks.population import Unit as PopulationUnit
from invar.tasks.population import UnitTable

if TYPE_CHECKING:
    from invar.contract.outputs import SequentialSectionOutput

PLAN_VERSION_1 = "invar.plan/1"
"""One generate call per package and layout, carrying every unit."""
PLAN_VERSION = "invar.plan/2"
"""As /1, but each layout's batches are cut, in batch order, into calls of whole batches holding at most
`execution.requests_per_call` requests (at least one batch each). A call lists its requests in batch order and its
layout re-indexes them, so which requests share a batch, and in what order, is exactly the layout's.
The version of a contract's plan follows from the contract: /3 when it has `measurements`, else /2 when it has
`execution`, /1 when not."""
PLAN_VERSION_3 = "invar.plan/3"
"""As /2, plus the measurement calls of the contract's `measurements`: per measured batch of the pairing layout,
one `score` call per package (see the module docstring and `measurement_params`)."""

PLAN_VERSION_4 = "invar.plan/4"
"""As /2, for a sequential contract (`requirement.sequential`): the pairing layout's calls are the looks. Look k is
part k of the reference's and of the candidate's pairing calls (the same units); the rule's unit order is the units
of part 0, then part 1, and so on, and its batch boundaries are the cumulative unit counts at each part's end. The
run issues look after look and stops at the first look where the rule stops (see `SequentialSection`)."""

Role = Literal["reference", "candidate"]
Purpose = Literal["pairing", "invariance", "determinism"]


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of the plan: the population's unit, and the text each package's model is given and that text's token
    ids under the package's tokenizer (the one its contract pins).

    The ids travel in every call, so every engine runs exactly the prompt the core tokenized; the text travels beside
    them as a label. The scorer reads `source` (its prompt or messages, and its answer). A planned unit keeps neither
    the text nor the ids: it asks its package's encoder each time (`ids`, `text`), so a plan's memory does not grow
    with its prompts (`derive_plan` encodes every unit once, refusing a unit its tokenizer cannot encode).
    """

    unit_id: str
    prompt: str
    """The unit's plain prompt, or the reference's rendering of its messages: what reports show."""
    source: PopulationUnit | None = field(default=None, repr=False)
    """The population's unit (None only for units built by hand, which no scorer reads)."""
    rendered: Mapping[Role, str] | None = field(default=None, compare=False, hash=False, repr=False)
    """Package → the text its model is given, for a unit built with it by hand; a planned unit's comes from
    `encoders`."""
    prompt_ids: Mapping[Role, tuple[int, ...]] | None = field(default=None, compare=False, hash=False, repr=False)
    """Package → the token ids [P] of that text, for a unit built with them by hand; a planned unit's come from
    `encoders`."""
    encoders: Mapping[Role, PromptEncoder] | None = field(default=None, compare=False, hash=False, repr=False)
    """Each package's rendering and tokenization (shared by every unit of a plan)."""

    def _encoded(self, package: Role) -> tuple[str, Sequence[int]] | None:
        if self.encoders is None or self.source is None:
            return None
        return self.encoders[package](self.source)

    def ids(self, package: Role) -> list[int]:
        """The prompt's ids for `package`; a unit built without them is a bug in the caller."""
        found = None if self.prompt_ids is None else self.prompt_ids.get(package)
        if found is None:
            encoded = self._encoded(package)
            if encoded is None:
                raise ContractError(f"unit {self.unit_id}: no prompt token ids for the {package}; tokenize the units "
                                    "with each package's tokenizer before deriving a plan")
            return list(encoded[1])
        return list(found)

    def text(self, package: Role) -> str:
        """The text `package`'s model is given."""
        if self.rendered is not None and package in self.rendered:
            return self.rendered[package]
        encoded = self._encoded(package)
        return self.prompt if encoded is None else encoded[0]

    def request(self, package: Role) -> tuple[str, list[int]]:
        """(`text`, `ids`) of `package`, encoded once."""
        if self.encoders is None or self.source is None or (self.prompt_ids and package in self.prompt_ids):
            return self.text(package), self.ids(package)
        text, ids = self.encoders[package](self.source)
        return text, list(ids)

    def scored(self) -> PopulationUnit:
        """The population's unit, as scorers read it."""
        if self.source is None:
            raise ContractError(f"unit {self.unit_id}: built without its population unit; derive the plan from the "
                                "population file")
        return self.source


@dataclass(frozen=True)
class Requests:
    """What every generate request of a plan is made of: the units, their seeds and the contract's sampling. A planned
    call's requests are derived from it when asked, one call at a time, and dropped after."""

    units: Sequence[Unit]
    seeds: Sequence[int]
    temperature: float
    top_p: float
    max_tokens: int

    def requests(self, package: Role, indices: Sequence[int]) -> list[GenerateRequest]:
        """The requests of units `indices` (in that order) as `package` is sent them."""
        out = []
        for i in indices:
            unit = self.units[i]
            text, ids = unit.request(package)
            out.append(GenerateRequest(unit.unit_id, ids, self.seeds[i], self.temperature, self.max_tokens,
                                       self.top_p, prompt=text))
        return out


@dataclass(frozen=True)
class PlannedCall:
    """One generate call of the plan: which package, under which layout, for what, with exactly these params.

    The call keeps its units, batches and the digest of its params; the params themselves (every request's prompt,
    token ids and seed) are derived from the plan's units when asked (`params`), so a plan of many units holds no
    request. A record whose params have this digest carries exactly these params."""

    package: Role
    layout: str
    purposes: tuple[Purpose, ...]
    layout_batches: tuple[tuple[int, ...], ...]
    """The params' `layout`: the call's batches, as indices into its requests."""
    units: tuple[int, ...]
    """The plan's unit index of each request, in the call's request order."""
    params_digest: str
    """sha256 of the canonical encoding of `params`."""
    source: Requests = field(compare=False, repr=False)
    part: int | None = None
    """Which of the layout's calls this is (plan /2); None when one call carries the whole layout (plan /1)."""
    run: int = 1
    """Which run of its layout this call is: 1, or a later run of the determinism layout, with the same params."""

    @property
    def key(self) -> str:
        """A readable name for the call, unique within the plan: `<package>/<layout>`, `@<run>` for a later run,
        `#<part>` under plan /2."""
        return self.run_key(self.run)

    def run_key(self, run: int) -> str:
        """The key of this call's counterpart in run `run` of its layout."""
        return f"{self.package}/{self.layout}" + ("" if run == 1 else f"@{run}") + \
            ("" if self.part is None else f"#{self.part}")

    @property
    def batches(self) -> list[list[int]]:
        """The layout's batches: indices into the requests, run batch after batch."""
        return [list(b) for b in self.layout_batches]

    @property
    def params(self) -> GenerateParams:
        """The exact `generate` params (docs/protocol.md): requests, layout, adapter, reference_adapter; derived
        anew on each use (the units are encoded again)."""
        return GenerateParams(self.source.requests(self.package, self.units), self.batches)

    @property
    def first_request_id(self) -> str:
        """The request id of the call's first request (what a foreign call is matched on first)."""
        return self.source.units[self.units[0]].unit_id


@dataclass(frozen=True)
class MeasurementCall:
    """One `score` call of the plan's measurements: which package, which units, whose responses it scores."""

    package: Role
    part: int
    units: tuple[int, ...]
    """The plan's unit indices, in the order of the pairing batch they form."""
    source: Role
    """Whose pairing-layout responses the items carry: the reference's (teacher forcing), or the package's own."""

    @property
    def key(self) -> str:
        """`<package>/measure#<part>`, unique within the plan."""
        return f"{self.package}/measure#{self.part}"


@dataclass(frozen=True)
class SequentialSection:
    """Sequential admission (plan /4): the method, n_max, the rule's unit order and its looks, all fixed by the
    contract before any data exists."""

    method: str
    """A key of `invar.stats.sequential.SEQUENTIAL_METHODS`."""
    version: str
    """The method's version the contract fixes."""
    n_max: int
    order: tuple[int, ...]
    """The plan's unit indices in the order the rule reads them: the pairing calls' units, part after part."""
    boundaries: tuple[int, ...]
    """Cumulative units at the end of each look, increasing, the last equal to n_max."""

    def look_units(self, looks: int) -> tuple[int, ...]:
        """The unit indices the first `looks` looks cover, in the rule's order."""
        return self.order[: self.boundaries[looks - 1]] if looks else ()

    def output(self) -> SequentialSectionOutput:
        """What `use prepare --json` prints of it."""
        from invar.contract.outputs import SequentialSectionOutput  # the printed models: not on the plan's path

        return SequentialSectionOutput(method=self.method, version=self.version, n_max=self.n_max,
                                       looks=len(self.boundaries), boundaries=list(self.boundaries))


@dataclass(frozen=True)
class ExecutionPlan:
    """Every call a run of the contract makes, in execution order."""

    version: str
    contract_sha256: str
    units: Sequence[Unit]
    seeds: Sequence[int]
    """Per-unit sampling seeds, aligned with `units` (63-bit, kept as signed 64-bit machine words)."""
    load_params: dict[Role, dict[str, Any]]
    """The `load_model` params each package's worker is called with (paths relative to the contract file)."""
    calls: tuple[PlannedCall, ...]
    measurements: tuple[MeasurementCall, ...] = ()
    """The measurement calls (plan /3), reference's and candidate's alternating batch by batch; () before /3."""
    measure: Measurements | None = None
    """The contract's measurements section (plan /3)."""
    score_temperature: float = 1.0
    """The temperature measurement calls score at: the sampling temperature, or 1 for greedy sampling (whose
    log-probabilities are at 1)."""
    pairing_layout: str = ""
    sequential: SequentialSection | None = None
    """Plan /4: the stopping rule's section; the pairing calls of part k of both packages are look k."""

    def look_calls(self, look: int) -> tuple[PlannedCall, ...]:
        """Plan /4: the calls of look `look` (0-based): part `look` of each package's pairing calls."""
        return tuple(c for c in self.calls if c.layout == self.pairing_layout and c.part == look and c.run == 1)

    def call(self, package: Role, layout: str) -> PlannedCall:
        """The first planned call of `package` under `layout`; KeyError if the plan has none."""
        for c in self.calls:
            if c.package == package and c.layout == layout and c.run == 1:
                return c
        raise KeyError(f"{package}/{layout}")

    def layout_calls(self, package: Role, layout: str, run: int = 1) -> tuple[PlannedCall, ...]:
        """Every planned call of `package` under `layout` in run `run` (the first: the layout's own calls), in plan
        order; together they cover each unit once."""
        return tuple(c for c in self.calls if c.package == package and c.layout == layout and c.run == run)


def measurement_params(plan: ExecutionPlan, call: MeasurementCall, responses: Callable[[int], np.ndarray]) -> dict[
        str, Any]:
    """The exact `score` params of a measurement call, given the source package's pairing-layout response tokens
    (int32[T]) of each unit index: one item per unit, in the call's order, at the plan's score temperature, captured
    at the contract's steps as they resolve on that response (a step number past its end is left out). Pure."""
    assert plan.measure is not None
    items = []
    for index in call.units:
        tokens = responses(index)
        unit = plan.units[index]
        items.append(ScoreItem(unit.unit_id, unit.ids(call.package), tokens, plan.score_temperature,
                               list(resolve_steps(plan.measure.capture_steps, int(tokens.size), strict=False)),
                               prompt=unit.text(call.package)))
    return ScoreParams(items).to_wire()


def _measurement_calls(contract: Contract, n: int) -> tuple[MeasurementCall, ...]:
    measure = contract.measurements
    if measure is None:
        return ()
    pairing = contract.pairing.layout
    calls: list[MeasurementCall] = []
    covered = 0
    for part, batch in enumerate(layout_batches(n, pairing, contract.layouts[pairing], contract.pairing.seed)):
        if measure.units is not None and covered >= measure.units:
            break
        covered += len(batch)
        roles: tuple[Role, Role] = ("reference", "candidate")
        for package in roles:
            source: Role = "reference" if measure.teacher_forcing else package
            calls.append(MeasurementCall(package, part, tuple(batch), source))
    return tuple(calls)


def _key(tag: str, seed: int, text: str) -> bytes:
    # Compact JSON of [tag, seed, text], not the wire encoding: seeds must not move if the wire format does,
    # and anyone can recompute them from this one line.
    return hashlib.sha256(json.dumps([tag, seed, text], ensure_ascii=False, separators=(",", ":")).encode()).digest()


def unit_seed(contract_seed: int, unit_id: str) -> int:
    """The sampling seed of one unit: sha256 of `["invar.unit-seed/1", contract seed, unit id]`, top 63 bits."""
    return int.from_bytes(_key("invar.unit-seed/1", contract_seed, unit_id)[:8], "big") >> 1


def select_units(population: Sequence[Unit], sample: int | None, contract_seed: int) -> tuple[Unit, ...]:
    """The units a run uses: all of them, or a seeded sample of `sample`, kept in population order.

    Pure. Raises `ContractError` if ids repeat or the sample is larger than the population.
    """
    chosen = _chosen_ids([u.unit_id for u in population], sample, contract_seed)
    return tuple(population) if chosen is None else tuple(u for u in population if u.unit_id in chosen)


def _chosen_ids(ids: Sequence[str], sample: int | None, contract_seed: int) -> set[str] | None:
    """The ids `select_units` keeps (None: all of them); the same refusals."""
    if len(set(ids)) != len(ids):
        raise ContractError("population: unit ids repeat; give every unit its own id")
    if sample is None:
        return None
    if sample > len(ids):
        raise ContractError(f"population.sample: {sample} exceeds the {len(ids)} units; lower it")
    return set(sorted(ids, key=lambda i: _key("invar.sample/1", contract_seed, i))[:sample])


def layout_batches(n: int, name: str, layout: Layout, contract_seed: int) -> list[list[int]]:
    """The batches of one layout over n requests: lists of request indices, each index exactly once.

    `forward` takes indices 0..n-1 in order, `reverse` from n-1 down, `shuffled` in the order of
    sha256(seed, layout name, index); each order is then cut into consecutive batches of `batch_size`.
    """
    order = list(range(n))
    if layout.order == "reverse":
        order.reverse()
    elif layout.order == "shuffled":
        order.sort(key=lambda i: _key("invar.layout/1", contract_seed, f"{name}/{i}"))
    return [order[i : i + layout.batch_size] for i in range(0, n, layout.batch_size)]


def cut_batches(batches: list[list[int]], per_call: int) -> list[list[list[int]]]:
    """Consecutive groups of whole batches, each holding at most `per_call` requests or else a single batch."""
    groups: list[list[list[int]]] = []
    size = 0
    for batch in batches:
        if groups and size + len(batch) <= per_call:
            groups[-1].append(batch)
            size += len(batch)
        else:
            groups.append([batch])
            size = len(batch)
    return groups


def call_groups(contract: Contract, n: int, layout: str) -> list[list[list[int]]]:
    """The calls of one layout over n units, each a group of whole batches of unit indices: one call for all of
    them, or consecutive groups of at most `execution.requests_per_call` requests."""
    batches = layout_batches(n, layout, contract.layouts[layout], contract.pairing.seed)
    per_call = None if contract.execution is None else contract.execution.requests_per_call
    return [batches] if per_call is None else cut_batches(batches, per_call)


PromptEncoder = Callable[[PopulationUnit], tuple[str, Sequence[int]]]
"""A package's rendering and tokenization of a unit: (the text its model is given, token ids [P]), by the
`invar.formats.tokenizer.ModelTokenizer` under the digest its contract pins."""


class PlannedUnits(Sequence[Unit]):
    """A plan's units, kept as the population's units they are made of: each `Unit` (with the encoders rather than
    its text and ids) is built when it is read, so a plan of a million units holds no object per unit of its own.
    A chat unit's label, the reference's rendering of its messages, is rendered once, when the plan is derived."""

    __slots__ = ("_encoders", "_labels", "sources")

    def __init__(self, sources: Sequence[PopulationUnit], encoders: Mapping[Role, PromptEncoder]) -> None:
        # A population's compact table is kept as it is (its units are built when read), any other sequence as a tuple.
        self.sources: Sequence[PopulationUnit] = sources if type(sources) is UnitTable else tuple(sources)
        self._encoders = encoders
        chats = sources.chat_indices() if type(sources) is UnitTable else \
            [i for i, u in enumerate(self.sources) if u.prompt is None]
        self._labels = {i: encoders["reference"](self.sources[i])[0] for i in chats}

    def __len__(self) -> int:
        return len(self.sources)

    @overload
    def __getitem__(self, index: int) -> Unit: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Unit, ...]: ...
    def __getitem__(self, index: int | slice) -> Unit | tuple[Unit, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        source = self.sources[index]
        prompt = source.prompt
        if prompt is None:
            prompt = self._labels[index if index >= 0 else index + len(self.sources)]
        return Unit(source.id, prompt, source, encoders=self._encoders)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlannedUnits):
            return self.sources == other.sources and [u.prompt for u in self] == [u.prompt for u in other]
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PlannedUnits({len(self)} units)"


def derive_plan(contract: Contract, contract_sha256: str, population: Sequence[PopulationUnit],
                encoders: Mapping[Role, PromptEncoder]) -> ExecutionPlan:
    """The execution plan of `contract` over its (already digest-checked) population, each selected unit's prompt
    tokenized by each package's encoder.

    Pure given the encoders: equal inputs give equal plans. Raises `ContractError` when two layouts the candidate
    runs would give the same batch structure on these units (they would not test anything different).
    """
    if contract.population.size != len(population):
        raise ContractError(
            f"population: the contract fixes {contract.population.size} units but {len(population)} were given; "
            "load the file the contract names"
        )
    seed = contract.pairing.seed
    table = population if type(population) is UnitTable else None
    chosen = _chosen_ids(table.ids() if table is not None else [p.id for p in population],
                         contract.population.sample, seed)
    units = PlannedUnits(population if chosen is None else [p for p in population if p.id in chosen], encoders)
    sources = units.sources
    # 8 bytes a unit, not an int object; a table's half of them in a helper process where the command allows one
    table_ids = sources.unit_id if type(sources) is UnitTable else None
    seeds = array.array("q", parallel.in_halves(lambda part: [unit_seed(seed, table_ids(i)) for i in part],
                                                range(len(sources)))
                        if table_ids is not None else (unit_seed(seed, p.id) for p in sources))
    sampling = contract.sampling
    source = Requests(units, seeds, sampling.temperature, sampling.top_p, sampling.max_tokens)

    per_call = None if contract.execution is None else contract.execution.requests_per_call

    # Calls of equal batch structure share one `layout_batches`, and the packages' calls of one layout share their
    # unit indices: what a plan keeps per unit is its `Unit`, its seed and one index per layout.
    shapes: dict[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]] = {}
    cut: dict[str, list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]]] = {}

    def layout_cut(layout: str) -> list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]]:
        """Each call of `layout`: its params' layout and its unit indices in request order."""
        if layout not in cut:
            groups = call_groups(contract, len(units), layout)
            if per_call is None:
                cut[layout] = [(tuple(tuple(b) for b in groups[0]), tuple(range(len(units))))]
                return cut[layout]
            cut[layout] = []
            for group in groups:
                relabel, start = [], 0
                for batch in group:
                    relabel.append(tuple(range(start, start + len(batch))))
                    start += len(batch)
                shape = tuple(relabel)
                cut[layout].append((shapes.setdefault(shape, shape), tuple(i for batch in group for i in batch)))
        return cut[layout]

    # The packages' requests differ only by their encoders: where both packages are given the same encoder (the same
    # tokenizer files), a call's params are the same for both and are derived and digested once.
    needed: dict[tuple[int, str, int], PlannedCall] = {}  # in the order the calls are planned

    def digest_key(call: PlannedCall) -> tuple[int, str, int]:
        return id(encoders[call.package]), call.layout, 0 if call.part is None else call.part

    def calls_of(package: Role, layout: str, purposes: tuple[Purpose, ...]) -> list[PlannedCall]:
        out: list[PlannedCall] = []
        for part, (shape, order) in enumerate(layout_cut(layout)):
            call = PlannedCall(package, layout, purposes, shape, order, "", source, None if per_call is None else part)
            needed.setdefault(digest_key(call), call)
            out.append(call)
        return out

    pairing = contract.pairing.layout
    invariant = contract.invariance.layouts if contract.invariance.required else []
    # Invariance relative to the reference: the reference runs the candidate's layouts too, in the same order.
    relative = contract.invariance.relative_to == "reference"
    calls = calls_of("reference", pairing, ("pairing", "invariance") if relative and pairing in invariant
                     else ("pairing",))
    calls += calls_of("candidate", pairing, ("pairing", "invariance") if pairing in invariant else ("pairing",))
    for name in invariant:
        if name != pairing:
            calls += calls_of("candidate", name, ("invariance",))
    if relative:
        for name in invariant:
            if name != pairing:
                calls += calls_of("reference", name, ("invariance",))
    determinism = contract.determinism
    if determinism is not None and determinism.required:
        assert determinism.layout is not None  # the model's validators ensure it
        again: tuple[Role, ...] = ("candidate", "reference") if determinism.relative_to == "reference" \
            else ("candidate",)
        for run in range(2, determinism.runs + 1):
            for package in again:
                calls += [replace(c, purposes=("determinism",), run=run)
                          for c in calls_of(package, determinism.layout, ("determinism",))]

    def digested(keys: Sequence[tuple[int, str, int]]) -> list[str]:
        # The params exist only while their digest is taken: each unit is encoded here once per call.
        return [_params_digest(needed[key], encoders[needed[key].package]) for key in keys]

    # The calls' digests, in plan order, half of them in a helper process where the command allows one (`use admit`
    # derives the plan of every run it decides); a unit the tokenizer refuses is refused here, the first in plan order.
    keys = list(needed)
    digests = dict(zip(keys, parallel.in_halves(digested, keys), strict=True))
    calls = [replace(c, params_digest=digests[digest_key(c)]) for c in calls]

    candidate_batches: dict[str, str] = {}
    for name in dict.fromkeys(c.layout for c in calls if c.package == "candidate"):
        shape = canonical.digest(layout_batches(len(units), name, contract.layouts[name], seed))
        if shape in candidate_batches:
            raise ContractError(
                f"layouts.{name}: gives the same batches as layouts.{candidate_batches[shape]} on these "
                f"{len(units)} units; declare layouts that differ"
            )
        candidate_batches[shape] = name

    version = PLAN_VERSION_1 if per_call is None else PLAN_VERSION
    if contract.measurements is not None:
        version = PLAN_VERSION_3
    sequential = _sequential_section(contract, len(units), calls)
    return ExecutionPlan(
        version=PLAN_VERSION_4 if sequential is not None else version,
        contract_sha256=contract_sha256,
        units=units,
        seeds=seeds,
        load_params={"reference": contract.reference.load_params(), "candidate": contract.candidate.load_params()},
        calls=tuple(calls),
        measurements=_measurement_calls(contract, len(units)),
        measure=contract.measurements,
        score_temperature=sampling.temperature if sampling.temperature > 0 else 1.0,
        pairing_layout=contract.pairing.layout,
        sequential=sequential,
    )


def _params_digest(call: PlannedCall, encoder: PromptEncoder) -> str:
    """`canonical.digest(call.params.to_wire())`, the params written straight in their canonical form (maps in
    sorted key order, the plain types `canonical` keeps as they are) and packed by msgpack in C, not walked in Python;
    anything that form does not hold (a text msgpack refuses, an integer past 64 bits) goes to `canonical.digest`,
    which refuses it as before. The integers `canonical` takes are the ones msgpack packs, in the same shortest form."""
    source = call.source
    units = source.units
    if type(units) is not PlannedUnits or type(source.temperature) is not float or type(source.top_p) is not float \
            or type(source.max_tokens) is not int:
        return canonical.digest(call.params.to_wire())
    sources, seeds = units.sources, source.seeds
    requests = []
    for i in call.units:
        unit = sources[i]
        text, ids = encoder(unit)
        # keys in sorted order: max_tokens, prompt, prompt_ids, request_id, seed, temperature, top_p
        requests.append({"max_tokens": source.max_tokens, "prompt": text, "prompt_ids": list(ids),
                         "request_id": unit.id, "seed": seeds[i], "temperature": source.temperature,
                         "top_p": source.top_p})
    params = {"adapter": None, "layout": [list(b) for b in call.layout_batches], "reference_adapter": None,
              "requests": requests}
    try:
        doc = msgpack.packb(params, use_bin_type=True, strict_types=True)
    except (ValueError, TypeError, OverflowError):
        return canonical.digest(call.params.to_wire())
    return canonical.sha256_parts([len(doc).to_bytes(4, "big"), doc])


def _sequential_section(contract: Contract, n: int, calls: Sequence[PlannedCall]) -> SequentialSection | None:
    req = contract.requirement
    if not req.sequential:
        return None
    # The model's validators ensure these for a sequential contract.
    assert req.method is not None
    assert req.max_n is not None
    assert contract.method_version is not None
    if req.max_n != n:
        raise ContractError(f"requirement.max_n: {req.max_n} units, but the plan runs {n}; set population.sample (or "
                            f"max_n) so that the two agree")
    parts = [c for c in calls if c.package == "reference" and c.layout == contract.pairing.layout and c.run == 1]
    order = tuple(i for c in parts for i in c.units)
    boundaries = tuple(itertools.accumulate(len(c.units) for c in parts))
    return SequentialSection(req.method, contract.method_version, n, order, boundaries)
