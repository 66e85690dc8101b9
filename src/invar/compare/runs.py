"""Reading what a numerical comparison needs from run stores: sampled responses, teacher-forced scores, captures.

Decisions:
- **Verified, streamed.** Every run is read through `RunStore.stream`, which verifies each record as it reads it;
  a run that fails verification, or that never closed, is refused. The small parts of each record (token ids and
  per-token log-probabilities) are copied out and the record dropped; captures (float[k, V] per item) are read in a
  second pass that pairs the reference's and the candidate's records as they stream (`captures`), so no more than a
  record or two of captures is ever held.
- **Same requests, or no comparison.** Two runs compare only if they ran the same requests (prompt, seed,
  temperature, top-p, max tokens, by request id); a score run only if it scored exactly the reference's responses
  at the requests' temperature. Anything else is one line naming the first difference.
- **The core decodes and scores.** Response text comes from the core's own `ModelTokenizer`, read from the model
  folder the run names, and only if that folder still has the run's tree digest; arithmetic prompts are scored by the
  task's scorer. Runs whose folder is gone are still compared, without text or task scores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from invar import canonical
from invar.compare.numerical import Capture, Response, UnitPair, zip_captures
from invar.errors import ContractError, EvidenceError, InvarError, RecordError
from invar.protocol.payloads import GenerateOutput, PayloadError, ScoreItem, ScoreOutput
from invar.records import RunStore
from invar.records.store import CallRecord, is_run
from invar.tasks import ModelTokenizer
from invar.tasks.arithmetic import answer_of, score


def _copy(a: np.ndarray) -> np.ndarray:
    """An owned copy: a decoded array is a view of its record's bytes and would keep the whole record alive."""
    return np.array(a, copy=True)


@contextlib.contextmanager
def open_verified(path: Path, what: str) -> Iterator[RunStore]:
    """The run store at `path`, open while the block reads it; a record that fails verification is refused naming
    the run (`what` and its path), since a comparison reads several."""
    if not is_run(path):
        raise InvarError(f"{what} {path}: no run store here (expected records.sqlite); pass a run directory")
    try:
        with RunStore.open(path) as store:
            yield store
    except RecordError as exc:
        raise RecordError(f"{what} {path}: {exc}") from None


def _closed(store: RunStore, verification: Any, what: str) -> None:
    if verification is None or not verification.closed:
        raise EvidenceError(f"{what} {store.path}: the run is incomplete (no closing record); compare finished runs")


def _result(rec: CallRecord) -> dict[str, Any] | None:
    if rec.report is None or not rec.report.report.ok:
        return None
    return rec.report.report.result


@dataclass
class GenerateRun:
    """The sampled responses of an `infer` or `evaluate` run, by request id, in the run's order."""

    path: Path
    head: str
    meta: dict[str, Any]
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, Response] = field(default_factory=dict)
    vocabulary: ModelTokenizer | None = None

    def describe(self) -> dict[str, Any]:
        m = self.meta
        return {"run": str(self.path), "head": self.head, "command": m.get("command"), "engine": m.get("engine"),
                "model_digest": m.get("model_digest"), "dtype": m.get("dtype"), "quantization": m.get("quantization"),
                "adapter_digest": m.get("adapter_digest"), "patches": m.get("patches")}


def run_vocabulary(meta: Mapping[str, Any]) -> ModelTokenizer | None:
    """The core's tokenizer for a run's model, if the folder the run names still has the run's tree digest."""
    model, digest = meta.get("model"), meta.get("model_digest")
    if not isinstance(model, str) or not isinstance(digest, str) or not Path(model).is_dir():
        return None
    if canonical.tree_digest(model) != digest:
        return None
    try:
        return ModelTokenizer.from_model_dir(model)
    except ContractError:
        return None


def _check_output(out: Any, request: Mapping[str, Any], where: str) -> Response:
    rid = request["request_id"]
    if not isinstance(out, dict) or out.get("request_id") != rid:
        raise EvidenceError(f"{where}: an output answers {out.get('request_id') if isinstance(out, dict) else None!r}"
                            f", listed for request {rid!r}")
    try:
        got = GenerateOutput.from_wire(out, where)
    except PayloadError as exc:
        raise EvidenceError(str(exc)) from None
    return Response(_copy(got.tokens), _copy(got.logprobs), str(got.finish_reason))


