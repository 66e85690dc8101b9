"""Teacher-forced scoring of given token sequences through an engine: `invar score`, and the source of the
candidate's side of a numerical comparison.

Decisions:
- **Given tokens, the engine's numbers.** The worker's `score` method (docs/protocol.md) returns, per item, the
  log-probability of each given token on the context of the prompt and the tokens before it, at the item's
  temperature, and the whole vocabulary's log-probabilities at the requested steps, as float32 arrays. They are
  kept in the run's records bit for bit, once.
- **A run's responses are scored in the batches they were sampled in.** From a run (`--from-run`), each batch of
  each generate call becomes one score call holding exactly that batch's requests in order, at the request's
  temperature (1 for greedy requests, whose log-probabilities are at 1): an engine whose numbers depend on the batch
  (Hugging Face) then scores its own samples to the bit, and any difference another package shows is its own.
- **The source run is verified first** (a whole streamed pass), then read again to issue the calls; its head must
  not change in between.
- **Steps are checked before any worker starts**: a requested step past a response's end is refused, naming the item.
- **One worker, on the command's `invar.runner.pool.WorkerPool`**: at a signal no call starts, the call under way
  gets the pool's grace to answer and be recorded, and a worker still loading its model is stopped at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from invar.canonical import show
from invar.compare.runs import check_score_output, open_verified, run_kind
from invar.compare.steps import Step, resolve_steps
from invar.errors import EvidenceError, InvarError
from invar.evidence import check_patches_active
from invar.owner_files import read_regular_file
from invar.protocol import payloads
from invar.protocol.methods import SCORE
from invar.records import RunStore
from invar.runner.engine import EngineSpec, Lease, engine_session
from invar.runner.options import check_context, model_context
from invar.runner.pool import WorkerPool
from invar.tasks import ModelTokenizer

TOKEN_ID_MAX = (1 << 31) - 1
"""Token ids travel as int32 arrays."""


@dataclass(frozen=True)
class ScoreItem:
    """One sequence to score: the prompt, the given response tokens int32[T], the temperature, the capture steps."""

    item_id: str
    prompt: str
    tokens: np.ndarray
    temperature: float
    steps: tuple[int, ...]
    prompt_ids: tuple[int, ...] | None = None
    """The prompt's ids [P] as a generate call ran them; None: the scoring model's tokenizer encodes `prompt` (as a
    plain text prompt)."""

    def with_ids(self, tokenizer: ModelTokenizer) -> ScoreItem:
        """The item with its prompt ids settled: its own, or `tokenizer`'s encoding of its prompt text."""
        if self.prompt_ids is not None:
            return self
        return dataclasses.replace(self, prompt_ids=tuple(tokenizer.prompt_ids(prompt=self.prompt)))

    def params(self) -> payloads.ScoreItem:
        """The item as the `score` method takes it (its prompt ids settled by `with_ids`)."""
        assert self.prompt_ids is not None, "settle the prompt ids with with_ids first"
        return payloads.ScoreItem(self.item_id, self.prompt_ids, self.tokens, self.temperature, self.steps,
                                  prompt=self.prompt)


@dataclass(frozen=True)
class ScoredOutput:
    """One item's result: log-probabilities float32[T] and captures float32[len(steps), V]."""

    item: ScoreItem
    logprobs: np.ndarray
    vocab_logprobs: np.ndarray


def _item(item_id: str, prompt: str, tokens: Any, temperature: float, spec: Sequence[Step], where: str,
          prompt_ids: tuple[int, ...] | None = None) -> ScoreItem:
    array = np.asarray(tokens)
    if array.ndim != 1 or array.size == 0 or array.dtype.kind not in "iu":
        raise InvarError(f"{where}: tokens must be a non-empty list of token ids")
    try:
        steps = resolve_steps(spec, int(array.size), strict=True)
    except ValueError as exc:
        raise InvarError(f"{where}: capture {exc}; ask for steps within every response (e.g. 0,last)") from None
    return ScoreItem(item_id, prompt, array.astype(np.int32), temperature, steps, prompt_ids)