_REQUEST_FIELDS = ("prompt", "prompt_ids", "seed", "temperature", "top_p", "max_tokens")


def _request_field(req: Mapping[str, Any], key: str) -> Any:
    """A request's field as compared across runs (prompt ids as a tuple, so a run's requests stay hashable)."""
    value = req.get(key)
    return tuple(value) if key == "prompt_ids" and isinstance(value, list) else value


def run_kind(command: object) -> str:
    """A run as messages name it: by the command its meta says made it, or as naming none (never "a None run")."""
    if isinstance(command, str) and command:
        return f"a {command!r} run"
    return "a run whose records name no invar command"


def _check_kind(meta: Mapping[str, Any], path: Path, what: str, kind: str) -> None:
    """A run of the kind a comparison reads (`generate`: infer or evaluate; `score`), or one line naming it."""
    command = meta.get("command")
    if kind == "generate" and command not in ("infer", "evaluate"):
        raise InvarError(f"{what} {path}: {run_kind(command)}; give a run made by invar infer or invar evaluate "
                         "(a use run compares with: invar compare numerical RUN --contract C)")
    if kind == "score" and command != "score":
        raise InvarError(f"{what} {path}: {run_kind(command)}; give a run made by invar score")


def check_run_kind(path: Path, what: str, kind: str) -> None:
    """Refuse a path that is not a run of `kind` before any long work starts (its metadata only; the records are
    verified when the run is read)."""
    with open_verified(path, what) as store:
        _check_kind(store.meta().get("run", {}), path, what, kind)


def read_generate_run(path: Path, what: str) -> GenerateRun:
    """Every generate call of a finished run, verified as it streams; `what` names the run in messages."""
    with open_verified(path, what) as store:
        meta = store.meta().get("run", {})
        _check_kind(meta, path, what, "generate")
        run = GenerateRun(path, "", dict(meta))
        stream = store.stream()
        for rec in stream:
            if rec.call.method != "generate":
                continue
            result = _result(rec)
            if result is None:
                raise EvidenceError(f"{what} {path}: {rec.name} has no successful report")
            requests = rec.call.params.get("requests")
            outputs = result.get("outputs")
            if not isinstance(requests, list) or not isinstance(outputs, list) or len(outputs) != len(requests):
                raise EvidenceError(f"{what} {path}: {rec.name}: the report's outputs do not answer its requests")
            for req, out in zip(requests, outputs, strict=True):
                rid = req.get("request_id") if isinstance(req, dict) else None
                if not isinstance(rid, str):
                    raise EvidenceError(f"{what} {path}: {rec.name}: a request without a request id")
                if rid in run.requests:
                    raise EvidenceError(f"{what} {path}: {rec.name}: request {rid!r} was already answered")
                run.requests[rid] = {k: _request_field(req, k) for k in _REQUEST_FIELDS}
                run.outputs[rid] = _check_output(out, req, f"{what} {path}: {rec.name}")
        _closed(store, stream.verification, what)
        assert stream.verification is not None
        run.head = stream.verification.head
    if not run.requests:
        raise EvidenceError(f"{what} {path}: the run holds no generate call")
    run.vocabulary = run_vocabulary(meta)
    return run


@dataclass(frozen=True)
class ScoredItem:
    """One teacher-forced item of a score run: what was scored and its per-token log-probabilities."""

    prompt: str
    prompt_ids: np.ndarray
    """int32[P], the prompt as the engine ran it."""
    tokens: np.ndarray
    """int32[T], the response scored."""
    temperature: float
    steps: tuple[int, ...]
    """Steps with a whole-vocabulary capture."""
    logprobs: np.ndarray
    """float32[T]."""
    vocab_size: int | None
    """V of the captures (None without captures)."""