def items_from_file(path: Path, temperature: float, spec: Sequence[Step], batch_size: int) -> list[list[ScoreItem]]:
    """Items from a JSON-lines file of `{"item_id", "prompt", "tokens"[, "temperature"]}`, cut into batches."""
    import json

    raw = read_regular_file(path, "--tokens file", error=InvarError, fix="give a JSON-lines file of items")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InvarError(f"--tokens {path}: not UTF-8 text (byte offset {exc.start:,}); give a JSON-lines file") \
            from None
    items: list[ScoreItem] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--tokens {path} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvarError(f"{where}: not JSON ({exc.msg}); write one object per line") from None
        if not isinstance(row, dict) or not isinstance(row.get("item_id"), str) or \
                not isinstance(row.get("prompt"), str) or not isinstance(row.get("tokens"), list) or \
                not all(isinstance(t, int) and not isinstance(t, bool) for t in row["tokens"]):
            raise InvarError(f"{where}: expected {{\"item_id\": str, \"prompt\": str, \"tokens\": [ids], "
                             "\"temperature\"?: number}")
        wide = next((t for t in row["tokens"] if not 0 <= t <= TOKEN_ID_MAX), None)
        if wide is not None:  # an int32 on the wire: a wider id would wrap to another token, or not convert at all
            raise InvarError(f"{where}: token id {show(wide, 40)} is outside [0, 2^31 − 1]; give the model's token "
                             "ids")
        if row["item_id"] in seen:
            raise InvarError(f"{where}: item_id {row['item_id']!r} repeats; give every item its own id")
        seen.add(row["item_id"])
        t = row.get("temperature", temperature)
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 10:
            raise InvarError(f"{where}: temperature must be a number in (0, 10]")
        items.append(_item(row["item_id"], row["prompt"], np.array(row["tokens"], dtype=np.int64), float(t), spec,
                           where))
    if not items:
        raise InvarError(f"--tokens {path}: no items")
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]


@dataclass(frozen=True)
class SourceRun:
    """A verified infer or evaluate run whose responses are to be scored."""

    path: Path
    head: str
    command: str
    units: int


def verify_source(path: Path) -> SourceRun:
    """Verify a run in one streamed pass: closed, made by infer or evaluate, every generate call answered."""
    with open_verified(path, "--from-run") as store:
        meta = store.meta().get("run", {})
        command = meta.get("command")
        if command not in ("infer", "evaluate"):
            raise InvarError(f"--from-run {path}: {run_kind(command)}; give a run made by invar infer or evaluate")
        stream = store.stream()
        units = 0
        for rec in stream:
            if rec.call.method == "generate":
                if rec.report is None or not rec.report.report.ok:
                    raise EvidenceError(f"--from-run {path}: {rec.name} has no successful report")
                units += len(rec.call.params.get("requests", []))
        v = stream.verification
        if v is None or not v.closed:
            raise EvidenceError(f"--from-run {path}: the run is incomplete (no closing record); score finished runs")
        return SourceRun(path, v.head, str(command), units)


def batches_from_run(source: SourceRun, spec: Sequence[Step]) -> Iterator[list[ScoreItem]]:
    """Each batch of each generate call of `source`, as the items that score its responses (see the module
    docstring); streams the run, and refuses it if its head changed since `verify_source`."""
    with open_verified(source.path, "--from-run") as store:
        stream = store.stream()
        for rec in stream:
            if rec.call.method != "generate" or rec.report is None or rec.report.report.result is None:
                continue
            requests = rec.call.params["requests"]
            outputs = rec.report.report.result["outputs"]
            for batch in rec.call.params["layout"]:
                items = []
                for i in batch:
                    req, out = requests[i], outputs[i]
                    where = f"--from-run {source.path}: {rec.name}, request {req['request_id']}"
                    t = float(req["temperature"])
                    # The ids the source engine ran: every engine scores exactly the prompt that was sampled from.
                    items.append(_item(req["request_id"], req["prompt"], np.array(out["tokens"], copy=True),
                                       t if t > 0 else 1.0, spec, where, tuple(req["prompt_ids"])))
                yield items
        if stream.verification is None or stream.verification.head != source.head:
            raise EvidenceError(f"--from-run {source.path}: the run changed while it was read; score it again")


def check_items(items: Sequence[ScoreItem], vocab: ModelTokenizer, context: int | None) -> None:
    """Every item's prompt and response are ids of the model's vocabulary and fit its context together."""
    for it in items:
        assert it.prompt_ids is not None
        for what, ids in (("prompt", np.asarray(it.prompt_ids)), ("response", it.tokens)):
            if not ids.size or int(ids.min()) < 0 or int(ids.max()) >= vocab.size:
                raise InvarError(f"item {it.item_id}: {what} token ids must be in [0, {vocab.size}), the model's "
                                 "vocabulary; score tokens of this model")
        check_context(len(it.prompt_ids), int(it.tokens.size), context, f"item {it.item_id}")