@dataclass
class ScoreRun:
    """The items a `score` run scored, by item id, and a second pass over its captures."""

    path: Path
    head: str
    meta: dict[str, Any]
    items: dict[str, ScoredItem] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        m = self.meta
        return {"run": str(self.path), "head": self.head, "command": m.get("command"), "engine": m.get("engine"),
                "model_digest": m.get("model_digest"), "dtype": m.get("dtype"), "quantization": m.get("quantization"),
                "adapter_digest": m.get("adapter_digest"), "patches": m.get("patches"), "source": m.get("source"),
                "capture_steps": m.get("capture_steps")}

    def captures(self, units: frozenset[str] | None = None) -> Iterator[Capture]:
        """Stream the run again, yielding each item's captures (a view of its record, valid until the next item)
        for items with captures (and in `units`, when given); refuses a run that changed since it was read."""
        with open_verified(self.path, "scores") as store:
            stream = store.stream()
            for rec in stream:
                result = _result(rec) if rec.call.method == "score" else None
                if result is None:
                    continue
                for item, out in zip(rec.call.params["items"], result["outputs"], strict=True):
                    iid = item["item_id"]
                    steps = tuple(item.get("vocab_steps", []))
                    if steps and (units is None or iid in units):
                        yield Capture(iid, steps, out["vocab_logprobs"])
            if stream.verification is None or stream.verification.head != self.head:
                raise EvidenceError(f"scores {self.path}: the run changed while it was read; compare it again")


def check_score_output(item: Any, out: Any, where: str) -> ScoredItem:
    """One score item and its output, checked against each other (ids, dtypes, shapes, steps within the response);
    returns the item with owned copies of its per-token log-probabilities (not its captures). `EvidenceError`
    naming `where` and the item."""
    if not isinstance(item, dict) or not isinstance(out, dict) or out.get("item_id") != item.get("item_id"):
        raise EvidenceError(f"{where}: an output does not answer the item it is listed for")
    iid = item["item_id"]
    tokens, steps = item.get("response_tokens"), item.get("vocab_steps", [])
    if isinstance(tokens, np.ndarray) and isinstance(steps, list):
        beyond = [s for s in steps if isinstance(s, int) and not 0 <= s < tokens.size]
        if beyond:
            raise EvidenceError(f"{where} ({iid}): capture step {beyond[0]} is beyond the response's end "
                                f"({tokens.size} tokens)")
    try:
        sent, got = ScoreItem.from_wire(item, f"{where} ({iid})"), ScoreOutput.from_wire(out, where)
    except PayloadError as exc:
        raise EvidenceError(str(exc)) from None
    if got.logprobs.shape != sent.response_tokens.shape:
        raise EvidenceError(f"{where} ({iid}): logprobs are not a float32 vector as long as the response")
    if got.vocab_logprobs.shape[0] != len(sent.vocab_steps):
        raise EvidenceError(f"{where} ({iid}): vocab_logprobs are not float32[{len(sent.vocab_steps)}, V]")
    return ScoredItem(str(sent.prompt), np.asarray(sent.prompt_ids, dtype=np.int32),
                      _copy(sent.response_tokens).astype(np.int32), sent.temperature, tuple(sent.vocab_steps),
                      _copy(got.logprobs), int(got.vocab_logprobs.shape[1]) if sent.vocab_steps else None)


def read_score_run(path: Path, what: str) -> ScoreRun:
    """Every score call of a finished `invar score` run, verified as it streams; captures are not kept."""
    with open_verified(path, what) as store:
        meta = store.meta().get("run", {})
        _check_kind(meta, path, what, "score")
        run = ScoreRun(path, "", dict(meta))
        stream = store.stream()
        for rec in stream:
            if rec.call.method != "score":
                continue
            result = _result(rec)
            if result is None:
                raise EvidenceError(f"{what} {path}: {rec.name} has no successful report")
            items, outputs = rec.call.params.get("items"), result.get("outputs")
            if not isinstance(items, list) or not isinstance(outputs, list) or len(items) != len(outputs):
                raise EvidenceError(f"{what} {path}: {rec.name}: the report's outputs do not answer its items")
            for item, out in zip(items, outputs, strict=True):
                scored = check_score_output(item, out, f"{what} {path}: {rec.name}")
                iid = str(item["item_id"])
                if iid in run.items:
                    raise EvidenceError(f"{what} {path}: {rec.name}: item {iid!r} was already scored")
                run.items[iid] = scored
        _closed(store, stream.verification, what)
        assert stream.verification is not None
        run.head = stream.verification.head
    return run


def task_loss(prompt: str, tokens: np.ndarray, vocabulary: ModelTokenizer | None) -> tuple[str | None, int | None]:
    """The response's text by the core's vocabulary and its arithmetic task loss (None where either is unknown)."""
    if vocabulary is None:
        return None, None
    text = vocabulary.decode(tokens.tolist())
    try:
        answer_of(prompt)
    except ContractError:
        return text, None
    return text, score(prompt, text)


def expected_answer(prompt: str) -> str | None:
    """The arithmetic answer of `prompt`, as its task scores it; None for a prompt that is not arithmetic."""
    try:
        return str(answer_of(prompt))
    except ContractError:
        return None


def _scored_temperature(request: Mapping[str, Any]) -> float:
    """The temperature a response's log-probabilities are at: the request's, or 1 for greedy requests."""
    t = float(request["temperature"])
    return t if t > 0 else 1.0


def _check_scores(scores: ScoreRun, ref: GenerateRun, what: str) -> None:
    for iid, item in scores.items.items():
        req = ref.requests.get(iid)
        if req is None:
            raise InvarError(f"{what} {scores.path}: item {iid!r} is not a request of REF_RUN; score REF_RUN's "
                             "responses (invar score --from-run REF_RUN)")
        if item.prompt != req["prompt"] or not np.array_equal(item.prompt_ids, req["prompt_ids"]) or \
                not np.array_equal(item.tokens, ref.outputs[iid].tokens):
            raise InvarError(f"{what} {scores.path}: item {iid!r} scored another prompt or other tokens than "
                             "REF_RUN's response; score REF_RUN's responses (invar score --from-run REF_RUN)")
        if item.temperature != _scored_temperature(req):
            raise InvarError(f"{what} {scores.path}: item {iid!r} was scored at temperature {item.temperature:g}, "
                             f"REF_RUN sampled it at {_scored_temperature(req):g}; score at the same temperature")


def pair_runs(ref: GenerateRun, cand: GenerateRun, cand_scores: ScoreRun | None = None,
              ref_scores: ScoreRun | None = None) -> tuple[list[UnitPair], Iterator[tuple[Capture, Capture]] | None]:
    """The units of two runs made with the same requests, with the candidate's teacher-forced scores of the
    reference's responses and the captures both sides took along them. `InvarError`, one line, for runs that
    cannot be compared."""
    for rid, req in ref.requests.items():
        other = cand.requests.get(rid)
        if other is None:
            raise InvarError(f"REF_RUN and CAND_RUN ran different requests: {rid!r} is in REF_RUN only; compare "
                             "runs made with the same requests and seeds")
        for key in _REQUEST_FIELDS:
            if req[key] != other[key]:
                raise InvarError(f"REF_RUN and CAND_RUN ran different requests: request {rid!r} has {key} "
                                 f"{canonical.show(req[key])} in REF_RUN, {canonical.show(other[key])} in CAND_RUN; "
                                 "compare runs made with the same requests and seeds")
    extra = next((rid for rid in cand.requests if rid not in ref.requests), None)
    if extra is not None:
        raise InvarError(f"REF_RUN and CAND_RUN ran different requests: {extra!r} is in CAND_RUN only; compare "
                         "runs made with the same requests and seeds")
    if ref_scores is not None and cand_scores is None:
        raise InvarError("--ref-scores gives the reference's side of the captures; add --cand-scores, the "
                         "candidate's scoring of the same responses")
    for scores, what in ((cand_scores, "--cand-scores"), (ref_scores, "--ref-scores")):
        if scores is not None:
            _check_scores(scores, ref, what)
    pairs = []
    for rid, req in ref.requests.items():
        r, c = ref.outputs[rid], cand.outputs[rid]
        r_text, r_loss = task_loss(req["prompt"], r.tokens, ref.vocabulary)
        c_text, c_loss = task_loss(req["prompt"], c.tokens, cand.vocabulary)
        taught = cand_scores.items.get(rid) if cand_scores is not None else None
        own = ref_scores.items.get(rid) if ref_scores is not None else None
        pairs.append(UnitPair(rid, req["prompt"], r, c, r_loss, c_loss, r_text, c_text,
                              None if taught is None else taught.logprobs, None if own is None else own.logprobs,
                              expected_answer(req["prompt"])))
    captures = None
    if cand_scores is not None and ref_scores is not None:
        with_steps = frozenset(i for i, it in ref_scores.items.items() if it.steps) | frozenset(
            i for i, it in cand_scores.items.items() if it.steps)
        if with_steps:
            captures = zip_captures(ref_scores.captures(with_steps), cand_scores.captures(with_steps))
    return pairs, captures


__all__ = [
    "GenerateRun",
    "ScoreRun",
    "ScoredItem",
    "check_score_output",
    "expected_answer",
    "open_verified",
    "pair_runs",
    "read_generate_run",
    "read_score_run",
    "run_vocabulary",
    "task_loss",
]