def score_batches(spec: EngineSpec, batches: Iterator[list[ScoreItem]], store: RunStore, *,
                  call_timeout: float | None = None,
                  on_output: Callable[[ScoredOutput], None] = lambda out: None,
                  phase: Callable[[str], object] = lambda text: None) -> dict[str, Any]:
    """One `score` call per batch through the engine's worker; each item's result is checked and handed to
    `on_output` as it arrives. Returns counts: calls, items, captures, vocab_size. `phase` is told what is under
    way (starting the worker, loading the model, scoring)."""
    vocab = ModelTokenizer.from_model_dir(spec.model)
    context = model_context(spec.model)
    calls = items = captures = 0
    width: int | None = None
    pool = WorkerPool(1)

    def score(lease: Lease) -> None:
        nonlocal calls, items, captures, width
        session = lease.session
        assert session is not None
        phase("scoring")
        for batch in batches:
            batch = [it.with_ids(vocab) for it in batch]
            check_items(batch, vocab, context)
            answer = pool.ask(lease, SCORE, payloads.ScoreParams([it.params() for it in batch], session.adapter))
            if answer is None:  # halted: no call after a signal
                return
            result = answer.result
            where = f"score call {answer.call.call_id}"
            if result.get("model_digest") != session.model_digest:
                raise EvidenceError(f"{where}: the report names model {str(result.get('model_digest'))[:16]}…, not "
                                    f"{session.model_digest[:16]}…")
            check_patches_active(result, spec.patches, where)
            outputs = result.get("outputs")
            if not isinstance(outputs, list) or len(outputs) != len(batch):
                raise EvidenceError(f"{where}: the report does not answer its {len(batch)} items")
            for it, sent, out in zip(batch, answer.call.params["items"], outputs, strict=True):
                scored = check_score_output(sent, out, where)
                vocab_lp = out["vocab_logprobs"]
                if scored.vocab_size is not None:
                    if width is not None and scored.vocab_size != width:
                        raise EvidenceError(f"{where} ({it.item_id}): captures of {scored.vocab_size} tokens after "
                                            f"captures of {width}")
                    width = scored.vocab_size
                on_output(ScoredOutput(it, scored.logprobs, vocab_lp))
                items += 1
                captures += len(it.steps)
            calls += 1

    pool.one(lambda ready: engine_session(spec, store, call_timeout=call_timeout, ready=ready, phase=phase,
                                          watch=pool.starting),
             score, f"the {spec.engine.value} worker", lambda how: f"stopped at {how}", "score")
    return {"calls": calls, "items": items, "captures": captures, "vocab_size": width}


@dataclass(frozen=True)
class ScoreSource:
    """The items to score, every one checked against the scoring model, and where they came from."""

    batches: Iterator[list[ScoreItem]]
    """One list per score call, in order."""
    total: int
    """How many items the batches hold."""
    source: dict[str, Any]
    """The run's `source` meta: the source run (path, head, command) or the tokens file."""


def score_source(spec: EngineSpec, steps: Sequence[Step], *, tokens: Path | None, from_run: Path | None,
                 temperature: float, batch_size: int) -> ScoreSource:
    """The items of a tokens file (at `temperature` where an item states none, `batch_size` per call) or of a
    verified run's responses (in its batches), checked against `spec`'s model before any worker starts: a step past
    a response's end, an id outside the model's vocabulary, a prompt and response past its context each cost no
    model load."""
    spec.digests  # noqa: B018  (first: a missing model folder is named as the option that gave it)
    vocab = ModelTokenizer.from_model_dir(spec.model)
    context = model_context(spec.model)
    if from_run is not None:
        run = verify_source(from_run)
        total = 0
        for batch in batches_from_run(run, steps):
            check_items([it.with_ids(vocab) for it in batch], vocab, context)
            total += len(batch)
        return ScoreSource(batches_from_run(run, steps), total,
                           {"run": str(from_run), "head": run.head, "command": run.command})
    assert tokens is not None, "name the tokens file or the run"
    listed = [[it.with_ids(vocab) for it in batch] for batch in items_from_file(tokens, temperature, steps, batch_size)]
    for batch in listed:
        check_items(batch, vocab, context)
    return ScoreSource(iter(listed), sum(len(batch) for batch in listed), {"tokens": str(tokens)})


@dataclass(frozen=True)
class ScoreRun:
    """A finished score run: its meta, its chain head and the counts `score_batches` returns."""

    meta: dict[str, Any]
    head: str
    counts: dict[str, Any]


def score_run(spec: EngineSpec, source: ScoreSource, run_dir: Path, capture_steps: str, *,
              call_timeout: float | None = None, on_output: Callable[[ScoredOutput], None] = lambda out: None,
              phase: Callable[[str], object] = lambda text: None) -> ScoreRun:
    """`source`'s batches scored through `spec`'s worker into a new run store at `run_dir` (its meta names the
    package, the capture steps as written, `capture_steps`, and the source): what `invar score` runs."""
    meta: dict[str, Any] = {"command": "score", **spec.meta(), "capture_steps": capture_steps,
                            "source": source.source}
    with RunStore.create(run_dir, meta=meta) as store:
        counts = score_batches(spec, source.batches, store, call_timeout=call_timeout, on_output=on_output,
                               phase=phase)
        head = store.close_run()
    return ScoreRun(meta, head, counts)


__all__ = [
    "ScoreItem",
    "ScoreRun",
    "ScoreSource",
    "ScoredOutput",
    "SourceRun",
    "batches_from_run",
    "check_items",
    "items_from_file",
    "score_batches",
    "score_run",
    "score_source",
    "verify_source",
]
